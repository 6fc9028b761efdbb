//! Bounded container extraction: zips, tars and tar.gz files built here,
//! honest and hostile.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use flate2::write::GzEncoder;
use flate2::Compression;
use ingest_steps::container::{extract, ContainerError, ExtractLimits, ExtractedFile};
use ingest_steps::paths::PathError;
use tar::{EntryType, Header};
use zip::write::SimpleFileOptions;
use zip::CompressionMethod;

const MIB: u64 = 1024 * 1024;

/// A zip entry to write: a directory (name ending in `/`) or a file.
enum ZipEntry<'a> {
    File(&'a str, &'a [u8]),
    Dir(&'a str),
    Symlink(&'a str, &'a str),
}

fn write_zip(path: &Path, entries: &[ZipEntry<'_>]) {
    let mut zip = zip::ZipWriter::new(File::create(path).expect("create zip"));
    let deflated = SimpleFileOptions::default().compression_method(CompressionMethod::Deflated);
    for entry in entries {
        match entry {
            ZipEntry::File(name, data) => {
                zip.start_file(*name, deflated).expect("start file");
                zip.write_all(data).expect("write");
            }
            ZipEntry::Dir(name) => zip.add_directory(*name, deflated).expect("add dir"),
            ZipEntry::Symlink(name, target) => zip
                .add_symlink(*name, *target, deflated)
                .expect("add symlink"),
        }
    }
    zip.finish().expect("finish zip");
}

/// A tar header for a regular file whose name is written raw, bypassing the
/// tar crate's own checks (it refuses `..` and absolute paths).
fn raw_header(name: &[u8], kind: EntryType, size: u64) -> Header {
    let mut header = Header::new_ustar();
    header.as_old_mut().name[..name.len()].copy_from_slice(name);
    header.set_entry_type(kind);
    header.set_size(size);
    header.set_mode(0o644);
    header.set_cksum();
    header
}

fn tar_bytes(entries: &[(Header, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (header, data) in entries {
        builder.append(header, *data).expect("append");
    }
    builder.into_inner().expect("finish tar")
}

fn file_header(name: &str, size: usize) -> Header {
    raw_header(name.as_bytes(), EntryType::Regular, size as u64)
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
    encoder.write_all(bytes).expect("gzip");
    encoder.finish().expect("gzip finish")
}

struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Self {
        Setup {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn dest(&self) -> PathBuf {
        self.path("out")
    }

    fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let path = self.path(name);
        fs::write(&path, bytes).expect("write archive");
        path
    }

    fn extract(&self, archive: &Path) -> Result<Vec<ExtractedFile>, ContainerError> {
        extract(archive, &self.dest(), &ExtractLimits::default())
    }

    fn extract_with(
        &self,
        archive: &Path,
        limits: ExtractLimits,
    ) -> Result<Vec<ExtractedFile>, ContainerError> {
        extract(archive, &self.dest(), &limits)
    }

    /// Every regular file under the temporary directory, except the archives
    /// themselves: what extraction left on disk, anywhere.
    fn files_on_disk(&self) -> Vec<(String, u64)> {
        let mut found = Vec::new();
        walk(&self.dest(), &self.dest(), &mut found);
        found.sort();
        found
    }

    fn bytes_on_disk(&self) -> u64 {
        self.files_on_disk().iter().map(|(_, size)| size).sum()
    }

    fn read(&self, name: &str) -> Vec<u8> {
        fs::read(self.dest().join(name)).expect("read extracted file")
    }
}

fn walk(root: &Path, dir: &Path, found: &mut Vec<(String, u64)>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let entry = entry.expect("dir entry");
        let meta = fs::symlink_metadata(entry.path()).expect("metadata");
        if meta.is_dir() {
            walk(root, &entry.path(), found);
        } else {
            let name = entry
                .path()
                .strip_prefix(root)
                .expect("under root")
                .to_owned();
            found.push((name.to_string_lossy().into_owned(), meta.len()));
        }
    }
}

fn names(files: &[ExtractedFile]) -> Vec<(&str, u64)> {
    files.iter().map(|f| (f.name.as_str(), f.size)).collect()
}

// ------------------------------------------------------------ honest archives

#[test]
fn zip_with_nested_directories() {
    let setup = Setup::new();
    let archive = setup.path("object.zip");
    write_zip(
        &archive,
        &[
            ZipEntry::Dir("data/"),
            ZipEntry::Dir("data/sub/"),
            ZipEntry::File("data/sub/deep.txt", b"deep"),
            ZipEntry::File("top.txt", b"top level"),
            ZipEntry::File("implicit/dir/file.bin", &[0, 1, 2, 3]),
            ZipEntry::Dir("empty/"),
        ],
    );
    let files = setup.extract(&archive).unwrap();
    assert_eq!(
        names(&files),
        vec![
            ("data/sub/deep.txt", 4),
            ("top.txt", 9),
            ("implicit/dir/file.bin", 4)
        ]
    );
    assert_eq!(files[0].path, setup.dest().join("data/sub/deep.txt"));
    assert_eq!(setup.read("data/sub/deep.txt"), b"deep");
    assert_eq!(setup.read("implicit/dir/file.bin"), [0, 1, 2, 3]);
    assert!(setup.dest().join("empty").is_dir());
}

#[test]
fn tar_and_tar_gz_with_nested_directories() {
    let mut dir = Header::new_ustar();
    dir.set_path("./").unwrap();
    dir.set_entry_type(EntryType::Directory);
    dir.set_size(0);
    dir.set_cksum();
    let mut sub = Header::new_ustar();
    sub.set_path("./a/b/").unwrap();
    sub.set_entry_type(EntryType::Directory);
    sub.set_size(0);
    sub.set_cksum();
    let long = format!("a/b/{}.txt", "x".repeat(150));
    let mut long_header = Header::new_gnu();
    long_header.set_size(4);
    long_header.set_mode(0o644);
    let mut builder = tar::Builder::new(Vec::new());
    builder.append(&dir, &[][..]).unwrap();
    builder.append(&sub, &[][..]).unwrap();
    builder
        .append(&file_header("./a/b/c.txt", 5), &b"hello"[..])
        .unwrap();
    // The builder writes a GNU long-name entry for a path over 100 bytes.
    builder
        .append_data(&mut long_header, &long, &b"long"[..])
        .unwrap();
    builder
        .append(&file_header("empty.txt", 0), &[][..])
        .unwrap();
    let bytes = builder.into_inner().unwrap();

    for (name, bytes) in [("object.tar", bytes.clone()), ("object.tgz", gzip(&bytes))] {
        let setup = Setup::new();
        let files = setup.extract(&setup.write(name, &bytes)).unwrap();
        assert_eq!(
            names(&files),
            vec![("a/b/c.txt", 5), (long.as_str(), 4), ("empty.txt", 0)],
            "{name}"
        );
        assert_eq!(setup.read("a/b/c.txt"), b"hello");
        assert_eq!(setup.read(&long), b"long");
    }
}

#[test]
fn empty_archives_give_no_files() {
    let setup = Setup::new();
    let zip = setup.path("empty.zip");
    write_zip(&zip, &[]);
    assert_eq!(setup.extract(&zip).unwrap(), vec![]);
    let tar = setup.write("empty.tar", &tar_bytes(&[]));
    assert_eq!(setup.extract(&tar).unwrap(), vec![]);
    let tgz = setup.write("empty.tgz", &gzip(&tar_bytes(&[])));
    assert_eq!(setup.extract(&tgz).unwrap(), vec![]);
    assert!(setup.dest().is_dir());
}

#[test]
fn unknown_formats_are_refused_naming_the_file() {
    let setup = Setup::new();
    for (name, bytes) in [
        ("notes.zip", &b"just some text, not a zip"[..]),
        ("nothing.tar", &b""[..]),
        ("short", &b"PK"[..]),
    ] {
        let path = setup.write(name, bytes);
        match setup.extract(&path) {
            Err(ContainerError::UnknownFormat { path: reported }) => assert_eq!(reported, path),
            other => panic!("{name}: {other:?}"),
        }
    }
    let error = setup.extract(&setup.path("notes.zip")).unwrap_err();
    assert!(error
        .to_string()
        .ends_with("notes.zip is not a zip, tar or tar.gz container"));
}

// ------------------------------------------------------------ hostile names

#[test]
fn parent_components_are_refused_and_nothing_escapes() {
    let setup = Setup::new();
    let tar = tar_bytes(&[
        (file_header("fine.txt", 2), b"ok"),
        (file_header("../evil.txt", 4), b"evil"),
    ]);
    let error = setup.extract(&setup.write("evil.tar", &tar)).unwrap_err();
    match error {
        ContainerError::UnsafeName { name, reason } => {
            assert_eq!(name, "../evil.txt");
            assert_eq!(
                reason,
                PathError::ParentComponent {
                    name: "../evil.txt".into()
                }
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(!setup.path("evil.txt").exists());
    assert_eq!(setup.files_on_disk(), vec![("fine.txt".to_owned(), 2)]);

    let setup = Setup::new();
    let zip = setup.path("evil.zip");
    write_zip(&zip, &[ZipEntry::File("a/../../evil.txt", b"evil")]);
    assert!(matches!(
        setup.extract(&zip),
        Err(ContainerError::UnsafeName {
            reason: PathError::ParentComponent { .. },
            ..
        })
    ));
    assert!(!setup.path("evil.txt").exists());
}

#[test]
fn absolute_names_are_refused() {
    let setup = Setup::new();
    let tar = tar_bytes(&[(file_header("/tmp/evil.txt", 4), b"evil")]);
    match setup.extract(&setup.write("abs.tar", &tar)).unwrap_err() {
        ContainerError::UnsafeName { name, reason } => {
            assert_eq!(name, "/tmp/evil.txt");
            assert_eq!(
                reason,
                PathError::Absolute {
                    name: "/tmp/evil.txt".into()
                }
            );
        }
        other => panic!("{other:?}"),
    }
    let zip = setup.path("abs.zip");
    write_zip(&zip, &[ZipEntry::File("C:/Windows/evil.txt", b"evil")]);
    assert!(matches!(
        setup.extract(&zip),
        Err(ContainerError::UnsafeName {
            reason: PathError::Absolute { .. },
            ..
        })
    ));
    let zip = setup.path("backslash.zip");
    write_zip(&zip, &[ZipEntry::File("dir\\file.txt", b"x")]);
    assert!(matches!(
        setup.extract(&zip),
        Err(ContainerError::UnsafeName {
            reason: PathError::Backslash { .. },
            ..
        })
    ));
    assert_eq!(setup.files_on_disk(), vec![]);
}

#[test]
fn links_and_special_entries_are_refused() {
    let cases = [
        (EntryType::Symlink, "symbolic link"),
        (EntryType::Link, "hard link"),
        (EntryType::Char, "character device"),
        (EntryType::Block, "block device"),
        (EntryType::Fifo, "FIFO"),
    ];
    for (kind, expected) in cases {
        let setup = Setup::new();
        let mut link = raw_header(b"link", kind, 0);
        if matches!(kind, EntryType::Symlink | EntryType::Link) {
            link.set_link_name("/etc/passwd").unwrap();
            link.set_cksum();
        }
        let tar = tar_bytes(&[(link, b"")]);
        match setup.extract(&setup.write("link.tar", &tar)).unwrap_err() {
            ContainerError::SpecialEntry { name, kind } => {
                assert_eq!((name.as_str(), kind), ("link", expected));
            }
            other => panic!("{expected}: {other:?}"),
        }
        assert!(fs::symlink_metadata(setup.dest().join("link")).is_err());
    }

    let setup = Setup::new();
    let zip = setup.path("link.zip");
    write_zip(
        &zip,
        &[
            ZipEntry::File("a.txt", b"a"),
            ZipEntry::Symlink("link", "/etc/passwd"),
        ],
    );
    match setup.extract(&zip).unwrap_err() {
        ContainerError::SpecialEntry { name, kind } => {
            assert_eq!((name.as_str(), kind), ("link", "symbolic link"));
        }
        other => panic!("{other:?}"),
    }
    assert!(fs::symlink_metadata(setup.dest().join("link")).is_err());
}

#[test]
fn duplicate_names_are_refused() {
    let setup = Setup::new();
    let tar = tar_bytes(&[
        (file_header("a.txt", 1), b"1"),
        (file_header("./a.txt", 1), b"2"),
    ]);
    match setup.extract(&setup.write("dup.tar", &tar)).unwrap_err() {
        ContainerError::DuplicateName { name } => assert_eq!(name, "a.txt"),
        other => panic!("{other:?}"),
    }
    // The first copy is not overwritten.
    assert_eq!(setup.read("a.txt"), b"1");

    // The zip writer refuses duplicates: write two names, then rename one
    // in place (in the local header and in the central directory).
    let setup = Setup::new();
    let zip = setup.path("dup.zip");
    write_zip(
        &zip,
        &[ZipEntry::File("a.txt", b"1"), ZipEntry::File("b.txt", b"2")],
    );
    let bytes = fs::read(&zip).unwrap();
    let renamed = replace_all(&bytes, b"b.txt", b"a.txt");
    let zip = setup.write("dup2.zip", &renamed);
    match setup.extract(&zip).unwrap_err() {
        ContainerError::DuplicateName { name } => assert_eq!(name, "a.txt"),
        other => panic!("{other:?}"),
    }
    assert_eq!(setup.files_on_disk(), vec![], "refused before writing");
}

#[test]
fn a_name_used_as_file_and_directory_clashes() {
    let setup = Setup::new();
    let tar = tar_bytes(&[(file_header("a", 1), b"1"), (file_header("a/b", 1), b"2")]);
    match setup.extract(&setup.write("clash.tar", &tar)).unwrap_err() {
        ContainerError::NameClash { name, path } => {
            assert_eq!(name, "a/b");
            assert_eq!(path, setup.dest().join("a"));
        }
        other => panic!("{other:?}"),
    }
}

fn replace_all(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let mut out = bytes.to_vec();
    let mut i = 0;
    while i + from.len() <= out.len() {
        if &out[i..i + from.len()] == from {
            out[i..i + from.len()].copy_from_slice(to);
            i += from.len();
        } else {
            i += 1;
        }
    }
    out
}

// ------------------------------------------------------------ limits

#[test]
fn too_many_entries() {
    let limits = ExtractLimits {
        max_entries: 10,
        ..ExtractLimits::default()
    };
    let setup = Setup::new();
    let zip = setup.path("many.zip");
    let names: Vec<String> = (0..11).map(|i| format!("f{i:02}.txt")).collect();
    let entries: Vec<ZipEntry<'_>> = names
        .iter()
        .map(|n| ZipEntry::File(n.as_str(), b"x"))
        .collect();
    write_zip(&zip, &entries);
    assert!(matches!(
        setup.extract_with(&zip, limits),
        Err(ContainerError::TooManyEntries { limit: 10 })
    ));
    // A zip's entries are counted from its central directory, before
    // anything is written.
    assert_eq!(setup.files_on_disk(), vec![]);

    let setup = Setup::new();
    let headers: Vec<(Header, &[u8])> = names
        .iter()
        .map(|n| (file_header(n, 1), &b"x"[..]))
        .collect();
    let tar = setup.write("many.tar", &tar_bytes(&headers));
    let error = setup.extract_with(&tar, limits).unwrap_err();
    assert_eq!(
        error.to_string(),
        "the container has more than 10 entries (max_entries)"
    );
    assert_eq!(setup.files_on_disk().len(), 10);

    // Exactly at the limit is fine.
    let setup = Setup::new();
    let tar = setup.write("ten.tar", &tar_bytes(&headers[..10]));
    assert_eq!(setup.extract_with(&tar, limits).unwrap().len(), 10);
}

/// 20 MiB of zeros deflate to about 20 KiB. Built once: deflating takes
/// seconds in a debug build.
fn zip_bomb(setup: &Setup) -> PathBuf {
    static BOMB: OnceLock<Vec<u8>> = OnceLock::new();
    let bytes = BOMB.get_or_init(|| {
        let zeros = vec![0u8; 20 * MIB as usize];
        let build = Setup::new();
        let zip = build.path("bomb.zip");
        write_zip(
            &zip,
            &[
                ZipEntry::File("small.txt", b"hi"),
                ZipEntry::File("zeros.bin", &zeros),
            ],
        );
        fs::read(&zip).expect("read bomb")
    });
    assert!(bytes.len() < 100 * 1024, "{} bytes", bytes.len());
    setup.write("bomb.zip", bytes)
}

#[test]
fn a_zip_bomb_stops_at_the_total_limit() {
    let setup = Setup::new();
    let zip = zip_bomb(&setup);
    let limits = ExtractLimits {
        max_total_bytes: MIB,
        ..ExtractLimits::default()
    };
    match setup.extract_with(&zip, limits).unwrap_err() {
        ContainerError::TotalBytesExceeded { limit } => assert_eq!(limit, MIB),
        other => panic!("{other:?}"),
    }
    // A write that would cross the limit is refused whole.
    let on_disk = setup.bytes_on_disk();
    assert!(on_disk <= MIB, "{on_disk} bytes written");
    assert!(on_disk > MIB - 64 * 1024, "{on_disk} bytes written");
}

#[test]
fn a_zip_bomb_stops_at_the_entry_limit_and_the_ratio() {
    let setup = Setup::new();
    let zip = zip_bomb(&setup);
    // The default ratio would stop it first.
    let limits = ExtractLimits {
        max_entry_bytes: 2 * MIB,
        max_ratio: u64::MAX,
        ..ExtractLimits::default()
    };
    match setup.extract_with(&zip, limits).unwrap_err() {
        ContainerError::EntryBytesExceeded { name, limit } => {
            assert_eq!((name.as_str(), limit), ("zeros.bin", 2 * MIB))
        }
        other => panic!("{other:?}"),
    }
    assert!(setup.bytes_on_disk() <= 2 * MIB + 2);

    let setup = Setup::new();
    let zip = zip_bomb(&setup);
    let limits = ExtractLimits {
        max_ratio: 100,
        ..ExtractLimits::default()
    };
    match setup.extract_with(&zip, limits).unwrap_err() {
        ContainerError::RatioExceeded { name, limit } => {
            assert_eq!((name.as_str(), limit), ("zeros.bin", 100))
        }
        other => panic!("{other:?}"),
    }
    // The ratio is checked once the entry has produced more than 1 MiB,
    // against the compressed bytes actually consumed.
    let on_disk = setup.bytes_on_disk();
    assert!(on_disk > MIB && on_disk < 2 * MIB, "{on_disk}");
}

#[test]
fn the_default_ratio_catches_deflated_zeros() {
    // Deflate cannot do much better than 1032:1, and zeros come close.
    let setup = Setup::new();
    let zip = zip_bomb(&setup);
    match setup.extract(&zip).unwrap_err() {
        ContainerError::RatioExceeded { name, limit } => {
            assert_eq!((name.as_str(), limit), ("zeros.bin", 1000))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_tar_gz_bomb_stops_at_the_limits() {
    let zeros = vec![0u8; 20 * MIB as usize];
    let tar = tar_bytes(&[(file_header("zeros.bin", zeros.len()), &zeros)]);
    let setup = Setup::new();
    let tgz = setup.write("bomb.tgz", &gzip(&tar));
    let limits = ExtractLimits {
        max_total_bytes: MIB,
        ..ExtractLimits::default()
    };
    assert!(matches!(
        setup.extract_with(&tgz, limits),
        Err(ContainerError::TotalBytesExceeded { limit }) if limit == MIB
    ));
    assert!(setup.bytes_on_disk() <= MIB);

    let setup = Setup::new();
    let tgz = setup.write("bomb.tgz", &gzip(&tar));
    let limits = ExtractLimits {
        max_ratio: 100,
        ..ExtractLimits::default()
    };
    assert!(matches!(
        setup.extract_with(&tgz, limits),
        Err(ContainerError::RatioExceeded { limit: 100, .. })
    ));
}

#[test]
fn a_plain_tar_is_not_a_ratio_problem() {
    let data = vec![7u8; 3 * MIB as usize];
    let setup = Setup::new();
    let tar = setup.write(
        "big.tar",
        &tar_bytes(&[(file_header("big.bin", data.len()), &data)]),
    );
    let limits = ExtractLimits {
        max_ratio: 2,
        ..ExtractLimits::default()
    };
    assert_eq!(
        names(&setup.extract_with(&tar, limits).unwrap()),
        vec![("big.bin", 3 * MIB)]
    );
}

#[test]
fn a_huge_tar_long_name_is_refused() {
    // A GNU long-name entry is read into memory by the tar crate: a 2 MiB
    // one must be refused, not buffered.
    let name = vec![b'a'; 2 * MIB as usize];
    let long = raw_header(b"././@LongLink", EntryType::GNULongName, name.len() as u64);
    let setup = Setup::new();
    let tgz = setup.write(
        "long.tgz",
        &gzip(&tar_bytes(&[(long, &name), (file_header("x", 1), b"x")])),
    );
    match setup.extract(&tgz).unwrap_err() {
        ContainerError::Corrupt { message, .. } => {
            assert!(
                message.contains("bytes of tar headers and metadata"),
                "{message}"
            )
        }
        other => panic!("{other:?}"),
    }
}

// ------------------------------------------------------------ damage

#[test]
fn a_damaged_zip_entry_fails_its_crc() {
    let setup = Setup::new();
    let zip = setup.path("stored.zip");
    let mut writer = zip::ZipWriter::new(File::create(&zip).unwrap());
    let stored = SimpleFileOptions::default().compression_method(CompressionMethod::Stored);
    writer.start_file("a.txt", stored).unwrap();
    writer.write_all(b"precious content").unwrap();
    writer.finish().unwrap();
    let damaged = replace_all(&fs::read(&zip).unwrap(), b"precious", b"PRECIOUS");
    let zip = setup.write("damaged.zip", &damaged);
    match setup.extract(&zip).unwrap_err() {
        ContainerError::Corrupt { path, message } => {
            assert_eq!(path, zip);
            assert_eq!(message, "entry \"a.txt\" fails its CRC-32 check");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_truncated_tar_is_corrupt() {
    let data = vec![1u8; 10_000];
    let tar = tar_bytes(&[(file_header("a.bin", data.len()), &data)]);
    let setup = Setup::new();
    let cut = setup.write("cut.tar", &tar[..4096]);
    assert!(matches!(
        setup.extract(&cut),
        Err(ContainerError::Corrupt { .. })
    ));
}
