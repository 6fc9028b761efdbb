//! The Merritt batch forms: how a submission becomes objects.
//!
//! A depositor submits either one payload (a file, a container) or a Checkm
//! manifest whose `#%profile` says how to read it:
//!
//! | form | profile | objects |
//! |---|---|---|
//! | [`Form::ObjectManifest`] | `mrt-ingest-manifest` | one, made of every listed file |
//! | [`Form::SingleFileBatch`] | `mrt-single-file-batch-manifest` | one per line: the line's file |
//! | [`Form::ContainerBatch`] | `mrt-container-batch-manifest` | one per line: a zip or tar container |
//! | [`Form::BatchManifest`] | `mrt-batch-manifest` | one per line: the line's URL is an object manifest |
//!
//! [`objects`] checks a parsed manifest against the form it was submitted as
//! and returns the objects it describes.
//!
//! ```
//! use ingest_steps::checkm::parse;
//! use ingest_steps::forms::{objects, Form, ObjectKind};
//!
//! let text = b"#%checkm_0.7\n\
//!     #%profile | http://uc3.cdlib.org/registry/ingest/manifest/mrt-container-batch-manifest\n\
//!     #%fields | nfo:fileUrl | nfo:fileName | mrt:localIdentifier\n\
//!     https://example.org/a.zip | | local-a\n\
//!     https://example.org/b.tar | b.tar | local-b\n\
//!     #%eof\n";
//! let objects = objects(&parse(text).unwrap(), Form::ContainerBatch).unwrap();
//! assert_eq!(objects.len(), 2);
//! assert_eq!(objects[0].kind, ObjectKind::Container);
//! assert_eq!(objects[0].files[0].name, "a.zip");
//! assert_eq!(objects[1].local_ids, vec!["local-b"]);
//! ```

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use url::Url;

use crate::checkm::{Manifest, ManifestError, Record};
use crate::digest::Algorithm;
use crate::paths;

/// A Merritt profile URL: profiles live under one base, and a profile is
/// recognised by the last path segment of its URL, whatever the host.
macro_rules! profile_url {
    ($name:literal) => {
        concat!("http://uc3.cdlib.org/registry/ingest/manifest/", $name)
    };
}

/// How a submission is to be read. The serialized names are those of the
/// payload types in submissions (`ingest_events::event::PayloadType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Form {
    /// `mrt-ingest-manifest`: one object made of all the listed files.
    #[serde(rename = "object-manifest")]
    ObjectManifest,
    /// `mrt-single-file-batch-manifest`: one object per line, the line's
    /// file.
    #[serde(rename = "single-file-batch-manifest")]
    SingleFileBatch,
    /// `mrt-container-batch-manifest`: one object per line, a zip or tar
    /// container.
    #[serde(rename = "container-batch-manifest")]
    ContainerBatch,
    /// `mrt-batch-manifest`: one object per line, each line's URL an object
    /// manifest.
    #[serde(rename = "batch-manifest")]
    BatchManifest,
    /// Not a manifest: the payload is one file, one object.
    #[serde(rename = "file")]
    SingleFile,
    /// Not a manifest: the payload is one container, one object.
    #[serde(rename = "container")]
    Container,
}

impl Form {
    /// Every form.
    pub const ALL: [Form; 6] = [
        Form::ObjectManifest,
        Form::SingleFileBatch,
        Form::ContainerBatch,
        Form::BatchManifest,
        Form::SingleFile,
        Form::Container,
    ];

    /// The name used in submissions and in JSON (`object-manifest`, `file`, …).
    pub fn name(self) -> &'static str {
        match self {
            Form::ObjectManifest => "object-manifest",
            Form::SingleFileBatch => "single-file-batch-manifest",
            Form::ContainerBatch => "container-batch-manifest",
            Form::BatchManifest => "batch-manifest",
            Form::SingleFile => "file",
            Form::Container => "container",
        }
    }

    /// The last path segment of the form's profile URL
    /// (`mrt-ingest-manifest`); `None` for the payloads that are not
    /// manifests.
    pub fn profile_name(self) -> Option<&'static str> {
        match self {
            Form::ObjectManifest => Some("mrt-ingest-manifest"),
            Form::SingleFileBatch => Some("mrt-single-file-batch-manifest"),
            Form::ContainerBatch => Some("mrt-container-batch-manifest"),
            Form::BatchManifest => Some("mrt-batch-manifest"),
            Form::SingleFile | Form::Container => None,
        }
    }

    /// The profile URL Merritt writes in `#%profile`
    /// (`http://uc3.cdlib.org/registry/ingest/manifest/mrt-ingest-manifest`);
    /// `None` for the payloads that are not manifests.
    pub fn profile_url(self) -> Option<&'static str> {
        match self {
            Form::ObjectManifest => Some(profile_url!("mrt-ingest-manifest")),
            Form::SingleFileBatch => Some(profile_url!("mrt-single-file-batch-manifest")),
            Form::ContainerBatch => Some(profile_url!("mrt-container-batch-manifest")),
            Form::BatchManifest => Some(profile_url!("mrt-batch-manifest")),
            Form::SingleFile | Form::Container => None,
        }
    }

    /// The form of a `#%profile` URL, recognised by its last path segment
    /// (case-insensitive, any host, a trailing `/`, query or fragment
    /// ignored); `None` when the segment is not one of Merritt's profiles.
    pub fn from_profile(url: &str) -> Option<Form> {
        let path = url.trim().split(['?', '#']).next().unwrap_or_default();
        let segment = path.trim_end_matches('/').rsplit('/').next()?;
        Form::ALL.into_iter().find(|form| {
            form.profile_name()
                .is_some_and(|p| p.eq_ignore_ascii_case(segment))
        })
    }

    /// Whether the form is a manifest (has a profile).
    pub fn is_manifest(self) -> bool {
        self.profile_name().is_some()
    }
}

/// What the files of an object are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ObjectKind {
    /// The files are the object's content.
    Files,
    /// The one file is a zip or tar container to unpack into the object.
    Container,
    /// The one file is an object manifest to fetch and read.
    ObjectManifest,
}

/// One object a manifest describes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectSpec {
    /// The manifest line of a batch's object; `None` for an object manifest,
    /// whose object is the whole manifest.
    pub line: Option<usize>,
    /// The files to fetch: every listed file for an object manifest, the
    /// line's one file otherwise.
    pub files: Vec<FileSpec>,
    /// `mrt:primaryIdentifier` (an ARK), if given.
    pub primary_id: Option<String>,
    /// `mrt:localIdentifier`, split and deduplicated.
    pub local_ids: Vec<String>,
    /// `mrt:creator` (ERC who).
    pub who: Option<String>,
    /// `mrt:title` (ERC what).
    pub what: Option<String>,
    /// `mrt:date` (ERC when).
    pub when: Option<String>,
    /// What the files are.
    pub kind: ObjectKind,
}

/// One file to fetch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileSpec {
    /// The URL to fetch (`http`, `https` or `file`), as the `url` crate
    /// serializes it.
    pub url: String,
    /// The target path in the object, normalized (see
    /// [`paths::normalized_name`]): `nfo:fileName`, else the URL's last
    /// path segment, percent-decoded.
    pub name: String,
    /// `nfo:fileSize`, if given.
    pub size: Option<u64>,
    /// The depositor's digest, if given.
    pub digest: Option<FileDigest>,
    /// `mrt:mimeType`, if given.
    pub mime_type: Option<String>,
}

/// A digest the depositor gave for a file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileDigest {
    /// `md5`, `sha1`, `sha256` or `sha512`.
    pub algorithm: String,
    /// The value in lower-case hexadecimal, of the algorithm's length.
    pub value: String,
}

/// The objects a manifest describes, read as the form it was submitted as.
///
/// For an object manifest, the one object has no identifiers or ERC fields:
/// Merritt takes those from the submission, and values on the manifest's
/// lines are ignored. For the batch forms, each line's `mrt:` fields are its
/// object's.
///
/// # Errors
/// A [`ManifestError`] naming the line (or line 1 when the whole manifest
/// is at fault) when:
/// - `expected` is not a manifest form, or the manifest's profile is
///   missing, unknown, or not `expected`'s (the message names both);
/// - the manifest has no entries ("the manifest lists no objects");
/// - a line has no file URL, or a URL that is not `http(s)://` or `file://`;
/// - a digest algorithm is unknown, a hash value does not match its
///   algorithm's length or is not hexadecimal, or one is given without the
///   other;
/// - a file size is not a number;
/// - a file name is refused by [`paths::safe_relative_path`] or cannot be
///   derived from the URL;
/// - an object manifest lists the same target name twice, or uses a name as
///   both a file and a directory.
pub fn objects(manifest: &Manifest, expected: Form) -> Result<Vec<ObjectSpec>, ManifestError> {
    check_profile(manifest, expected)?;
    if manifest.entries.is_empty() {
        return Err(ManifestError::new(
            manifest.eof_line,
            "the manifest lists no objects",
        ));
    }
    let kind = match expected {
        Form::ObjectManifest => return Ok(vec![object_of_all_files(manifest)?]),
        Form::SingleFileBatch => ObjectKind::Files,
        Form::ContainerBatch => ObjectKind::Container,
        Form::BatchManifest => ObjectKind::ObjectManifest,
        Form::SingleFile | Form::Container => return Err(not_a_manifest(expected)),
    };
    manifest
        .records()
        .map(|record| object_of_line(&record, kind))
        .collect()
}

fn not_a_manifest(form: Form) -> ManifestError {
    ManifestError::new(
        1,
        format!(
            "a {} payload is not a manifest; there is nothing to expand",
            form.name()
        ),
    )
}

fn check_profile(manifest: &Manifest, expected: Form) -> Result<(), ManifestError> {
    let Some(expected_url) = expected.profile_url() else {
        return Err(not_a_manifest(expected));
    };
    let (Some(url), Some(line)) = (&manifest.profile, manifest.profile_line) else {
        return Err(ManifestError::new(
            1,
            format!("the manifest has no #%profile; expected {expected_url}"),
        ));
    };
    match Form::from_profile(url) {
        Some(found) if found == expected => Ok(()),
        Some(found) => Err(ManifestError::new(
            line,
            format!(
                "the manifest's profile is {} ({url}), but it was submitted as {} ({expected_url})",
                found.name(),
                expected.name()
            ),
        )),
        None => Err(ManifestError::new(
            line,
            format!("unknown profile {url:?}; expected {expected_url}"),
        )),
    }
}

fn object_of_all_files(manifest: &Manifest) -> Result<ObjectSpec, ManifestError> {
    let files = manifest
        .records()
        .map(|record| file_spec(&record))
        .collect::<Result<Vec<_>, _>>()?;
    let named: Vec<(usize, &str)> = manifest
        .entries
        .iter()
        .zip(&files)
        .map(|(entry, file)| (entry.line, file.name.as_str()))
        .collect();
    check_unique_names(&named)?;
    Ok(ObjectSpec {
        line: None,
        files,
        primary_id: None,
        local_ids: Vec::new(),
        who: None,
        what: None,
        when: None,
        kind: ObjectKind::Files,
    })
}

fn object_of_line(record: &Record<'_>, kind: ObjectKind) -> Result<ObjectSpec, ManifestError> {
    Ok(ObjectSpec {
        line: Some(record.line()),
        files: vec![file_spec(record)?],
        primary_id: record.primary_identifier().map(str::to_owned),
        local_ids: record.local_identifiers(),
        who: record.creator().map(str::to_owned),
        what: record.title().map(str::to_owned),
        when: record.date().map(str::to_owned),
        kind,
    })
}

fn file_spec(record: &Record<'_>) -> Result<FileSpec, ManifestError> {
    let line = record.line();
    let Some(text) = record.file_url() else {
        return Err(ManifestError::new(line, "no file URL (nfo:fileUrl)"));
    };
    let url = parse_url(line, text)?;
    let name = match record.file_name() {
        Some(name) => name.to_owned(),
        None => name_from_url(line, &url)?,
    };
    let name = paths::normalized_name(&name)
        .map_err(|e| ManifestError::new(line, format!("file name refused: {e}")))?;
    Ok(FileSpec {
        url: url.into(),
        name,
        size: record.file_size()?,
        digest: file_digest(record)?,
        mime_type: record.mime_type().map(str::to_owned),
    })
}

fn parse_url(line: usize, text: &str) -> Result<Url, ManifestError> {
    let url = Url::parse(text)
        .map_err(|e| ManifestError::new(line, format!("invalid file URL {text:?}: {e}")))?;
    match url.scheme() {
        "http" | "https" | "file" => Ok(url),
        other => Err(ManifestError::new(
            line,
            format!("file URL {text:?} has the scheme {other:?}; only http, https and file are accepted"),
        )),
    }
}

/// The URL's last path segment, percent-decoded.
fn name_from_url(line: usize, url: &Url) -> Result<String, ManifestError> {
    let missing = || {
        ManifestError::new(
            line,
            format!("cannot take a file name from the URL {url}; give nfo:fileName"),
        )
    };
    let segment = url
        .path_segments()
        .and_then(|mut segments| segments.next_back())
        .filter(|segment| !segment.is_empty())
        .ok_or_else(missing)?;
    crate::paths::percent_decode(segment).ok_or_else(|| {
        ManifestError::new(
            line,
            format!("the last segment of the URL {url} is not UTF-8 once percent-decoded; give nfo:fileName"),
        )
    })
}

fn file_digest(record: &Record<'_>) -> Result<Option<FileDigest>, ManifestError> {
    let line = record.line();
    let (algorithm, value) = match (record.hash_algorithm(), record.hash_value()) {
        (None, None) => return Ok(None),
        (Some(algorithm), Some(value)) => (algorithm, value),
        (Some(algorithm), None) => {
            return Err(ManifestError::new(
                line,
                format!("hash algorithm {algorithm:?} without a hash value"),
            ))
        }
        (None, Some(_)) => {
            return Err(ManifestError::new(
                line,
                "hash value without a hash algorithm",
            ))
        }
    };
    let algorithm: Algorithm = algorithm
        .parse()
        .map_err(|e| ManifestError::new(line, format!("{e}")))?;
    let value = value.to_ascii_lowercase();
    if !algorithm.is_digest(&value) {
        return Err(ManifestError::new(
            line,
            format!(
                "the {algorithm} hash value {value:?} is not {} hexadecimal digits",
                algorithm.hex_len()
            ),
        ));
    }
    Ok(Some(FileDigest {
        algorithm: algorithm.name().to_owned(),
        value,
    }))
}

/// In one object, a target name is used once, and a name used for a file
/// is not also a directory of another file (`a` and `a/b`).
fn check_unique_names(named: &[(usize, &str)]) -> Result<(), ManifestError> {
    let mut files: HashMap<&str, usize> = HashMap::new();
    let mut directories: HashMap<&str, usize> = HashMap::new();
    for &(line, name) in named {
        if let Some(first) = files.get(name) {
            return Err(ManifestError::new(
                line,
                format!("the file name {name:?} is already used on line {first}"),
            ));
        }
        if let Some(first) = directories.get(name) {
            return Err(ManifestError::new(
                line,
                format!("the file name {name:?} is a directory of the file on line {first}"),
            ));
        }
        for (end, _) in name.match_indices('/') {
            let directory = &name[..end];
            if let Some(first) = files.get(directory) {
                return Err(ManifestError::new(
                    line,
                    format!("the file name {name:?} needs {directory:?} to be a directory, but line {first} lists it as a file"),
                ));
            }
            directories.entry(directory).or_insert(line);
        }
        files.insert(name, line);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_round_trip() {
        for form in Form::ALL {
            match form.profile_url() {
                Some(url) => {
                    assert!(url.starts_with("http://uc3.cdlib.org/registry/ingest/manifest/mrt-"));
                    assert_eq!(Form::from_profile(url), Some(form));
                }
                None => assert!(!form.is_manifest()),
            }
        }
    }

    #[test]
    fn profile_recognised_by_last_segment() {
        assert_eq!(
            Form::from_profile("https://other.example/x/MRT-Batch-Manifest/"),
            Some(Form::BatchManifest)
        );
        assert_eq!(
            Form::from_profile("mrt-ingest-manifest"),
            Some(Form::ObjectManifest)
        );
        assert_eq!(Form::from_profile("http://x/mrt-ingest-manifest-v2"), None);
        assert_eq!(Form::from_profile(""), None);
    }

    #[test]
    fn unique_names() {
        assert!(check_unique_names(&[(1, "a/b"), (2, "a/c"), (3, "b")]).is_ok());
        assert_eq!(
            check_unique_names(&[(1, "a"), (2, "a/b")])
                .unwrap_err()
                .line,
            2
        );
        assert_eq!(
            check_unique_names(&[(1, "a/b"), (4, "a")])
                .unwrap_err()
                .to_string(),
            "line 4: the file name \"a\" is a directory of the file on line 1"
        );
    }
}
