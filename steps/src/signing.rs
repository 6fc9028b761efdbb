//! Ed25519 signatures over storage manifests, so that a manifest read back
//! from storage can be shown to be the one ingest wrote.
//!
//! The private key lives in a PKCS#8 PEM file readable by its owner only.
//! A signature is a small detached text file:
//!
//! ```text
//! ed25519 <base64 of the 64-byte signature>
//! key SHA256:<base64, unpadded, of the SHA-256 of the 32-byte public key>
//! ```
//!
//! The fingerprint is written like OpenSSH's, but hashes the raw key, not
//! the SSH key blob: it is not the value `ssh-keygen -l` shows.
//!
//! ```
//! use ingest_steps::signing::{verify, SigningKeyFile};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let key = SigningKeyFile::generate(&dir.path().join("manifest.key")).unwrap();
//! let signature = key.sign(b"#%checkm_0.7\n#%eof\n");
//! verify(&key.public_key_pem(), b"#%checkm_0.7\n#%eof\n", &signature.to_text()).unwrap();
//! ```

use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use base64::Engine;
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{
    DecodePublicKey, EncodePrivateKey, PrivateKeyInfo, SecretDocument, ALGORITHM_OID,
};
use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};

/// The PEM label of an unencrypted PKCS#8 private key.
const PRIVATE_KEY_LABEL: &str = "PRIVATE KEY";

/// The DER prefix of an Ed25519 SubjectPublicKeyInfo (RFC 8410): the
/// 32-byte key follows it.
const ED25519_SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

/// Problems with the private key file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyFileError {
    /// [`SigningKeyFile::generate`] found a file at the path already.
    ///
    /// ### Handling
    /// Never overwrite a key silently: use the existing one with
    /// [`SigningKeyFile::load`], or remove it deliberately first.
    #[error("key file {} already exists; refusing to overwrite it", path.display())]
    AlreadyExists {
        /// The key file.
        path: PathBuf,
    },

    /// There is no file at the path.
    ///
    /// ### Handling
    /// A configuration error: generate a key (`SigningKeyFile::generate`)
    /// or fix the configured path. Do not retry.
    #[error("key file {} not found", path.display())]
    Missing {
        /// The key file.
        path: PathBuf,
    },

    /// The file is readable by its group or by others.
    ///
    /// ### Handling
    /// Refuse to start; the operator runs the `chmod 600` the message
    /// shows (and should consider the key exposed).
    #[error("key file {} has mode {mode:o}, readable by others; run `chmod 600 {}`", path.display(), path.display())]
    TooOpen {
        /// The key file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },

    /// The file is not PEM text.
    ///
    /// ### Handling
    /// A configuration error: point at a PKCS#8 PEM file
    /// (`-----BEGIN PRIVATE KEY-----`). Do not retry.
    #[error("key file {} is not PEM: {detail}", path.display())]
    NotPem {
        /// The key file.
        path: PathBuf,
        /// What the PEM decoder said.
        detail: String,
    },

    /// The file holds a key other than an unencrypted Ed25519 PKCS#8 key
    /// (an RSA or EC key, a public key, an encrypted key…).
    ///
    /// ### Handling
    /// A configuration error: generate an Ed25519 key. Do not retry.
    #[error("key file {} holds {found}, not an unencrypted Ed25519 private key (PKCS#8 \"PRIVATE KEY\")", path.display())]
    WrongKeyType {
        /// The key file.
        path: PathBuf,
        /// What it holds: a PEM label or an algorithm OID.
        found: String,
    },

    /// The file is an Ed25519 PKCS#8 PEM but its contents do not decode.
    ///
    /// ### Handling
    /// The file is damaged: restore it from backup. Do not retry.
    #[error("key file {} is malformed: {detail}", path.display())]
    Malformed {
        /// The key file.
        path: PathBuf,
        /// What the decoder said.
        detail: String,
    },

    /// The system's random number generator failed.
    ///
    /// ### Handling
    /// Rare and environmental: retry later; stop if it persists.
    #[error("no randomness for a new key: {detail}")]
    Random {
        /// What the random number generator said.
        detail: String,
    },

    /// Reading or writing the file failed.
    ///
    /// ### Handling
    /// An I/O failure: fix the cause (permissions, disk) and retry.
    #[error("key file {}: {source}", path.display())]
    Io {
        /// The key file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

/// Why a signature does not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SignatureError {
    /// The public key is not an Ed25519 SubjectPublicKeyInfo PEM.
    ///
    /// ### Handling
    /// A configuration error: fix the configured public key. Do not retry.
    #[error("public key is not an Ed25519 PEM public key: {detail}")]
    BadPublicKey {
        /// What the decoder said.
        detail: String,
    },

    /// The signature text is not `ed25519 <base64>\nkey <fingerprint>\n`.
    ///
    /// ### Handling
    /// The signature file is damaged or is not one of ours: treat the
    /// manifest as unverified. Do not retry.
    #[error("malformed signature: {detail}")]
    Malformed {
        /// What is wrong.
        detail: String,
    },

    /// The signature names another key than the one given.
    ///
    /// ### Handling
    /// Verify with the key it names if that key is trusted (after a key
    /// rotation), otherwise treat the manifest as unverified.
    #[error("signature was made with key {signed_with}, but the public key given is {expected}")]
    WrongKey {
        /// The fingerprint of the public key given.
        expected: String,
        /// The fingerprint the signature names.
        signed_with: String,
    },

    /// The signature does not match the manifest: one of them changed.
    ///
    /// ### Handling
    /// Treat the manifest as tampered with or corrupt: do not use it;
    /// report it. Do not retry.
    #[error("signature by key {fingerprint} does not match the manifest")]
    Invalid {
        /// The key's fingerprint.
        fingerprint: String,
    },
}

/// An Ed25519 private key loaded from (or just written to) its file.
pub struct SigningKeyFile {
    path: PathBuf,
    key: SigningKey,
}

impl fmt::Debug for SigningKeyFile {
    /// Shows the path and fingerprint, never the key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKeyFile")
            .field("path", &self.path)
            .field("fingerprint", &self.fingerprint())
            .finish()
    }
}

impl SigningKeyFile {
    /// Creates a new random key and writes it to `path` as PKCS#8 PEM with
    /// mode 0600.
    ///
    /// # Errors
    /// [`KeyFileError::AlreadyExists`] if `path` exists,
    /// [`KeyFileError::Random`] or [`KeyFileError::Io`].
    pub fn generate(path: &Path) -> Result<SigningKeyFile, KeyFileError> {
        let mut seed = [0u8; 32];
        getrandom::getrandom(&mut seed).map_err(|e| KeyFileError::Random {
            detail: e.to_string(),
        })?;
        let key = SigningKey::from_bytes(&seed);
        let pem = key
            .to_pkcs8_pem(LineEnding::LF)
            .map_err(|e| KeyFileError::Malformed {
                path: path.to_path_buf(),
                detail: e.to_string(),
            })?;
        write_new_private_file(path, pem.as_bytes())?;
        Ok(SigningKeyFile {
            path: path.to_path_buf(),
            key,
        })
    }

    /// Reads the key at `path`.
    ///
    /// # Errors
    /// [`KeyFileError::Missing`], [`KeyFileError::TooOpen`] (on Unix, when
    /// group or others have any permission), [`KeyFileError::NotPem`],
    /// [`KeyFileError::WrongKeyType`], [`KeyFileError::Malformed`] or
    /// [`KeyFileError::Io`].
    pub fn load(path: &Path) -> Result<SigningKeyFile, KeyFileError> {
        check_permissions(path)?;
        let text = fs::read_to_string(path).map_err(|e| io_error(path, e))?;
        let key = decode_private_key(path, &text)?;
        Ok(SigningKeyFile {
            path: path.to_path_buf(),
            key,
        })
    }

    /// The key file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Signs `manifest`.
    pub fn sign(&self, manifest: &[u8]) -> Signature {
        Signature {
            bytes: self.key.sign(manifest).to_bytes(),
            key_fingerprint: self.fingerprint(),
        }
    }

    /// The public key as SubjectPublicKeyInfo PEM (`BEGIN PUBLIC KEY`).
    pub fn public_key_pem(&self) -> String {
        let mut der = ED25519_SPKI_PREFIX.to_vec();
        der.extend_from_slice(self.key.verifying_key().as_bytes());
        // 44 bytes of DER are 60 base64 characters: one PEM line.
        format!(
            "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
            STANDARD.encode(der)
        )
    }

    /// The public key's fingerprint, `SHA256:` and unpadded base64.
    pub fn fingerprint(&self) -> String {
        fingerprint_of(&self.key.verifying_key())
    }

    /// The raw 32-byte public key (what signed tree heads carry).
    pub fn public_key_bytes(&self) -> [u8; 32] {
        self.key.verifying_key().to_bytes()
    }
}

/// Checks a raw 64-byte Ed25519 `signature` of `message` by the raw 32-byte
/// `public_key` (strict verification, as [`verify`]).
///
/// # Errors
/// [`SignatureError::BadPublicKey`], [`SignatureError::Malformed`] (not 64
/// bytes) or [`SignatureError::Invalid`].
pub fn verify_raw(
    public_key: &[u8; 32],
    message: &[u8],
    signature: &[u8],
) -> Result<(), SignatureError> {
    let key = VerifyingKey::from_bytes(public_key).map_err(|e| SignatureError::BadPublicKey {
        detail: e.to_string(),
    })?;
    let bytes = <[u8; 64]>::try_from(signature).map_err(|_| SignatureError::Malformed {
        detail: format!("signature is {} bytes, expected 64", signature.len()),
    })?;
    key.verify_strict(message, &ed25519_dalek::Signature::from_bytes(&bytes))
        .map_err(|_| SignatureError::Invalid {
            fingerprint: fingerprint_of(&key),
        })
}

/// The fingerprint (`SHA256:` and unpadded base64 of SHA-256 of the key) of
/// a raw 32-byte Ed25519 public key, as [`SigningKeyFile::fingerprint`].
pub fn fingerprint_raw(public_key: &[u8; 32]) -> String {
    format!(
        "SHA256:{}",
        STANDARD_NO_PAD.encode(Sha256::digest(public_key))
    )
}

/// The raw 32-byte key inside an Ed25519 SubjectPublicKeyInfo PEM (what
/// `ingest keys show` prints).
///
/// # Errors
/// [`SignatureError::BadPublicKey`].
pub fn public_key_from_pem(public_key_pem: &str) -> Result<[u8; 32], SignatureError> {
    VerifyingKey::from_public_key_pem(public_key_pem)
        .map(|k| k.to_bytes())
        .map_err(|e| SignatureError::BadPublicKey {
            detail: e.to_string(),
        })
}

/// A detached signature and the fingerprint of the key that made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    /// The 64 signature bytes.
    pub bytes: [u8; 64],
    /// The signing key's fingerprint.
    pub key_fingerprint: String,
}

impl Signature {
    /// The signature file's text: `ed25519 <base64>\nkey <fingerprint>\n`.
    pub fn to_text(&self) -> String {
        format!(
            "ed25519 {}\nkey {}\n",
            STANDARD.encode(self.bytes),
            self.key_fingerprint
        )
    }

    /// Parses a signature file's text (Unix or Windows line ends; the last
    /// line end is optional).
    ///
    /// # Errors
    /// [`SignatureError::Malformed`].
    pub fn parse(text: &str) -> Result<Signature, SignatureError> {
        let malformed = |detail: &str| SignatureError::Malformed {
            detail: detail.to_string(),
        };
        let lines: Vec<&str> = text.lines().collect();
        let [sig_line, key_line] = lines[..] else {
            return Err(malformed("expected two lines, `ed25519 …` and `key …`"));
        };
        let encoded = sig_line
            .strip_prefix("ed25519 ")
            .ok_or_else(|| malformed("the first line does not start with `ed25519 `"))?;
        let key_fingerprint = key_line
            .strip_prefix("key ")
            .filter(|fp| fp.starts_with("SHA256:"))
            .ok_or_else(|| malformed("the second line is not `key SHA256:…`"))?;
        let decoded = STANDARD
            .decode(encoded)
            .map_err(|e| malformed(&format!("signature is not base64: {e}")))?;
        let bytes = <[u8; 64]>::try_from(decoded.as_slice()).map_err(|_| {
            malformed(&format!(
                "signature is {} bytes, expected 64",
                decoded.len()
            ))
        })?;
        Ok(Signature {
            bytes,
            key_fingerprint: key_fingerprint.to_string(),
        })
    }
}

impl fmt::Display for Signature {
    /// The same text as [`Signature::to_text`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_text())
    }
}

/// Checks that `signature_text` is a signature of `manifest` by the key in
/// `public_key_pem`.
///
/// # Errors
/// [`SignatureError::BadPublicKey`], [`SignatureError::Malformed`],
/// [`SignatureError::WrongKey`] (naming both fingerprints) or
/// [`SignatureError::Invalid`].
pub fn verify(
    public_key_pem: &str,
    manifest: &[u8],
    signature_text: &str,
) -> Result<(), SignatureError> {
    let key = VerifyingKey::from_public_key_pem(public_key_pem).map_err(|e| {
        SignatureError::BadPublicKey {
            detail: e.to_string(),
        }
    })?;
    let signature = Signature::parse(signature_text)?;
    let fingerprint = fingerprint_of(&key);
    if signature.key_fingerprint != fingerprint {
        return Err(SignatureError::WrongKey {
            expected: fingerprint,
            signed_with: signature.key_fingerprint,
        });
    }
    let dalek_signature = ed25519_dalek::Signature::from_bytes(&signature.bytes);
    key.verify_strict(manifest, &dalek_signature)
        .map_err(|_| SignatureError::Invalid { fingerprint })
}

/// The fingerprint of the public key in `public_key_pem`.
///
/// # Errors
/// [`SignatureError::BadPublicKey`].
pub fn fingerprint(public_key_pem: &str) -> Result<String, SignatureError> {
    VerifyingKey::from_public_key_pem(public_key_pem)
        .map(|key| fingerprint_of(&key))
        .map_err(|e| SignatureError::BadPublicKey {
            detail: e.to_string(),
        })
}

fn fingerprint_of(key: &VerifyingKey) -> String {
    format!(
        "SHA256:{}",
        STANDARD_NO_PAD.encode(Sha256::digest(key.as_bytes()))
    )
}

fn io_error(path: &Path, source: io::Error) -> KeyFileError {
    if source.kind() == io::ErrorKind::NotFound {
        return KeyFileError::Missing {
            path: path.to_path_buf(),
        };
    }
    KeyFileError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn decode_private_key(path: &Path, text: &str) -> Result<SigningKey, KeyFileError> {
    let (label, document) = SecretDocument::from_pem(text).map_err(|e| KeyFileError::NotPem {
        path: path.to_path_buf(),
        detail: e.to_string(),
    })?;
    if label != PRIVATE_KEY_LABEL {
        return Err(KeyFileError::WrongKeyType {
            path: path.to_path_buf(),
            found: format!("a {label:?} PEM"),
        });
    }
    let malformed = |detail: String| KeyFileError::Malformed {
        path: path.to_path_buf(),
        detail,
    };
    let info =
        PrivateKeyInfo::try_from(document.as_bytes()).map_err(|e| malformed(e.to_string()))?;
    let oid = info.algorithm.oid;
    if oid != ALGORITHM_OID {
        return Err(KeyFileError::WrongKeyType {
            path: path.to_path_buf(),
            found: format!("{} (algorithm {oid})", describe_algorithm(&oid.to_string())),
        });
    }
    SigningKey::try_from(info).map_err(|e| malformed(e.to_string()))
}

/// A reader's name for the key algorithms people most often confuse with
/// Ed25519.
fn describe_algorithm(oid: &str) -> &'static str {
    match oid {
        "1.2.840.113549.1.1.1" => "an RSA key",
        "1.2.840.10045.2.1" => "an elliptic-curve (ECDSA) key",
        "1.3.101.110" => "an X25519 key",
        "1.3.101.111" => "an X448 key",
        "1.3.101.113" => "an Ed448 key",
        _ => "a key of another type",
    }
}

#[cfg(unix)]
fn check_permissions(path: &Path) -> Result<(), KeyFileError> {
    use std::os::unix::fs::PermissionsExt;
    let mode = fs::metadata(path)
        .map_err(|e| io_error(path, e))?
        .permissions()
        .mode()
        & 0o777;
    if mode & 0o077 != 0 {
        return Err(KeyFileError::TooOpen {
            path: path.to_path_buf(),
            mode,
        });
    }
    Ok(())
}

/// Windows has no mode bits; its ACLs are the operator's to set.
#[cfg(not(unix))]
fn check_permissions(_path: &Path) -> Result<(), KeyFileError> {
    Ok(())
}

/// Writes `bytes` to a new file only its owner can read, removing the
/// file again if the write fails half-way.
fn write_new_private_file(path: &Path, bytes: &[u8]) -> Result<(), KeyFileError> {
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path).map_err(|e| match e.kind() {
        io::ErrorKind::AlreadyExists => KeyFileError::AlreadyExists {
            path: path.to_path_buf(),
        },
        _ => KeyFileError::Io {
            path: path.to_path_buf(),
            source: e,
        },
    })?;
    let written = file.write_all(bytes).and_then(|()| file.sync_all());
    if let Err(e) = written {
        drop(file);
        // Best effort: a half-written key is worse than none.
        let _ = fs::remove_file(path);
        return Err(KeyFileError::Io {
            path: path.to_path_buf(),
            source: e,
        });
    }
    Ok(())
}
