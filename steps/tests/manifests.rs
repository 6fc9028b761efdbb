//! Checkm manifests and the Merritt batch forms: Merritt's own sample
//! manifests, and a table of broken manifests with the line and message
//! each must be refused with.

use std::path::{Path, PathBuf};

use ingest_steps::checkm::{
    parse, parse_with_limits, Manifest, ManifestError, ParseLimits, Prefix, DEFAULT_FIELDS,
};
use ingest_steps::forms::{objects, FileDigest, FileSpec, Form, ObjectKind, ObjectSpec};
use proptest::prelude::*;

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/manifests")
}

fn sample(name: &str) -> Vec<u8> {
    let path = data_dir().join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn parse_sample(name: &str) -> Manifest {
    parse(&sample(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn parse_text(text: &str) -> Result<Manifest, ManifestError> {
    parse(text.as_bytes())
}

const MERRITT_FIELDS: &str = "#%fields | nfo:fileUrl | nfo:hashAlgorithm | nfo:hashValue | nfo:fileSize | nfo:fileLastModified | nfo:fileName | mrt:primaryIdentifier | mrt:localIdentifier | mrt:creator | mrt:title | mrt:date";

/// A manifest of `form` with Merritt's fields and the given data lines
/// (the data starts on line 4).
fn manifest_of(form: Form, lines: &[&str]) -> String {
    let profile = form.profile_url().expect("a manifest form");
    let mut text = format!("#%checkm_0.7\n#%profile | {profile}\n{MERRITT_FIELDS}\n");
    for line in lines {
        text.push_str(line);
        text.push('\n');
    }
    text.push_str("#%eof\n");
    text
}

fn objects_of(form: Form, lines: &[&str]) -> Result<Vec<ObjectSpec>, ManifestError> {
    let manifest = parse_text(&manifest_of(form, lines)).expect("the manifest parses");
    objects(&manifest, form)
}

fn object_error(form: Form, lines: &[&str]) -> ManifestError {
    objects_of(form, lines).expect_err("the manifest must be refused")
}

// ------------------------------------------------------------ the samples

#[test]
fn every_sample_parses() {
    let mut count = 0;
    for entry in std::fs::read_dir(data_dir()).expect("data dir") {
        let path = entry.expect("dir entry").path();
        if path.extension().is_some_and(|e| e == "checkm") {
            let manifest = parse(&std::fs::read(&path).expect("read"))
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let form = manifest
                .profile
                .as_deref()
                .and_then(Form::from_profile)
                .unwrap_or_else(|| panic!("{}: no known profile", path.display()));
            let objects =
                objects(&manifest, form).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(!objects.is_empty());
            count += 1;
        }
    }
    assert_eq!(count, 5, "the samples in tests/data/manifests");
}

#[test]
fn mock_object_is_one_object_of_its_files() {
    let manifest = parse_sample("mock_object.checkm");
    assert_eq!(
        manifest.profile.as_deref(),
        Some("http://uc3.cdlib.org/registry/ingest/manifest/mrt-ingest-manifest")
    );
    assert_eq!(manifest.profile_line, Some(2));
    assert_eq!(
        manifest.prefixes,
        vec![
            Prefix {
                prefix: "mrt".into(),
                uri: "http://merritt.cdlib.org/terms#".into()
            },
            Prefix {
                prefix: "nfo".into(),
                uri: "http://www.semanticdesktop.org/ontologies/2007/03/22/nfo#".into()
            },
        ]
    );
    assert_eq!(manifest.fields.len(), 7);
    assert_eq!(manifest.fields[6], "mrt:mimeType");
    assert_eq!(manifest.eof_line, 7);
    // 6 values for 7 fields: the missing mime type is unset.
    assert_eq!(manifest.entries.len(), 1);
    let entry = &manifest.entries[0];
    assert_eq!(entry.line, 6);
    assert_eq!(
        entry.values,
        vec![
            Some("http://mock-merritt-it:4567/static/hello.txt".into()),
            None,
            None,
            None,
            None,
            Some("hello.txt".into()),
            None,
        ]
    );

    let objects = objects(&manifest, Form::ObjectManifest).unwrap();
    assert_eq!(
        objects,
        vec![ObjectSpec {
            line: None,
            files: vec![FileSpec {
                url: "http://mock-merritt-it:4567/static/hello.txt".into(),
                name: "hello.txt".into(),
                size: None,
                digest: None,
                mime_type: None,
            }],
            primary_id: None,
            local_ids: vec![],
            who: None,
            what: None,
            when: None,
            kind: ObjectKind::Files,
        }]
    );
}

#[test]
fn digest_batch_is_one_container_with_a_normalized_digest() {
    let manifest = parse_sample("digest_batch.checkm");
    let objects = objects(&manifest, Form::ContainerBatch).unwrap();
    assert_eq!(objects.len(), 1);
    let object = &objects[0];
    assert_eq!(object.line, Some(6));
    assert_eq!(object.kind, ObjectKind::Container);
    assert_eq!(object.files.len(), 1);
    assert_eq!(object.files[0].name, "test_digest.zip");
    assert_eq!(
        object.files[0].digest,
        Some(FileDigest {
            algorithm: "sha256".into(),
            value: "80a5b1dd2a8f7a28e817768f8db5ae9098e89d6330b4fd2c2ca3c600d1f97e59".into(),
        })
    );
    assert_eq!(object.local_ids, Vec::<String>::new());
}

#[test]
fn local_identifiers_are_deduplicated_in_order() {
    let single = objects(
        &parse_sample("localid2_batch.checkm"),
        Form::SingleFileBatch,
    )
    .unwrap();
    assert_eq!(single.len(), 1);
    assert_eq!(single[0].kind, ObjectKind::Files);
    assert_eq!(single[0].files[0].name, "hello.txt");
    assert_eq!(
        single[0].local_ids,
        vec!["localidseven", "localideight", "localidnine"]
    );

    let containers = objects(&parse_sample("localid_batch.checkm"), Form::ContainerBatch).unwrap();
    assert_eq!(
        containers[0].local_ids,
        vec!["localidfour", "localidfive", "localidsix"]
    );
}

#[test]
fn batch_manifest_lists_object_manifests() {
    let objects = objects(&parse_sample("batch_manifest.checkm"), Form::BatchManifest).unwrap();
    assert_eq!(objects.len(), 2);
    let one = &objects[0];
    assert_eq!(one.line, Some(7));
    assert_eq!(one.kind, ObjectKind::ObjectManifest);
    // No nfo:fileName: the URL's last segment, percent-decoded.
    assert_eq!(one.files[0].name, "object one.checkm");
    assert_eq!(
        one.files[0].url,
        "https://example.org/manifests/object%20one.checkm"
    );
    assert_eq!(one.files[0].size, Some(416));
    assert_eq!(
        one.files[0].digest,
        Some(FileDigest {
            algorithm: "md5".into(),
            value: "0cc175b9c0f1b6a831c399e269772661".into()
        })
    );
    assert_eq!(one.primary_id.as_deref(), Some("ark:/99999/fk4one"));
    assert_eq!(one.who.as_deref(), Some("Doe, Jane"));
    assert_eq!(one.what.as_deref(), Some("Object one"));
    assert_eq!(one.when.as_deref(), Some("2024"));
    assert_eq!(objects[1].line, Some(8));
    assert_eq!(objects[1].local_ids, vec!["two", "2"]);
}

#[test]
fn a_sample_read_as_another_form_names_both() {
    let error = objects(&parse_sample("localid2_batch.checkm"), Form::ContainerBatch).unwrap_err();
    assert_eq!(
        error,
        ManifestError::new(
            2,
            "the manifest's profile is single-file-batch-manifest \
             (http://uc3.cdlib.org/registry/ingest/manifest/mrt-single-file-batch-manifest), \
             but it was submitted as container-batch-manifest \
             (http://uc3.cdlib.org/registry/ingest/manifest/mrt-container-batch-manifest)"
        )
    );
}

#[test]
fn crlf_and_a_byte_order_mark_are_tolerated() {
    let plain = parse_sample("digest_batch.checkm");
    let text = String::from_utf8(sample("digest_batch.checkm")).unwrap();
    let mut dos = b"\xEF\xBB\xBF".to_vec();
    dos.extend_from_slice(text.replace('\n', "\r\n").as_bytes());
    assert_eq!(parse(&dos).unwrap(), plain);
}

// ------------------------------------------------------------ the parser's rules

/// Broken manifests and the first problem each must be reported with.
const BROKEN: &[(&str, &str, usize, &str)] = &[
    (
        "no header",
        "#%profile | x\n#%eof\n",
        1,
        "expected #%checkm_0.7 as the first line, found \"#%profile | x\"",
    ),
    (
        "a comment before the header",
        "\n# hello\n#%checkm_0.7\n#%eof\n",
        2,
        "expected #%checkm_0.7 as the first line, found \"# hello\"",
    ),
    (
        "wrong version",
        "#%checkm_0.6\n#%eof\n",
        1,
        "expected #%checkm_0.7 as the first line, found \"#%checkm_0.6\"",
    ),
    (
        "empty input",
        "",
        1,
        "the manifest is empty: expected #%checkm_0.7",
    ),
    (
        "missing eof",
        "#%checkm_0.7\nhttp://x/a\n\n",
        2,
        "the manifest ends without #%eof (it may have been cut short)",
    ),
    (
        "content after eof",
        "#%checkm_0.7\n#%eof\n\nhttp://x/a\n",
        4,
        "content after #%eof (line 2)",
    ),
    (
        "a comment after eof",
        "#%checkm_0.7\n#%eof\n# late\n",
        3,
        "content after #%eof (line 2)",
    ),
    (
        "unknown directive",
        "#%checkm_0.7\n#%fields | a\n#%version | 2\n#%eof\n",
        3,
        "unknown directive \"#%version\" (expected #%profile, #%prefix, #%fields or #%eof)",
    ),
    (
        "a second header",
        "#%checkm_0.7\n#%CHECKM_0.7\n#%eof\n",
        2,
        "a second #%checkm_0.7 header",
    ),
    (
        "a second profile",
        "#%checkm_0.7\n#%profile | a\n#%profile | b\n#%eof\n",
        3,
        "a second #%profile (the first is on line 2)",
    ),
    (
        "an empty profile",
        "#%checkm_0.7\n#%profile |\n#%eof\n",
        2,
        "#%profile takes exactly one value, the profile URL",
    ),
    (
        "a prefix without a URI",
        "#%checkm_0.7\n#%prefix | mrt:\n#%eof\n",
        2,
        "#%prefix takes exactly two values, the prefix and its URI",
    ),
    (
        "a second fields line",
        "#%checkm_0.7\n#%fields | a\n#%fields | b\n#%eof\n",
        3,
        "a second #%fields (the first is on line 2)",
    ),
    (
        "fields after an entry",
        "#%checkm_0.7\nhttp://x/a\n#%fields | a\n#%eof\n",
        3,
        "#%fields after the first entry (line 2)",
    ),
    (
        "an empty field name",
        "#%checkm_0.7\n#%fields | a | | b\n#%eof\n",
        2,
        "field 2 of #%fields is empty",
    ),
    (
        "the same field twice",
        "#%checkm_0.7\n#%fields | nfo:fileUrl | FILEURL\n#%eof\n",
        2,
        "fields \"nfo:fileUrl\" and \"FILEURL\" are the same field",
    ),
    (
        "more values than fields",
        "#%checkm_0.7\n#%fields | a | b\nx | y | z\n#%eof\n",
        3,
        "3 values, but #%fields (line 2) declares 2 fields",
    ),
    (
        "more values than the default fields",
        "#%checkm_0.7\n1|2|3|4|5|6|7\n#%eof\n",
        2,
        "7 values, but without #%fields, checkm 0.7 has 6 fields",
    ),
    (
        "eof with a value",
        "#%checkm_0.7\n#%eof | now\n",
        2,
        "#%eof takes no values",
    ),
    (
        // The first problem wins, even when a later line is also wrong.
        "two problems",
        "#%checkm_0.7\n#%bogus\n#%eof\ntrailing\n",
        2,
        "unknown directive \"#%bogus\" (expected #%profile, #%prefix, #%fields or #%eof)",
    ),
];

#[test]
fn broken_manifests_are_refused_at_their_first_problem() {
    for (what, text, line, message) in BROKEN {
        let error = parse_text(text).expect_err(what);
        assert_eq!(
            error,
            ManifestError::new(*line, *message),
            "{what}: got {error}"
        );
    }
}

#[test]
fn error_display_names_the_line() {
    assert_eq!(
        parse_text("#%checkm_0.7\n#%eof\nx\n")
            .unwrap_err()
            .to_string(),
        "line 3: content after #%eof (line 2)"
    );
}

#[test]
fn header_token_is_case_insensitive_and_may_have_trailing_spaces() {
    for header in [
        "#%checkm_0.7",
        "#%CHECKM_0.7",
        "#%Checkm_0.7   ",
        "  #%checkm_0.7\t",
    ] {
        let manifest =
            parse_text(&format!("{header}\n#%eof\n")).unwrap_or_else(|e| panic!("{header:?}: {e}"));
        assert!(manifest.entries.is_empty());
        assert_eq!(manifest.eof_line, 2);
    }
}

#[test]
fn comments_and_blank_lines_are_ignored() {
    let manifest = parse_text(
        "\n\n#%checkm_0.7\n# a comment\n\n  \nhttp://x/a | md5\n# another\n#%eof\n\n  \n",
    )
    .unwrap();
    assert_eq!(manifest.entries.len(), 1);
    assert_eq!(manifest.entries[0].line, 7);
    assert_eq!(manifest.eof_line, 9);
}

#[test]
fn without_fields_the_checkm_defaults_apply() {
    let manifest = parse_text(
        "#%checkm_0.7\nhttp://x/a.txt | MD5 | abc | 12 | 2020-01-01 | dir/a.txt\n#%eof\n",
    )
    .unwrap();
    assert_eq!(manifest.fields, DEFAULT_FIELDS.map(String::from).to_vec());
    let record = manifest.records().next().unwrap();
    assert_eq!(record.file_url(), Some("http://x/a.txt"));
    assert_eq!(record.hash_algorithm(), Some("MD5"));
    assert_eq!(record.hash_value(), Some("abc"));
    assert_eq!(record.file_size(), Ok(Some(12)));
    assert_eq!(record.last_modified(), Some("2020-01-01"));
    assert_eq!(record.file_name(), Some("dir/a.txt"));
    assert_eq!(record.mime_type(), None);
}

#[test]
fn values_are_trimmed_and_empty_ones_unset() {
    let manifest =
        parse_text("#%checkm_0.7\n#%fields | a | b | c | d\n  x  |   | \t z \t\n#%eof\n").unwrap();
    assert_eq!(
        manifest.entries[0].values,
        vec![Some("x".into()), None, Some("z".into()), None]
    );
}

#[test]
fn trailing_empty_values_beyond_the_fields_are_accepted() {
    let manifest = parse_text("#%checkm_0.7\n#%fields | a | b\nx | y | | |\n#%eof\n").unwrap();
    assert_eq!(
        manifest.entries[0].values,
        vec![Some("x".into()), Some("y".into())]
    );
}

#[test]
fn field_names_match_without_prefix_or_case() {
    let manifest = parse_text(
        "#%checkm_0.7\n#%fields | fileUrl | NFO:FILESIZE | mrt:localIdentifier | Title\n\
         http://x/a | 7 | a ; ;b;a; c | T\n#%eof\n",
    )
    .unwrap();
    assert_eq!(manifest.field_index("nfo:fileUrl"), Some(0));
    assert_eq!(manifest.field_index("fileurl"), Some(0));
    assert_eq!(manifest.field_index("filesize"), Some(1));
    assert_eq!(manifest.field_index("mrt:title"), Some(3));
    assert_eq!(manifest.field_index("creator"), None);
    let record = manifest.records().next().unwrap();
    assert_eq!(record.get("NFO:fileUrl"), Some("http://x/a"));
    assert_eq!(record.file_size(), Ok(Some(7)));
    assert_eq!(record.local_identifiers(), vec!["a", "b", "c"]);
    assert_eq!(record.title(), Some("T"));
    assert_eq!(record.creator(), None);
}

#[test]
fn a_garbage_file_size_names_the_line() {
    for garbage in ["12kB", "-1", "+5", "1.5", "99999999999999999999"] {
        let manifest = parse_text(&format!(
            "#%checkm_0.7\n#%fields | nfo:fileUrl | nfo:fileSize\n\nhttp://x/a | {garbage}\n#%eof\n"
        ))
        .unwrap();
        let error = manifest.records().next().unwrap().file_size().unwrap_err();
        assert_eq!(
            error,
            ManifestError::new(
                4,
                format!("file size {garbage:?} is not a whole number of bytes")
            )
        );
    }
}

#[test]
fn invalid_utf8_names_the_line() {
    let error = parse(b"#%checkm_0.7\nhttp://x/ok\nhttp://x/\xff\n#%eof\n").unwrap_err();
    assert_eq!(
        error,
        ManifestError::new(3, "invalid UTF-8 at byte 10 of the line")
    );
}

#[test]
fn limits_refuse_large_manifests() {
    let limits = ParseLimits {
        max_entries: 2,
        ..ParseLimits::default()
    };
    let text = "#%checkm_0.7\nhttp://x/1\nhttp://x/2\nhttp://x/3\n#%eof\n";
    assert_eq!(
        parse_with_limits(text.as_bytes(), &limits).unwrap_err(),
        ManifestError::new(4, "more than 2 entries")
    );

    let limits = ParseLimits {
        max_bytes: 20,
        ..ParseLimits::default()
    };
    // Byte 20 is on line 2.
    assert_eq!(
        parse_with_limits(text.as_bytes(), &limits).unwrap_err(),
        ManifestError::new(2, "the manifest is larger than 20 bytes")
    );

    let limits = ParseLimits {
        max_fields: 2,
        ..ParseLimits::default()
    };
    assert_eq!(
        parse_with_limits(b"#%checkm_0.7\n#%fields | a | b | c\n#%eof\n", &limits).unwrap_err(),
        ManifestError::new(2, "more than 2 fields")
    );
    assert_eq!(
        ParseLimits::default(),
        ParseLimits {
            max_bytes: 64 * 1024 * 1024,
            max_entries: 1_000_000,
            max_fields: 256,
            max_line_bytes: 64 * 1024,
        }
    );
}

// Regression (issue 25, finding 3): one 20 MB line was parsed into a job
// whose acquire the server refused as too large, for ever.
#[test]
fn a_line_over_the_limit_is_refused_naming_it_without_quoting_it() {
    let mut text = b"#%checkm_0.7\n#%fields | nfo:fileUrl | nfo:fileName\n".to_vec();
    text.extend(std::iter::repeat_n(b'x', 2 * 1024 * 1024));
    text.extend_from_slice(b" | a\n#%eof\n");
    let e = ingest_steps::checkm::parse(&text).unwrap_err();
    assert_eq!(e.line, 3);
    assert!(e.to_string().len() < 100, "{e}");
    let limits = ParseLimits {
        max_line_bytes: 12,
        ..ParseLimits::default()
    };
    assert_eq!(
        parse_with_limits(b"#%checkm_0.7\nhttp://x/1234\n#%eof\n", &limits).unwrap_err(),
        ManifestError::new(2, "the line is 13 bytes, more than 12 bytes")
    );
}

// ------------------------------------------------------------ the forms

#[test]
fn form_names_and_profiles() {
    assert_eq!(
        Form::from_profile("https://merritt.example.edu/profiles/mrt-container-batch-manifest"),
        Some(Form::ContainerBatch)
    );
    assert_eq!(Form::from_profile("http://x/y/not-a-profile"), None);
    assert_eq!(Form::SingleFile.profile_url(), None);
    assert_eq!(Form::Container.profile_url(), None);
    assert_eq!(
        serde_json::to_string(&Form::SingleFileBatch).unwrap(),
        "\"single-file-batch-manifest\""
    );
    assert_eq!(
        serde_json::from_str::<Form>("\"file\"").unwrap(),
        Form::SingleFile
    );
}

#[test]
fn missing_and_unknown_profiles_are_refused() {
    let manifest = parse_text("#%checkm_0.7\nhttp://x/a\n#%eof\n").unwrap();
    assert_eq!(
        objects(&manifest, Form::SingleFileBatch).unwrap_err(),
        ManifestError::new(
            1,
            "the manifest has no #%profile; expected \
             http://uc3.cdlib.org/registry/ingest/manifest/mrt-single-file-batch-manifest"
        )
    );
    let manifest =
        parse_text("#%checkm_0.7\n\n#%profile | http://x/mrt-whatever\nhttp://x/a\n#%eof\n")
            .unwrap();
    assert_eq!(
        objects(&manifest, Form::ObjectManifest).unwrap_err(),
        ManifestError::new(
            3,
            "unknown profile \"http://x/mrt-whatever\"; expected \
             http://uc3.cdlib.org/registry/ingest/manifest/mrt-ingest-manifest"
        )
    );
    let manifest = parse_sample("mock_object.checkm");
    assert_eq!(
        objects(&manifest, Form::SingleFile).unwrap_err(),
        ManifestError::new(
            1,
            "a file payload is not a manifest; there is nothing to expand"
        )
    );
}

#[test]
fn an_empty_manifest_lists_no_objects() {
    let error = object_error(Form::ContainerBatch, &[]);
    assert_eq!(
        error,
        ManifestError::new(4, "the manifest lists no objects")
    );
}

#[test]
fn a_line_without_url_is_refused() {
    let error = object_error(
        Form::SingleFileBatch,
        &["http://x/a.txt", " | md5 | | | | b.txt"],
    );
    assert_eq!(error, ManifestError::new(5, "no file URL (nfo:fileUrl)"));
}

#[test]
fn only_http_https_and_file_urls_are_accepted() {
    let error = object_error(Form::SingleFileBatch, &["ftp://x/a.txt"]);
    assert_eq!(
        error,
        ManifestError::new(
            4,
            "file URL \"ftp://x/a.txt\" has the scheme \"ftp\"; only http, https and file are accepted"
        )
    );
    let error = object_error(Form::SingleFileBatch, &["not a url"]);
    assert_eq!(error.line, 4);
    assert!(
        error.message.starts_with("invalid file URL \"not a url\""),
        "{error}"
    );
    let objects = objects_of(
        Form::ObjectManifest,
        &["file:///srv/in/a%C3%A9.txt", "HTTPS://Example.org/b.txt"],
    )
    .unwrap();
    assert_eq!(objects[0].files[0].url, "file:///srv/in/a%C3%A9.txt");
    assert_eq!(objects[0].files[0].name, "aé.txt");
    assert_eq!(objects[0].files[1].url, "https://example.org/b.txt");
}

#[test]
fn digests_are_checked_and_normalized() {
    let md5 = "D41D8CD98F00B204E9800998ECF8427E";
    let ok = objects_of(
        Form::ObjectManifest,
        &[
            &format!("http://x/a | MD5 | {md5}"),
            &format!("http://x/b | sha-1 | {}", "a".repeat(40)),
            &format!("http://x/c | SHA-256 | {}", "b".repeat(64)),
            &format!("http://x/d | sha512 | {}", "c".repeat(128)),
        ],
    )
    .unwrap();
    let digests: Vec<_> = ok[0]
        .files
        .iter()
        .map(|f| f.digest.clone().expect("digest"))
        .map(|d| (d.algorithm, d.value.len()))
        .collect();
    assert_eq!(
        digests,
        vec![
            ("md5".into(), 32),
            ("sha1".into(), 40),
            ("sha256".into(), 64),
            ("sha512".into(), 128)
        ]
    );
    assert_eq!(
        ok[0].files[0].digest.as_ref().unwrap().value,
        "d41d8cd98f00b204e9800998ecf8427e"
    );

    let unknown = object_error(Form::ObjectManifest, &["http://x/a | crc32 | 1234abcd"]);
    assert_eq!(unknown.line, 4);
    assert!(
        unknown
            .message
            .contains("unknown digest algorithm \"crc32\""),
        "{unknown}"
    );
    let short = object_error(
        Form::ObjectManifest,
        &["http://x/a", "http://x/b | sha256 | abcd"],
    );
    assert_eq!(
        short,
        ManifestError::new(
            5,
            "the sha256 hash value \"abcd\" is not 64 hexadecimal digits"
        )
    );
    let not_hex = object_error(
        Form::ObjectManifest,
        &[&format!("http://x/a | md5 | {}", "g".repeat(32))],
    );
    assert_eq!(not_hex.line, 4);
    assert!(not_hex.message.contains("is not 32 hexadecimal digits"));
    assert_eq!(
        object_error(Form::ObjectManifest, &["http://x/a | md5"]),
        ManifestError::new(4, "hash algorithm \"md5\" without a hash value")
    );
    assert_eq!(
        object_error(Form::ObjectManifest, &[&format!("http://x/a | | {md5}")]),
        ManifestError::new(4, "hash value without a hash algorithm")
    );
}

#[test]
fn an_object_manifest_may_not_list_a_name_twice() {
    let error = object_error(
        Form::ObjectManifest,
        &["http://x/1/a.txt", "http://x/b.txt", "http://x/2/a.txt"],
    );
    assert_eq!(
        error,
        ManifestError::new(6, "the file name \"a.txt\" is already used on line 4")
    );
    // After normalization, `d//a.txt` and `d/a.txt` are the same name.
    let error = object_error(
        Form::ObjectManifest,
        &[
            "http://x/1 | | | | | d/a.txt",
            "http://x/2 | | | | | d//./a.txt",
        ],
    );
    assert_eq!(error.line, 5);
    // A batch lists one object per line: the same name twice is fine.
    let batch = objects_of(
        Form::SingleFileBatch,
        &["http://x/1/a.txt", "http://x/2/a.txt"],
    );
    assert_eq!(batch.unwrap().len(), 2);
}

#[test]
fn unsafe_names_are_refused_with_line_and_name() {
    let error = object_error(
        Form::ObjectManifest,
        &[
            "http://x/a.txt",
            "http://x/b.txt | | | | | ../../etc/passwd",
        ],
    );
    assert_eq!(
        error,
        ManifestError::new(
            5,
            "file name refused: file name \"../../etc/passwd\" has a `..` component"
        )
    );
    // A name that comes from the URL is checked too, once decoded.
    let error = object_error(Form::SingleFileBatch, &["http://x/a%5C..%5Cb"]);
    assert_eq!(
        error,
        ManifestError::new(
            4,
            "file name refused: file name \"a\\\\..\\\\b\" contains a backslash; use `/` as the \
             separator (a backslash is a separator on Windows and a character elsewhere)"
        )
    );
    let error = object_error(Form::SingleFileBatch, &["http://x/a%00b"]);
    assert_eq!(error.line, 4);
    assert!(error.message.contains("control character '\\0'"), "{error}");
    // The url crate resolves `%2E%2E` as `..`, leaving no last segment.
    let error = object_error(Form::SingleFileBatch, &["http://x/%2E%2E"]);
    assert_eq!(
        error,
        ManifestError::new(
            4,
            "cannot take a file name from the URL http://x/; give nfo:fileName"
        )
    );
    let error = object_error(Form::SingleFileBatch, &["http://x/dir/"]);
    assert_eq!(
        error,
        ManifestError::new(
            4,
            "cannot take a file name from the URL http://x/dir/; give nfo:fileName"
        )
    );
}

#[test]
fn sizes_and_mime_types_are_carried() {
    let text = "#%checkm_0.7\n\
        #%profile | http://uc3.cdlib.org/registry/ingest/manifest/mrt-ingest-manifest\n\
        #%fields | nfo:fileUrl | nfo:fileSize | nfo:fileName | mrt:mimeType\n\
        http://x/a | 10 | data/a.csv | text/csv\n\
        http://x/b | zero | b\n\
        #%eof\n";
    let manifest = parse_text(text).unwrap();
    assert_eq!(
        objects(&manifest, Form::ObjectManifest).unwrap_err(),
        ManifestError::new(5, "file size \"zero\" is not a whole number of bytes")
    );
    let manifest = parse_text(&text.replace("| zero |", "| 0 |")).unwrap();
    let object = objects(&manifest, Form::ObjectManifest).unwrap().remove(0);
    assert_eq!(
        object.files[0],
        FileSpec {
            url: "http://x/a".into(),
            name: "data/a.csv".into(),
            size: Some(10),
            digest: None,
            mime_type: Some("text/csv".into()),
        }
    );
    assert_eq!(object.files[1].size, Some(0));
}

#[test]
fn object_specs_round_trip_through_json() {
    let objects = objects(&parse_sample("batch_manifest.checkm"), Form::BatchManifest).unwrap();
    let json = serde_json::to_string(&objects).unwrap();
    assert!(json.contains("\"kind\":\"object-manifest\""), "{json}");
    let back: Vec<ObjectSpec> = serde_json::from_str(&json).unwrap();
    assert_eq!(back, objects);
}

// ------------------------------------------------------------ arbitrary input

fn line() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("#%checkm_0.7".to_owned()),
        Just("#%eof".to_owned()),
        Just(MERRITT_FIELDS.to_owned()),
        Just("#%fields | nfo:fileUrl | nfo:fileName".to_owned()),
        Just(format!(
            "#%profile | {}",
            Form::ObjectManifest.profile_url().expect("profile")
        )),
        Just(format!(
            "#%profile | {}",
            Form::SingleFileBatch.profile_url().expect("profile")
        )),
        "(https?|file|ftp)://[a-z]{1,5}/[a-zA-Z0-9%./]{0,20}( *\\| *[a-zA-Z0-9%./;:-]{0,12}){0,12}",
        "[a-z:/|. %0-9#;-]{0,40}",
        any::<String>(),
    ]
}

proptest! {
    #[test]
    fn arbitrary_manifests_never_panic(lines in prop::collection::vec(line(), 0..12)) {
        let text = lines.join("\n");
        let line_count = text.split('\n').count();
        match parse(text.as_bytes()) {
            Ok(manifest) => {
                for entry in &manifest.entries {
                    prop_assert_eq!(entry.values.len(), manifest.fields.len());
                }
                for form in Form::ALL {
                    if let Err(error) = objects(&manifest, form) {
                        prop_assert!(error.line >= 1 && error.line <= line_count, "{}", error);
                    }
                }
            }
            Err(error) => {
                prop_assert!(error.line >= 1 && error.line <= line_count, "{}", error);
            }
        }
    }
}
