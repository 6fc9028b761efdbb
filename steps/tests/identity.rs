//! Tests of what gives an object its identity and integrity: digests, NOID
//! arks, ERC and Dublin Core records, the storage manifest and its
//! signature.

use std::collections::HashSet;
use std::io::{self, Write};

use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use base64::Engine;
use chrono::{TimeZone, Utc};
use sha2::{Digest, Sha256};

use ingest_steps::digest::{digest_file, Algorithm, Expected, HashingWriter, MultiHasher};
use ingest_steps::erc::{write_dublin_core, write_erc, ErcFields};
use ingest_steps::noid::{self, check_char, is_ark, parse_ark, verify, Ark, Minter, NoidError};
use ingest_steps::signing::{self, KeyFileError, Signature, SignatureError, SigningKeyFile};
use ingest_steps::storage_manifest::{self, render, ManifestError, ManifestFile};

// ---------------------------------------------------------------- digests

const EMPTY: [(Algorithm, &str); 4] = [
    (Algorithm::Md5, "d41d8cd98f00b204e9800998ecf8427e"),
    (Algorithm::Sha1, "da39a3ee5e6b4b0d3255bfef95601890afd80709"),
    (
        Algorithm::Sha256,
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    ),
    (
        Algorithm::Sha512,
        "cf83e1357eefb8bdf1542850d66d8007d620e4050b5715dc83f4a921d36ce9ce\
         47d0d13c5d85f2b0ff8318d2877eec2f63b931bd47417a81a538327af927da3e",
    ),
];

const ABC: [(Algorithm, &str); 4] = [
    (Algorithm::Md5, "900150983cd24fb0d6963f7d28e17f72"),
    (Algorithm::Sha1, "a9993e364706816aba3e25717850c26c9cd0d89d"),
    (
        Algorithm::Sha256,
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
    ),
    (
        Algorithm::Sha512,
        "ddaf35a193617abacc417349ae20413112e6fa4e89a97ea20a9eeee64b55d39a\
         2192992a274fc1a836ba3c23a3feebbd454d4423643ce80e2a9ac94fa54ca49f",
    ),
];

fn owned(vectors: &[(Algorithm, &str)]) -> Vec<(Algorithm, String)> {
    vectors.iter().map(|(a, v)| (*a, v.to_string())).collect()
}

#[test]
fn multi_hasher_matches_known_vectors() {
    let empty = MultiHasher::new(&Algorithm::ALL).finish();
    assert_eq!(empty, owned(&EMPTY));

    let mut abc = MultiHasher::new(&Algorithm::ALL);
    abc.update(b"a");
    abc.update(b"bc");
    assert_eq!(abc.finish(), owned(&ABC));
}

#[test]
fn multi_hasher_computes_a_repeated_algorithm_once_in_first_order() {
    let mut hasher = MultiHasher::new(&[Algorithm::Sha1, Algorithm::Md5, Algorithm::Sha1]);
    hasher.update(b"abc");
    assert_eq!(
        hasher.finish(),
        vec![
            (Algorithm::Sha1, ABC[1].1.to_string()),
            (Algorithm::Md5, ABC[0].1.to_string()),
        ]
    );
}

#[test]
fn algorithm_names_parse_in_any_case_and_with_a_dash() {
    let cases = [
        ("md5", Algorithm::Md5),
        ("MD5", Algorithm::Md5),
        ("sha1", Algorithm::Sha1),
        ("SHA-1", Algorithm::Sha1),
        ("sha256", Algorithm::Sha256),
        ("Sha-256", Algorithm::Sha256),
        ("sha512", Algorithm::Sha512),
        ("SHA-512", Algorithm::Sha512),
    ];
    for (input, expected) in cases {
        assert_eq!(input.parse::<Algorithm>().unwrap(), expected, "{input}");
    }
    let names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.name()).collect();
    assert_eq!(names, ["md5", "sha1", "sha256", "sha512"]);
    assert_eq!(Algorithm::Sha256.to_string(), "sha256");
}

#[test]
fn unknown_algorithm_error_names_the_input_and_the_accepted_names() {
    let err = "sha3-256".parse::<Algorithm>().unwrap_err();
    assert_eq!(
        err.to_string(),
        "unknown digest algorithm \"sha3-256\": expected one of \
         md5, sha1, sha-1, sha256, sha-256, sha512, sha-512"
    );
    assert!("".parse::<Algorithm>().is_err());
    assert!("sha 256".parse::<Algorithm>().is_err());
}

#[test]
fn hex_len_is_the_length_of_each_digest() {
    for (algorithm, value) in ABC {
        assert_eq!(algorithm.hex_len(), value.len(), "{algorithm}");
    }
}

/// A writer that takes at most three bytes per call, as a socket or a
/// pipe may.
struct Trickle(Vec<u8>);

impl Write for Trickle {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = buf.len().min(3);
        self.0.extend_from_slice(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn hashing_writer_hashes_and_counts_only_what_the_inner_writer_took() {
    let data = b"abcdefghijklmnopqrstuvwxyz0123456789".repeat(100);
    let mut writer = HashingWriter::new(Trickle(Vec::new()), &[Algorithm::Sha256]);
    writer.write_all(&data).unwrap();
    writer.flush().unwrap();
    assert_eq!(writer.bytes_written(), 3600);
    let (inner, size, digests) = writer.finish();
    assert_eq!(inner.0, data);
    assert_eq!(size, 3600);
    let mut expected = MultiHasher::new(&[Algorithm::Sha256]);
    expected.update(&data);
    assert_eq!(digests, expected.finish());
}

#[test]
fn hashing_writer_of_abc_gives_the_known_vectors() {
    let mut writer = HashingWriter::new(Vec::new(), &Algorithm::ALL);
    writer.write_all(b"abc").unwrap();
    let (inner, size, digests) = writer.finish();
    assert_eq!((inner.as_slice(), size), (&b"abc"[..], 3));
    assert_eq!(digests, owned(&ABC));
}

#[test]
fn expected_digest_compares_ignoring_case() {
    let expected = Expected {
        algorithm: Algorithm::Sha256,
        value: ABC[2].1.to_uppercase(),
    };
    assert_eq!(expected.check(ABC[2].1), Ok(()));
}

#[test]
fn digest_mismatch_names_the_algorithm_and_both_values() {
    let expected = Expected {
        algorithm: Algorithm::Sha256,
        value: "00ff".to_string(),
    };
    let err = expected.check("abcd").unwrap_err();
    assert_eq!(err.to_string(), "sha256 mismatch: expected 00ff, got abcd");
    assert_eq!(err.algorithm, Algorithm::Sha256);
}

#[test]
fn digest_file_reads_size_and_digests() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("abc.txt");
    std::fs::write(&path, b"abc").unwrap();
    let (size, digests) = digest_file(&path, &[Algorithm::Md5, Algorithm::Sha512]).unwrap();
    assert_eq!(size, 3);
    assert_eq!(
        digests,
        vec![owned(&ABC)[0].clone(), owned(&ABC)[3].clone()]
    );

    let big = dir.path().join("big.bin");
    let data = vec![7u8; 200_000];
    std::fs::write(&big, &data).unwrap();
    let (size, digests) = digest_file(&big, &[Algorithm::Sha1]).unwrap();
    let mut expected = MultiHasher::new(&[Algorithm::Sha1]);
    expected.update(&data);
    assert_eq!((size, digests), (200_000, expected.finish()));
}

#[test]
fn digest_file_of_a_missing_file_is_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let err = digest_file(&dir.path().join("nope"), &[Algorithm::Md5]).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::NotFound);
}

// ---------------------------------------------------------------- NOID

#[test]
fn ncda_matches_the_published_example() {
    // From the Noid documentation: 13030/xf93gt2 has check character q.
    assert_eq!(check_char("13030/xf93gt2"), 'q');
    assert!(verify("13030/xf93gt2q"));
    assert!(verify("ark:/13030/xf93gt2q"));
    assert!(verify("ark:13030/xf93gt2q"));
    assert!(verify("ARK:/13030/xf93gt2q"));
}

#[test]
fn ncda_rejects_every_single_character_error_and_adjacent_transposition() {
    let good = "13030/xf93gt2q";
    let chars: Vec<char> = good.chars().collect();
    for i in 0..chars.len() {
        for c in noid::ALPHABET.chars().filter(|&c| c != chars[i]) {
            let mut bad = chars.clone();
            bad[i] = c;
            let bad: String = bad.into_iter().collect();
            if chars[i] != '/' {
                assert!(!verify(&bad), "{bad} should not verify");
            }
        }
    }
    for i in 0..chars.len() - 1 {
        // '0' and '/' both count 0, so swapping them cannot be detected.
        if chars[i] == chars[i + 1] || matches!((chars[i], chars[i + 1]), ('0', '/') | ('/', '0')) {
            continue;
        }
        let mut swapped = chars.clone();
        swapped.swap(i, i + 1);
        let swapped: String = swapped.into_iter().collect();
        assert!(!verify(&swapped), "{swapped} should not verify");
    }
}

#[test]
fn verify_refuses_empty_and_one_character_input() {
    assert!(!verify(""));
    assert!(!verify("ark:/"));
    assert!(!verify("0"));
}

fn temp_tree() -> (tempfile::TempDir, sled::Db, sled::Tree) {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = sled::open(dir.path().join("db")).expect("open sled");
    let tree = db.open_tree("ids").expect("open tree");
    (dir, db, tree)
}

#[test]
fn minter_refuses_bad_naan_shoulder_and_blade_length() {
    let (_dir, _db, tree) = temp_tree();
    let open =
        |naan: &str, shoulder: &str, len: usize| Minter::open(tree.clone(), naan, shoulder, len);

    for naan in ["1234", "1234a", "", "99 999"] {
        assert!(
            matches!(open(naan, "fk4", 7), Err(NoidError::InvalidNaan { .. })),
            "{naan:?}"
        );
    }
    for shoulder in ["", "4fk", "fkl4", "FK4", "fk-4", "bcdfghjkmnp"] {
        assert!(
            matches!(
                open("99999", shoulder, 7),
                Err(NoidError::InvalidShoulder { .. })
            ),
            "{shoulder:?}"
        );
    }
    for len in [0, 14] {
        assert!(matches!(
            open("99999", "fk4", len),
            Err(NoidError::InvalidBladeLength { .. })
        ));
    }
    assert_eq!(
        open("1234", "fk4", 7).unwrap_err().to_string(),
        "invalid NAAN \"1234\": expected 5 or more digits"
    );
    assert!(open("999999", "bcdfghjkm4", 13).is_ok());
}

#[test]
fn minted_arks_have_the_template_shape_and_a_fixed_sequence() {
    let (_dir, _db, tree) = temp_tree();
    let minter = Minter::open(tree, "99999", "fk4", 7).unwrap();
    assert_eq!(minter.capacity(), 29u64.pow(7));
    let first: Vec<String> = (0..3).map(|_| minter.mint().unwrap()).collect();
    // The scramble is part of the stored format: if this changes, a
    // restarted minter could hand out an ark it handed out before.
    assert_eq!(first, FIRST_ARKS);
    for ark in &first {
        assert!(ark.starts_with("ark:/99999/fk4"), "{ark}");
        assert_eq!(ark.len(), "ark:/99999/fk4".len() + 7 + 1, "{ark}");
        assert!(verify(ark), "{ark}");
        let parsed = parse_ark(ark).unwrap();
        assert_eq!(parsed.naan, "99999");
        assert!(parsed.name.starts_with("fk4"));
    }
}

const FIRST_ARKS: [&str; 3] = [
    "ark:/99999/fk4wp17zz0t",
    "ark:/99999/fk4n53kvd52",
    "ark:/99999/fk4k0wxqvb1",
];

#[test]
fn ten_thousand_mints_are_unique_and_verify() {
    let (_dir, _db, tree) = temp_tree();
    let minter = Minter::open(tree, "99999", "fk4", 7).unwrap();
    let mut seen = HashSet::new();
    for _ in 0..10_000 {
        let ark = minter.mint().unwrap();
        assert!(verify(&ark), "{ark}");
        assert!(seen.insert(ark.clone()), "{ark} minted twice");
    }
}

#[test]
fn a_reopened_minter_continues_without_repeating() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut seen = HashSet::new();
    for _ in 0..2 {
        let db = open_when_released(&path);
        let minter = Minter::open(db.open_tree("ids").unwrap(), "99999", "fk4", 5).unwrap();
        for _ in 0..500 {
            let ark = minter.mint().unwrap();
            assert!(seen.insert(ark.clone()), "{ark} minted twice");
        }
        drop(minter);
        drop(db);
    }
    assert_eq!(seen.len(), 1000);
}

#[test]
fn minters_sharing_a_tree_across_threads_never_collide() {
    let (_dir, _db, tree) = temp_tree();
    let minter = Minter::open(tree, "99999", "fk4", 6).unwrap();
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let minter = minter.clone();
            std::thread::spawn(move || (0..250).map(|_| minter.mint().unwrap()).collect::<Vec<_>>())
        })
        .collect();
    let all: Vec<String> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let unique: HashSet<&String> = all.iter().collect();
    assert_eq!((all.len(), unique.len()), (1000, 1000));
}

#[test]
fn a_one_character_blade_is_exhausted_after_29_arks() {
    let (_dir, _db, tree) = temp_tree();
    let minter = Minter::open(tree, "99999", "x5", 1).unwrap();
    let arks: HashSet<String> = (0..29).map(|_| minter.mint().unwrap()).collect();
    assert_eq!(arks.len(), 29);
    for _ in 0..2 {
        let err = minter.mint().unwrap_err();
        assert!(
            matches!(err, NoidError::Exhausted { capacity: 29, .. }),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            "ark space of 99999/x5 with 1-character blades is exhausted (29 arks minted)"
        );
    }
}

#[test]
fn shoulders_have_separate_counters() {
    let (_dir, _db, tree) = temp_tree();
    let a = Minter::open(tree.clone(), "99999", "x5", 1).unwrap();
    let b = Minter::open(tree, "99999", "z5", 1).unwrap();
    for _ in 0..29 {
        a.mint().unwrap();
    }
    assert!(b.mint().unwrap().starts_with("ark:/99999/z5"));
}

#[test]
fn parse_ark_accepts_both_label_forms() {
    let expected = Ark {
        naan: "13030".to_string(),
        name: "m5abc12q".to_string(),
    };
    assert_eq!(parse_ark("ark:/13030/m5abc12q").unwrap(), expected);
    assert_eq!(parse_ark("ark:13030/m5abc12q").unwrap(), expected);
    assert_eq!(parse_ark("ARK:/13030/m5abc12q").unwrap(), expected);
    assert_eq!(expected.to_string(), "ark:/13030/m5abc12q");
    let qualified = parse_ark("ark:/13030/m5abc12q/c1.pdf").unwrap();
    assert_eq!(qualified.name, "m5abc12q/c1.pdf");
}

#[test]
fn parse_ark_errors_say_what_is_wrong() {
    let cases = [
        ("doi:10.5072/x", "not an ark: \"doi:10.5072/x\" does not start with \"ark:\""),
        ("", "not an ark: \"\" does not start with \"ark:\""),
        ("ark:/13030", "malformed ark \"ark:/13030\": expected ark:/NAAN/NAME"),
        ("ark:/13030/", "malformed ark \"ark:/13030/\": the name after the NAAN is empty"),
        ("ark://m5abc", "malformed ark \"ark://m5abc\": the NAAN must be ASCII letters and digits"),
        ("ark:/13030/m5 abc", "malformed ark \"ark:/13030/m5 abc\": the name contains whitespace or a control character"),
    ];
    for (input, message) in cases {
        assert_eq!(
            parse_ark(input).unwrap_err().to_string(),
            message,
            "{input:?}"
        );
        assert!(!is_ark(input));
    }
    assert!(is_ark("ark:/99999/fk4x"));
    // Multi-byte text must not make the label check panic.
    assert!(!is_ark("ar\u{e9}:/1/2"));
}

// ---------------------------------------------------------------- ERC and DC

#[test]
fn erc_folds_multi_line_values_and_marks_missing_ones() {
    let fields = ErcFields {
        who: None,
        what: Some("Line one\nline two\r\n\n  line three  ".to_string()),
        when: Some("   ".to_string()),
        wheres: vec![
            "ark:/99999/fk4x".to_string(),
            "".to_string(),
            "local\t1".to_string(),
        ],
    };
    assert_eq!(
        write_erc(&fields),
        "erc:\n\
         who: (:unas)\n\
         what: Line one\n line two\n line three\n\
         when: (:unas)\n\
         where: ark:/99999/fk4x\n\
         where: local 1\n"
    );
}

#[test]
fn erc_without_wheres_has_an_unassigned_where() {
    let fields = ErcFields {
        who: Some("Doe, Jane".to_string()),
        what: Some("Notes".to_string()),
        when: Some("2024".to_string()),
        wheres: vec![],
    };
    assert_eq!(
        write_erc(&fields),
        "erc:\nwho: Doe, Jane\nwhat: Notes\nwhen: 2024\nwhere: (:unas)\n"
    );
}

#[test]
fn dublin_core_escapes_markup_and_drops_illegal_characters() {
    let fields = ErcFields {
        who: Some("O'Brien & Sons".to_string()),
        what: Some("<b>&\"x\"\u{7}</b>".to_string()),
        when: None,
        wheres: vec!["ark:/99999/fk4x".to_string(), "id\u{0}<1>".to_string()],
    };
    assert_eq!(
        write_dublin_core(&fields),
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
         <dc xmlns:dc=\"http://purl.org/dc/elements/1.1/\">\n\
         \x20 <dc:creator>O&apos;Brien &amp; Sons</dc:creator>\n\
         \x20 <dc:title>&lt;b&gt;&amp;&quot;x&quot;&lt;/b&gt;</dc:title>\n\
         \x20 <dc:identifier>ark:/99999/fk4x</dc:identifier>\n\
         \x20 <dc:identifier>id&lt;1&gt;</dc:identifier>\n\
         </dc>\n"
    );
}

#[test]
fn dublin_core_keeps_non_ascii_text_and_leaves_out_blank_values() {
    let fields = ErcFields {
        who: Some("  ".to_string()),
        what: Some("Caf\u{e9} \u{1F600}\u{FFFE}".to_string()),
        when: Some("\u{1}".to_string()),
        wheres: vec![],
    };
    assert_eq!(
        write_dublin_core(&fields),
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
         <dc xmlns:dc=\"http://purl.org/dc/elements/1.1/\">\n\
         \x20 <dc:title>Caf\u{e9} \u{1F600}</dc:title>\n\
         </dc>\n"
    );
}

// ---------------------------------------------------------------- storage manifest

fn manifest_files() -> Vec<ManifestFile> {
    vec![
        ManifestFile {
            url: "http://ingest.example/q/1/producer/z.csv".to_string(),
            algorithm: Algorithm::Sha256,
            digest: ABC[2].1.to_uppercase(),
            size: 3,
            last_modified: Some(Utc.with_ymd_and_hms(2024, 5, 1, 12, 30, 0).unwrap()),
            name: "producer/z.csv".to_string(),
            mime_type: Some("text/csv".to_string()),
        },
        ManifestFile {
            url: "http://ingest.example/q/1/producer/a.txt".to_string(),
            algorithm: Algorithm::Md5,
            digest: EMPTY[0].1.to_string(),
            size: 0,
            last_modified: None,
            name: "producer/a.txt".to_string(),
            mime_type: None,
        },
    ]
}

#[test]
fn storage_manifest_is_byte_exact_and_sorted_by_name() {
    let expected = "#%checkm_0.7\n\
#%profile | http://uc3.cdlib.org/registry/store/manifest/mrt-add-manifest\n\
#%prefix | mrt: | http://merritt.cdlib.org/terms#\n\
#%prefix | nfo: | http://www.semanticdesktop.org/ontologies/2007/03/22/nfo#\n\
#%fields | nfo:fileUrl | nfo:hashAlgorithm | nfo:hashValue | nfo:fileSize | nfo:fileLastModified | nfo:fileName | mrt:mimeType\n\
http://ingest.example/q/1/producer/a.txt | md5 | d41d8cd98f00b204e9800998ecf8427e | 0 |  | producer/a.txt | \n\
http://ingest.example/q/1/producer/z.csv | sha256 | ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad | 3 | 2024-05-01T12:30:00+00:00 | producer/z.csv | text/csv\n\
#%eof\n";
    let mut files = manifest_files();
    assert_eq!(render(&files).unwrap(), expected);
    files.reverse();
    assert_eq!(render(&files).unwrap(), expected);
    assert!(storage_manifest::HEADER.contains(storage_manifest::PROFILE));
}

#[test]
fn an_empty_version_is_header_and_eof() {
    assert_eq!(
        render(&[]).unwrap(),
        format!("{}#%eof\n", storage_manifest::HEADER)
    );
}

/// A change to one file of [`manifest_files`].
type Change = fn(&mut ManifestFile);

#[test]
fn storage_manifest_refuses_values_checkm_cannot_carry() {
    let cases: [(Change, &str); 6] = [
        (
            |f| f.name = "producer/a|b.txt".to_string(),
            "file \"producer/a|b.txt\": the name \"producer/a|b.txt\" cannot be written in a checkm manifest: it contains the column separator '|'",
        ),
        (
            |f| f.url.push_str("\nx"),
            "file \"producer/z.csv\": the url \"http://ingest.example/q/1/producer/z.csv\\nx\" cannot be written in a checkm manifest: it contains a line break",
        ),
        (
            |f| f.mime_type = Some("text/csv\r".to_string()),
            "file \"producer/z.csv\": the mime type \"text/csv\\r\" cannot be written in a checkm manifest: it contains a line break",
        ),
        (
            |f| f.name = " producer/z.csv".to_string(),
            "file \" producer/z.csv\": the name \" producer/z.csv\" cannot be written in a checkm manifest: it has leading or trailing whitespace",
        ),
        (
            |f| f.name = String::new(),
            "file \"http://ingest.example/q/1/producer/z.csv\": the name \"\" cannot be written in a checkm manifest: it is empty",
        ),
        (
            |f| f.digest = "abc".to_string(),
            "file \"producer/z.csv\": sha256 digest \"abc\" is not 64 hexadecimal characters",
        ),
    ];
    for (change, message) in cases {
        let mut files = manifest_files();
        change(&mut files[0]);
        assert_eq!(render(&files).unwrap_err().to_string(), message);
    }
}

#[test]
fn storage_manifest_refuses_a_name_listed_twice() {
    let mut files = manifest_files();
    files[1].name = files[0].name.clone();
    assert_eq!(
        render(&files).unwrap_err(),
        ManifestError::DuplicateName {
            name: "producer/z.csv".to_string()
        }
    );
}

// ---------------------------------------------------------------- signing

const MANIFEST: &[u8] =
    b"#%checkm_0.7\nhttp://x/a | md5 | d41d8cd98f00b204e9800998ecf8427e | 0 |  | a | \n#%eof\n";

fn new_key(dir: &tempfile::TempDir, name: &str) -> SigningKeyFile {
    SigningKeyFile::generate(&dir.path().join(name)).expect("generate key")
}

#[test]
fn a_signature_round_trips_through_its_text_and_the_key_file() {
    let dir = tempfile::tempdir().unwrap();
    let key = new_key(&dir, "k.pem");
    let signature = key.sign(MANIFEST);
    let text = signature.to_text();
    signing::verify(&key.public_key_pem(), MANIFEST, &text).unwrap();
    assert_eq!(Signature::parse(&text).unwrap(), signature);

    let loaded = SigningKeyFile::load(&dir.path().join("k.pem")).unwrap();
    assert_eq!(loaded.fingerprint(), key.fingerprint());
    // Ed25519 is deterministic: the reloaded key signs identically.
    assert_eq!(loaded.sign(MANIFEST), signature);
}

#[test]
fn signature_text_and_fingerprint_have_the_documented_format() {
    let dir = tempfile::tempdir().unwrap();
    let key = new_key(&dir, "k.pem");
    let pem = key.public_key_pem();
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let der = STANDARD.decode(body).unwrap();
    assert_eq!(der.len(), 44);
    let raw_public_key = &der[12..];
    let expected_fingerprint = format!(
        "SHA256:{}",
        STANDARD_NO_PAD.encode(Sha256::digest(raw_public_key))
    );
    assert_eq!(key.fingerprint(), expected_fingerprint);
    assert_eq!(signing::fingerprint(&pem).unwrap(), expected_fingerprint);
    assert_eq!(expected_fingerprint.len(), "SHA256:".len() + 43);

    let text = key.sign(MANIFEST).to_text();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2);
    let sig = lines[0].strip_prefix("ed25519 ").unwrap();
    assert_eq!(STANDARD.decode(sig).unwrap().len(), 64);
    assert_eq!(lines[1], format!("key {expected_fingerprint}"));
    assert!(text.ends_with('\n'));
}

#[test]
fn a_flipped_manifest_byte_fails_verification() {
    let dir = tempfile::tempdir().unwrap();
    let key = new_key(&dir, "k.pem");
    let text = key.sign(MANIFEST).to_text();
    let mut changed = MANIFEST.to_vec();
    changed[20] ^= 0x01;
    let err = signing::verify(&key.public_key_pem(), &changed, &text).unwrap_err();
    assert_eq!(
        err,
        SignatureError::Invalid {
            fingerprint: key.fingerprint()
        }
    );
    assert_eq!(
        err.to_string(),
        format!(
            "signature by key {} does not match the manifest",
            key.fingerprint()
        )
    );
}

#[test]
fn a_changed_signature_fails_verification() {
    let dir = tempfile::tempdir().unwrap();
    let key = new_key(&dir, "k.pem");
    let mut signature = key.sign(MANIFEST);
    signature.bytes[0] ^= 0x80;
    let err = signing::verify(&key.public_key_pem(), MANIFEST, &signature.to_text()).unwrap_err();
    assert!(matches!(err, SignatureError::Invalid { .. }), "{err}");
}

#[test]
fn a_signature_by_another_key_names_both_fingerprints() {
    let dir = tempfile::tempdir().unwrap();
    let ours = new_key(&dir, "ours.pem");
    let theirs = new_key(&dir, "theirs.pem");
    assert_ne!(ours.fingerprint(), theirs.fingerprint());
    let text = theirs.sign(MANIFEST).to_text();
    let err = signing::verify(&ours.public_key_pem(), MANIFEST, &text).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "signature was made with key {}, but the public key given is {}",
            theirs.fingerprint(),
            ours.fingerprint()
        )
    );
}

#[test]
fn a_forged_fingerprint_line_still_fails() {
    let dir = tempfile::tempdir().unwrap();
    let ours = new_key(&dir, "ours.pem");
    let theirs = new_key(&dir, "theirs.pem");
    let mut forged = theirs.sign(MANIFEST);
    forged.key_fingerprint = ours.fingerprint();
    let err = signing::verify(&ours.public_key_pem(), MANIFEST, &forged.to_text()).unwrap_err();
    assert!(matches!(err, SignatureError::Invalid { .. }), "{err}");
}

#[test]
fn malformed_signature_texts_and_keys_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let key = new_key(&dir, "k.pem");
    let fp = key.fingerprint();
    let texts = [
        String::new(),
        format!("ed25519 AAAA\nkey {fp}\n"),
        format!("rsa {}\nkey {fp}\n", STANDARD.encode([0u8; 64])),
        format!("ed25519 {}\n", STANDARD.encode([0u8; 64])),
        format!("ed25519 {}\nkey MD5:xx\n", STANDARD.encode([0u8; 64])),
        format!("ed25519 !!!\nkey {fp}\n"),
    ];
    for text in texts {
        let err = signing::verify(&key.public_key_pem(), MANIFEST, &text).unwrap_err();
        assert!(
            matches!(err, SignatureError::Malformed { .. }),
            "{text:?}: {err}"
        );
    }
    let windows = key.sign(MANIFEST).to_text().replace('\n', "\r\n");
    signing::verify(&key.public_key_pem(), MANIFEST, &windows).unwrap();

    let err = signing::verify("not a key", MANIFEST, &key.sign(MANIFEST).to_text()).unwrap_err();
    assert!(matches!(err, SignatureError::BadPublicKey { .. }), "{err}");
}

#[cfg(unix)]
#[test]
fn a_generated_key_file_is_private_and_never_overwritten() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.pem");
    let key = SigningKeyFile::generate(&path).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let before = std::fs::read(&path).unwrap();
    assert!(String::from_utf8_lossy(&before).starts_with("-----BEGIN PRIVATE KEY-----\n"));

    let err = SigningKeyFile::generate(&path).unwrap_err();
    assert!(matches!(err, KeyFileError::AlreadyExists { .. }), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), before);
    assert_eq!(
        SigningKeyFile::load(&path).unwrap().fingerprint(),
        key.fingerprint()
    );
}

#[cfg(unix)]
#[test]
fn a_key_file_readable_by_others_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.pem");
    SigningKeyFile::generate(&path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = SigningKeyFile::load(&path).unwrap_err();
    assert!(
        matches!(err, KeyFileError::TooOpen { mode: 0o644, .. }),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "key file {0} has mode 644, readable by others; run `chmod 600 {0}`",
            path.display()
        )
    );
}

/// Writes `text` as a key file with mode 0600.
fn write_key_file(path: &std::path::Path, text: &str) {
    std::fs::write(path, text).expect("write key file");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod 600");
    }
}

#[test]
fn loading_a_missing_or_non_pem_key_file_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pem");
    let err = SigningKeyFile::load(&missing).unwrap_err();
    assert!(matches!(err, KeyFileError::Missing { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        format!("key file {} not found", missing.display())
    );

    let garbage = dir.path().join("garbage.pem");
    write_key_file(&garbage, "hello\n");
    let err = SigningKeyFile::load(&garbage).unwrap_err();
    assert!(matches!(err, KeyFileError::NotPem { .. }), "{err}");
}

#[test]
fn loading_a_key_of_another_type_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let key = new_key(&dir, "k.pem");

    let public = dir.path().join("public.pem");
    write_key_file(&public, &key.public_key_pem());
    let err = SigningKeyFile::load(&public).unwrap_err();
    assert!(matches!(err, KeyFileError::WrongKeyType { .. }), "{err}");
    assert!(
        err.to_string().contains("holds a \"PUBLIC KEY\" PEM"),
        "{err}"
    );

    // The same PKCS#8 document with the algorithm changed from Ed25519
    // (1.3.101.112) to X25519 (1.3.101.110).
    let pem = std::fs::read_to_string(dir.path().join("k.pem")).unwrap();
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let mut der = STANDARD.decode(body).unwrap();
    let oid = [0x06, 0x03, 0x2b, 0x65, 0x70];
    let at = der.windows(5).position(|w| w == oid).unwrap();
    der[at + 4] = 0x6e;
    let encoded = STANDARD.encode(&der);
    let lines: Vec<&str> = encoded
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    let x25519 = format!(
        "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
        lines.join("\n")
    );
    let path = dir.path().join("x25519.pem");
    write_key_file(&path, &x25519);
    let err = SigningKeyFile::load(&path).unwrap_err();
    assert!(matches!(err, KeyFileError::WrongKeyType { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("holds an X25519 key (algorithm 1.3.101.110)"),
        "{err}"
    );
}

#[test]
fn key_debug_output_does_not_show_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let key = new_key(&dir, "k.pem");
    let debug = format!("{key:?}");
    assert!(debug.contains(&key.fingerprint()), "{debug}");
    assert!(!debug.contains("PRIVATE"), "{debug}");
}

/// Opens the sled database at `path`, waiting (bounded) for a handle just
/// dropped to release its file lock: sled's flusher thread holds the
/// database a moment after the last handle goes (the reopen failed with
/// WouldBlock under a loaded test run).
fn open_when_released(path: &std::path::Path) -> sled::Db {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match sled::open(path) {
            Ok(db) => return db,
            Err(e)
                if std::time::Instant::now() < deadline
                    && e.to_string().contains("could not acquire lock") =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => panic!("cannot open {}: {e}", path.display()),
        }
    }
}

/// Parses `xml` with a namespace-aware XML parser and returns every element
/// under the root as (namespace, local name, text).
fn parse_dc(xml: &str) -> Vec<(String, String, String)> {
    use quick_xml::events::Event;
    use quick_xml::name::ResolveResult;
    let mut reader = quick_xml::NsReader::from_str(xml);
    let mut elements = Vec::new();
    // The element open under the root, and its text so far (text comes in
    // pieces between entity references).
    let mut open: Option<(String, String, Option<String>)> = None;
    let mut depth = 0usize;
    loop {
        match reader.read_resolved_event().expect("well-formed XML") {
            (ns, Event::Start(e)) => {
                depth += 1;
                if depth == 2 {
                    let ns = match ns {
                        ResolveResult::Bound(n) => {
                            String::from_utf8(n.0.to_vec()).expect("UTF-8 XML")
                        }
                        other => panic!("an element in no namespace: {other:?}"),
                    };
                    let local =
                        String::from_utf8(e.local_name().as_ref().to_vec()).expect("UTF-8 XML");
                    open = Some((ns, local, None));
                }
            }
            (_, Event::Text(t)) => {
                if let Some((_, _, text)) = open.as_mut() {
                    let piece = t.xml10_content().expect("UTF-8 XML");
                    text.get_or_insert_with(String::new).push_str(&piece);
                }
            }
            (_, Event::GeneralRef(r)) => {
                if let Some((_, _, text)) = open.as_mut() {
                    let name = r.decode().expect("UTF-8 XML");
                    let resolved = match r.resolve_char_ref().expect("a valid character reference")
                    {
                        Some(c) => c.to_string(),
                        None => quick_xml::escape::resolve_predefined_entity(&name)
                            .unwrap_or_else(|| panic!("an unknown entity &{name};"))
                            .to_string(),
                    };
                    text.get_or_insert_with(String::new).push_str(&resolved);
                }
            }
            (_, Event::End(_)) => {
                if depth == 2 {
                    if let Some((ns, local, Some(text))) = open.take() {
                        elements.push((ns, local, text));
                    }
                }
                depth -= 1;
            }
            (_, Event::Eof) => break,
            _ => {}
        }
    }
    assert_eq!(depth, 0, "every element closed");
    elements
}

#[test]
fn dublin_core_parses_with_every_element_in_the_dc_namespace() {
    let fields = ErcFields {
        who: Some("O'Brien & <Sons>\r\nLtd".to_string()),
        what: Some("Caf\u{e9} \u{1}\u{FFFE}notes".to_string()),
        when: Some("2024".to_string()),
        wheres: vec!["ark:/99999/fk4x".to_string(), "id\"1\"".to_string()],
    };
    let parsed = parse_dc(&write_dublin_core(&fields));
    let dc = "http://purl.org/dc/elements/1.1/";
    let expected = [
        ("creator", "O'Brien & <Sons>\r\nLtd"),
        ("title", "Caf\u{e9} notes"),
        ("date", "2024"),
        ("identifier", "ark:/99999/fk4x"),
        ("identifier", "id\"1\""),
    ];
    let want: Vec<(String, String, String)> = expected
        .iter()
        .map(|(l, t)| (dc.to_string(), l.to_string(), t.to_string()))
        .collect();
    assert_eq!(parsed, want);
}

proptest::proptest! {
    /// Whatever the depositor's metadata, the file is well-formed XML whose
    /// elements are Dublin Core elements.
    #[test]
    fn dublin_core_is_well_formed_for_any_text(who in ".{0,40}", what in ".{0,40}", w in ".{0,20}") {
        let fields = ErcFields { who: Some(who), what: Some(what), when: None, wheres: vec![w] };
        for (ns, local, _) in parse_dc(&write_dublin_core(&fields)) {
            proptest::prop_assert_eq!(ns, "http://purl.org/dc/elements/1.1/");
            proptest::prop_assert!(["creator", "title", "identifier"].contains(&local.as_str()));
        }
    }
}
