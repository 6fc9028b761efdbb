use std::collections::BTreeMap;
use std::io::Read;

use chrono::Utc;

use super::*;
use crate::ocfl::VersionMeta;

const ARK: &str = "ark:/99999/fk4asm";

fn meta() -> VersionMeta {
    VersionMeta {
        user_name: "tester".into(),
        user_address: None,
        message: "test".into(),
        created: Utc::now(),
    }
}

fn write(dir: &Path, files: &[(&str, &[u8])]) {
    for (path, bytes) in files {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("dir");
        std::fs::write(p, bytes).expect("write");
    }
}

/// Two versions in `target`: `producer/a.txt` unchanged in v2 (so v2's
/// copy is v1's content, deduplicated), `producer/c.txt` new in v2.
fn two_versions(root: &Path, name: &str) -> OcflTarget {
    let target = OcflTarget::open_or_init(name, root).expect("target");
    let v1 = tempfile::tempdir().expect("tempdir");
    write(
        v1.path(),
        &[
            ("producer/a.txt", b"same in both versions"),
            ("producer/b.txt", b"only in v1"),
            ("system/mrt-erc.txt", b"erc: v1"),
        ],
    );
    target.store_version(ARK, v1.path(), &meta()).expect("v1");
    let v2 = tempfile::tempdir().expect("tempdir");
    write(
        v2.path(),
        &[
            ("producer/a.txt", b"same in both versions"),
            ("producer/c.txt", &[7u8; 300_000]),
            ("system/mrt-erc.txt", b"erc: v2"),
        ],
    );
    target.store_version(ARK, v2.path(), &meta()).expect("v2");
    target
}

fn zip_entries(path: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut z = zip::ZipArchive::new(File::open(path).expect("open")).expect("zip");
    (0..z.len())
        .map(|i| {
            let mut e = z.by_index(i).expect("entry");
            let mut bytes = Vec::new();
            e.read_to_end(&mut bytes).expect("read");
            (e.name().to_string(), bytes)
        })
        .collect()
}

fn tar_entries(r: impl Read) -> BTreeMap<String, Vec<u8>> {
    let mut t = tar::Archive::new(r);
    t.entries()
        .expect("entries")
        .map(|e| {
            let mut e = e.expect("entry");
            let name = e.path().expect("path").display().to_string();
            let mut bytes = Vec::new();
            e.read_to_end(&mut bytes).expect("read");
            (name, bytes)
        })
        .collect()
}

#[test]
fn a_version_is_assembled_through_its_inventory_in_each_container() {
    let root = tempfile::tempdir().expect("tempdir");
    let target = two_versions(root.path(), "t1");
    let out = tempfile::tempdir().expect("tempdir");
    let dir = "ark++99999+fk4asm/v2";

    // The latest, full, as zip: a.txt's content is v1's (deduplicated).
    let zip_path = out.path().join("full.zip");
    let (done, _) = assemble(
        &target,
        ARK,
        None,
        Content::Full,
        Container::Zip,
        File::create(&zip_path).expect("create"),
    )
    .expect("assembled");
    assert_eq!((done.version, done.files), (2, 3));
    let z = zip_entries(&zip_path);
    assert_eq!(
        z[&format!("{dir}/producer/a.txt")],
        b"same in both versions"
    );
    assert_eq!(z[&format!("{dir}/producer/c.txt")], vec![7u8; 300_000]);
    assert_eq!(z[&format!("{dir}/system/mrt-erc.txt")], b"erc: v2");
    let manifest =
        String::from_utf8(z[&format!("{dir}/manifest-sha512.txt")].clone()).expect("utf-8");
    assert_eq!(manifest.lines().count(), 3, "{manifest}");
    assert!(!z.keys().any(|k| k.ends_with("b.txt")), "{:?}", z.keys());

    // Version 1, producer files only, as tar and tar.gz.
    for container in [Container::Tar, Container::TarGz] {
        let path = out.path().join(format!("v1.{}", container.extension()));
        assemble(
            &target,
            ARK,
            Some(1),
            Content::Producer,
            container,
            File::create(&path).expect("create"),
        )
        .expect("assembled");
        let file = File::open(&path).expect("open");
        let entries = if container == Container::TarGz {
            tar_entries(flate2::read::GzDecoder::new(file))
        } else {
            tar_entries(file)
        };
        let names: Vec<&str> = entries.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "ark++99999+fk4asm/v1/manifest-sha512.txt",
                "ark++99999+fk4asm/v1/producer/a.txt",
                "ark++99999+fk4asm/v1/producer/b.txt",
            ]
        );
        assert_eq!(
            entries["ark++99999+fk4asm/v1/producer/b.txt"],
            b"only in v1"
        );
    }
}

#[test]
fn a_changed_byte_fails_naming_the_file_and_the_next_target_is_used() {
    let one = tempfile::tempdir().expect("tempdir");
    let two = tempfile::tempdir().expect("tempdir");
    let targets = [
        two_versions(one.path(), "first"),
        two_versions(two.path(), "second"),
    ];
    // Change one byte of a.txt's content (v1's, which v2 shares) in the
    // first target.
    let content = targets[0]
        .version_content(ARK, Some(2))
        .expect("content")
        .files
        .into_iter()
        .find(|f| f.logical_path == "producer/a.txt")
        .expect("a.txt");
    let mut bytes = std::fs::read(&content.path).expect("read");
    bytes[0] ^= 1;
    std::fs::write(&content.path, bytes).expect("write");

    let out = tempfile::tempdir().expect("tempdir");
    let dest = out.path().join("c.zip");
    let err = assemble(
        &targets[0],
        ARK,
        None,
        Content::Producer,
        Container::Zip,
        File::create(&dest).expect("create"),
    )
    .expect_err("a mismatch");
    let message = err.to_string();
    assert!(
        message.contains("first") && message.contains("producer/a.txt"),
        "{message}"
    );

    let request = Request {
        ark: ARK,
        version: None,
        content: Content::Producer,
        container: Container::Zip,
        bag: false,
    };
    let told = std::sync::Mutex::new(Vec::new());
    let observe = |p: &Progress| told.lock().expect("told").push(p.clone());
    let (done, failures) = assemble_from_any(&targets, &request, &dest, Some(&observe));
    let (done, digest) = done.expect("the second target");
    // The observer heard each target from its start, and the second one
    // to the end of what it packed.
    let told = told.into_inner().expect("told");
    assert_eq!(
        told.first(),
        Some(&Progress {
            target: "first".into(),
            files: 0,
            bytes: 0
        })
    );
    let second: Vec<&Progress> = told.iter().filter(|p| p.target == "second").collect();
    assert_eq!(second.first().map(|p| (p.files, p.bytes)), Some((0, 0)));
    assert_eq!(
        second.last().map(|p| (p.files, p.bytes)),
        Some((done.files as u64, done.bytes)),
        "{told:?}"
    );
    assert!(
        second.windows(2).all(|w| w[0].bytes <= w[1].bytes),
        "{told:?}"
    );
    assert_eq!(done.target, "second");
    // A zip's writer seeks back, so its digest is read from the file.
    assert!(digest.read_back);
    assert_eq!(digest, file_digest(&dest, true));
    assert_eq!(failures.len(), 1);
    assert!(matches!(&failures[0], AssembleError::Mismatch { target, .. } if target == "first"));
    assert_eq!(
        zip_entries(&dest)["ark++99999+fk4asm/v2/producer/a.txt"],
        b"same in both versions"
    );
    // With the first target only, it fails and leaves no file.
    let tar = Request {
        container: Container::Tar,
        ..request
    };
    let (alone, _) = assemble_from_any(&targets[..1], &tar, &dest, None);
    assert!(matches!(alone, Err(AssembleError::Mismatch { .. })));
    assert!(!dest.exists());
}

/// The size and SHA-256 of `path`, read through `sha256sum`'s equal, the
/// project's digest of a file.
fn file_digest(path: &std::path::Path, read_back: bool) -> ContainerDigest {
    let (size, digests) =
        crate::digest::digest_file(path, &[crate::digest::Algorithm::Sha256]).expect("digest");
    ContainerDigest {
        size,
        sha256: digests.into_iter().next().map(|(_, h)| h).expect("sha256"),
        read_back,
    }
}

/// A tar and a tar.gz are hashed as they are written (no second read), and
/// the digest is the file's.
#[test]
fn a_tar_container_is_hashed_as_it_is_written() {
    let root = tempfile::tempdir().expect("tempdir");
    let targets = [two_versions(root.path(), "only")];
    for container in [Container::Tar, Container::TarGz] {
        let out = tempfile::tempdir().expect("tempdir");
        let dest = out.path().join("c");
        let request = Request {
            ark: ARK,
            version: None,
            content: Content::Full,
            container,
            bag: false,
        };
        let (done, _) = assemble_from_any(&targets, &request, &dest, None);
        let (done, digest) = done.expect("assembled");
        assert_eq!(done.target, "only");
        assert!(!digest.read_back, "{container:?} was read again");
        assert_eq!(digest, file_digest(&dest, false), "{container:?}");
    }
}

/// Large files are read and hashed ahead on threads of their own (the
/// next while one is written): every byte of each still reaches the
/// container in order, and a changed byte in the last MiB of one is still
/// found, naming the file, and fails over to the next target.
#[test]
fn large_files_read_ahead_are_packed_whole_and_a_changed_byte_is_found() {
    let big = |seed: u8, len: usize| -> Vec<u8> {
        (0..len)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[0] ^ seed)
            .collect()
    };
    let files: Vec<(String, Vec<u8>)> = vec![
        ("producer/big1.bin".into(), big(1, 5 << 20)),
        (
            "producer/small.txt".into(),
            b"between the large ones".to_vec(),
        ),
        ("producer/big2.bin".into(), big(2, (6 << 20) + 12_345)),
        ("producer/big3.bin".into(), big(3, 4 << 20)),
    ];
    let roots = [
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    ];
    let targets: Vec<OcflTarget> = roots
        .iter()
        .zip(["first", "second"])
        .map(|(root, name)| {
            let target = OcflTarget::open_or_init(name, root.path()).expect("target");
            let source = tempfile::tempdir().expect("tempdir");
            for (path, bytes) in &files {
                write(source.path(), &[(path.as_str(), bytes.as_slice())]);
            }
            target
                .store_version(ARK, source.path(), &meta())
                .expect("v1");
            target
        })
        .collect();
    // One byte of big2, in its last MiB, changed in the first target.
    let stored = targets[0]
        .version_content(ARK, Some(1))
        .expect("content")
        .files
        .into_iter()
        .find(|f| f.logical_path == "producer/big2.bin")
        .expect("big2");
    let mut bytes = std::fs::read(&stored.path).expect("read");
    let last = bytes.len() - 100;
    bytes[last] ^= 0x40;
    std::fs::write(&stored.path, bytes).expect("write");

    let out = tempfile::tempdir().expect("tempdir");
    let dest = out.path().join("c.tar");
    let request = Request {
        ark: ARK,
        version: None,
        content: Content::Producer,
        container: Container::Tar,
        bag: false,
    };
    let (done, failures) = assemble_from_any(&targets, &request, &dest, None);
    let (done, _) = done.expect("the second target");
    assert_eq!(done.target, "second");
    assert!(
        matches!(&failures[..], [AssembleError::Mismatch { target, path, .. }] if target == "first" && path == "producer/big2.bin"),
        "{failures:?}"
    );
    let entries = tar_entries(File::open(&dest).expect("open"));
    for (path, bytes) in &files {
        let name = format!("ark++99999+fk4asm/v1/{path}");
        assert!(entries.get(&name) == Some(bytes), "{name} differs");
    }
    assert_eq!(
        done.bytes,
        files.iter().map(|f| f.1.len() as u64).sum::<u64>()
    );
}

/// Stores the files of `source` into `target` as the worker does: every
/// file's SHA-512 and SHA-256 given, copied (so the inventory gets the
/// SHA-256 as fixity).
fn store_as_the_worker(target: &OcflTarget, source: &Path) {
    let mut sha512 = BTreeMap::new();
    let mut sha256 = BTreeMap::new();
    let mut todo = vec![source.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).expect("list") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                todo.push(path);
                continue;
            }
            let logical = path
                .strip_prefix(source)
                .expect("inside")
                .to_string_lossy()
                .into_owned();
            let (_, d) = crate::digest::digest_file(&path, &[Algorithm::Sha256, Algorithm::Sha512])
                .expect("digest");
            sha256.insert(logical.clone(), d[0].1.clone());
            sha512.insert(logical, d[1].1.clone());
        }
    }
    let unchanged = std::collections::BTreeSet::new();
    let checks = crate::ocfl::Checks {
        sha512: &sha512,
        sha256: &sha256,
        unchanged: &unchanged,
    };
    target
        .store_checked_with(ARK, source, &meta(), false, &checks)
        .expect("stored");
}

/// The inventory of `target`'s object, edited by `edit` and written back
/// (its sidecar left as it was: the reader does not look at it).
fn edit_inventory(target: &OcflTarget, edit: impl FnOnce(&mut serde_json::Value)) {
    let file = target
        .version_content(ARK, None)
        .expect("content")
        .files
        .into_iter()
        .next()
        .expect("a file");
    // <object>/v1/content/<logical>: the object's root is above `v1`.
    let mut root = file.path.as_path();
    while root.file_name().is_some_and(|n| n != "v1") {
        root = root.parent().expect("parent");
    }
    let path = root.parent().expect("object").join("inventory.json");
    let mut inventory: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("json");
    edit(&mut inventory);
    std::fs::write(&path, serde_json::to_vec(&inventory).expect("json")).expect("write");
}

#[test]
fn a_file_is_checked_against_the_inventorys_sha256_fixity_when_it_has_one() {
    let root = tempfile::tempdir().expect("tempdir");
    let target = OcflTarget::open_or_init("fixity", root.path()).expect("target");
    let big: Vec<u8> = (0..(5u32 << 20)).map(|i| (i % 251) as u8).collect();
    let source = tempfile::tempdir().expect("tempdir");
    write(
        source.path(),
        &[("producer/a.txt", b"read here"), ("producer/big.bin", &big)],
    );
    store_as_the_worker(&target, source.path());
    let files = target.version_content(ARK, None).expect("content").files;
    // Every file has the SHA-256 of its bytes as fixity.
    for f in &files {
        let (_, d) = crate::digest::digest_file(&f.path, &[Algorithm::Sha256]).expect("digest");
        assert_eq!(f.fixity_sha256.as_deref(), Some(d[0].1.as_str()), "{f:?}");
        assert_eq!(Check::of(f, Algorithm::Sha512).algorithm, Algorithm::Sha256);
    }
    assert!(target.verify(ARK).expect("verify").ok);
    let out = tempfile::tempdir().expect("tempdir");
    let assemble_tar = || {
        assemble(
            &target,
            ARK,
            None,
            Content::Producer,
            Container::Tar,
            File::create(out.path().join("c.tar")).expect("create"),
        )
    };
    let (done, _) = assemble_tar().expect("assembled");
    assert_eq!(done.bytes, big.len() as u64 + 9);

    // A wrong SHA-256 in the fixity block fails the file (small, read
    // here; large, read ahead) though its SHA-512 is right: the fixity is
    // what was checked.
    let mut original = serde_json::Value::Null;
    edit_inventory(&target, |inv| original = inv.clone());
    for (logical, wrong) in [("producer/a.txt", "ab"), ("producer/big.bin", "cd")] {
        let wrong = wrong.repeat(32);
        let content_path = format!("v1/content/{logical}");
        edit_inventory(&target, |inv| {
            *inv = original.clone();
            let block = inv["fixity"]["sha256"].as_object_mut().expect("block");
            block.retain(|_, paths| paths[0] != content_path.as_str());
            block.insert(wrong.clone(), serde_json::json!([content_path]));
        });
        let err = assemble_tar().expect_err("a mismatch");
        match err {
            AssembleError::Mismatch {
                path,
                algorithm,
                expected,
                ..
            } => assert_eq!(
                (path.as_str(), algorithm.as_str(), expected.as_str()),
                (logical, "sha256", wrong.as_str())
            ),
            other => panic!("{other}"),
        }
    }

    // Fixity that is not a SHA-256 (a short digest, another algorithm) is
    // passed over: the manifest's SHA-512 is checked instead.
    edit_inventory(&target, |inv| {
        inv["fixity"] = serde_json::json!({
            "sha256": {"abc": ["v1/content/producer/a.txt"]},
            "md5": {"0123456789abcdef0123456789abcdef": ["v1/content/producer/big.bin"]},
        });
    });
    let files = target.version_content(ARK, None).expect("content").files;
    assert!(files.iter().all(|f| f.fixity_sha256.is_none()), "{files:?}");
    assemble_tar().expect("checked against the SHA-512");
    // And a changed byte is still found, by the SHA-512.
    let a = files
        .iter()
        .find(|f| f.logical_path == "producer/a.txt")
        .expect("a");
    std::fs::write(&a.path, b"read hare").expect("write");
    match assemble_tar().expect_err("a mismatch") {
        AssembleError::Mismatch { algorithm, .. } => assert_eq!(algorithm, "sha512"),
        other => panic!("{other}"),
    }
}
