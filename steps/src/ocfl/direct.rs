//! Writing a new object's first version directly, with digests the caller
//! already has.
//!
//! rocfl builds every version as an object of its own in staging (its
//! directories, its inventory), reads every file for its SHA-512, then
//! moves the version into the object. For the common ingest case, a new
//! object whose files were hashed as they were downloaded, that is a
//! second SHA-512 pass over every byte and about twice the directories:
//! under `tools/load --mode real` the worker spent more CPU in ext4's
//! directory allocation and in SHA-512 than in anything else.
//!
//! [`write_v1`] instead builds the finished object (namaste file,
//! `inventory.json` and its sidecar at the root and in `v1/`, the content
//! under `v1/content/`) in a directory of the target's own staging, moving
//! the files in by rename, and renames the whole object into its place in
//! the storage layout: either the object is there, complete, or it is not.
//! The inventory's SHA-512 are the caller's, computed as the bytes
//! arrived; before anything moves, each file the caller does not vouch for
//! (by its [`crate::stamp::FileStamp`], in [`super::Checks::unchanged`]) is
//! read once for its SHA-256 ([`check_sha256`]), so a file that changed on
//! disk since it was hashed still fails the store, naming it, at about half
//! the CPU of a second SHA-512 (SHA-256 runs on the CPU's SHA extensions). The caller then
//! validates the object's structure (rocfl's validator reads the inventory
//! and its sidecar and checks every content path).
//!
//! [`write_next`] adds a later version the same way: the new version
//! directory (its `content/` holding only the files whose digest the
//! object does not hold yet, its inventory) is built in staging and
//! renamed into the object, then the root's sidecar and `inventory.json`
//! are replaced (each written aside and renamed), the inventory last: that
//! rename is the commit. rocfl's update path resolves every file of the
//! staged version with `content_path_for_digest`, which walks every
//! content path of the file's digest, so a version of N files sharing a
//! few contents costs N² steps (issue 25, finding 2); here each file is
//! one map lookup. A store that stopped between the two renames left a
//! version directory the inventory does not name, and perhaps a sidecar
//! that no longer matches: the next store of the ark (under the same
//! per-ark lock) removes the one and restores the other from the head
//! version's own copy, before it writes anything.
//!
//! Every target but the first gets copies, not the source's files
//! ([`Bring::Copy`]: no two targets share a file): each file the version
//! stores is copied into the build with its SHA-512 computed from the
//! bytes as they are copied, and a file that is not the caller's SHA-512
//! fails the store before anything is committed; rocfl's copy path was as
//! super-linear as its update path.
//!
//! Every content file a direct write adds gets the caller's SHA-256 in
//! the inventory's `fixity` block ([`FIXITY`]), which an access assembly
//! checks instead of the SHA-512 (about twice as fast here). rocfl's full
//! check (`verify`) then computes both digests of every such file.
//!
//! Only OCFL 1.1 roots and objects are written this way, SHA-512 objects
//! with plain version names (`v2`, not `v002`) and no extensions; any
//! other object goes through rocfl.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

use chrono::SecondsFormat;
use rocfl::ocfl::{LayoutExtensionName, StorageLayout};
use serde::Serialize;
use sha2::{Digest, Sha512};

use super::{check_stopping, io_error, unusable, Checks, StorageError, StoredFile, VersionMeta};

/// Reads every file of `files` under `source_dir` that is not in
/// `checks.unchanged` for its SHA-256 and compares it with `checks.sha256`.
///
/// # Errors
///
/// [`StorageError::DigestMismatch`] naming every file that differs or has
/// no expected SHA-256; [`StorageError::Io`] when one cannot be read.
pub(super) fn check_sha256<'f>(
    ark: &str,
    source_dir: &Path,
    files: impl IntoIterator<Item = &'f StoredFile>,
    checks: &Checks<'_>,
) -> Result<(), StorageError> {
    let mut problems = Vec::new();
    for file in files {
        if checks.unchanged.contains(&file.logical_path) {
            continue;
        }
        let path = source_dir.join(&file.logical_path);
        let (_, digests) = crate::digest::digest_file(&path, &[crate::digest::Algorithm::Sha256])
            .map_err(|e| io_error(&path, e))?;
        let actual = digests
            .into_iter()
            .next()
            .map(|(_, hex)| hex)
            .unwrap_or_default();
        match checks.sha256.get(&file.logical_path) {
            Some(want) if want.eq_ignore_ascii_case(&actual) => {}
            Some(want) => problems.push(format!(
                "{} has SHA-256 {actual} on disk, not {want}",
                file.logical_path
            )),
            None => problems.push(format!("{} has no expected SHA-256", file.logical_path)),
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    Err(StorageError::DigestMismatch {
        ark: ark.to_string(),
        problems,
    })
}

/// The storage root's layout, read from `ocfl_layout.json` and the
/// extension's `config.json`; `None` when the root is not OCFL 1.1 or its
/// layout cannot be read (the caller then stores through rocfl).
pub(super) fn layout_of(root: &Path) -> Option<StorageLayout> {
    if !root.join("0=ocfl_1.1").is_file() {
        return None;
    }
    #[derive(serde::Deserialize)]
    struct LayoutFile {
        extension: LayoutExtensionName,
    }
    let bytes = fs::read(root.join("ocfl_layout.json")).ok()?;
    let name = serde_json::from_slice::<LayoutFile>(&bytes).ok()?.extension;
    let config = fs::read(
        root.join("extensions")
            .join(name.to_string())
            .join("config.json"),
    )
    .ok();
    StorageLayout::new(name, config.as_deref()).ok()
}

/// The inventory, as OCFL 1.1 §3.5 has it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Inventory<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    digest_algorithm: &'static str,
    head: &'static str,
    content_directory: &'static str,
    manifest: BTreeMap<&'a str, Vec<String>>,
    versions: BTreeMap<&'static str, Version<'a>>,
    /// `sha256` → digest → content paths (OCFL 1.1 §3.5.4), from the
    /// caller's SHA-256: the assembler checks a file against it (see
    /// [`FIXITY`]).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    fixity: BTreeMap<&'static str, BTreeMap<String, Vec<String>>>,
}

/// The fixity algorithm every direct write records for the content it
/// adds: each file's SHA-256 as the caller computed it in the same pass as
/// its SHA-512 (and checked it before the commit, or copied bytes of that
/// very SHA-512). An access assembly checks a file against it rather than
/// the manifest's SHA-512: SHA-256 runs on the CPU's SHA extensions at
/// about twice SHA-512's speed (issue 24).
pub(crate) const FIXITY: &str = "sha256";

/// The caller's SHA-256 of `logical_path`, lower-case, when it has one
/// that is one (64 hexadecimal digits).
fn fixity_of(checks: &Checks<'_>, logical_path: &str) -> Option<String> {
    checks
        .sha256
        .get(logical_path)
        .filter(|d| crate::digest::Algorithm::Sha256.is_digest(d))
        .map(|d| d.to_ascii_lowercase())
}

#[derive(Serialize)]
struct Version<'a> {
    created: String,
    state: BTreeMap<&'a str, Vec<&'a str>>,
    message: &'a str,
    user: User<'a>,
}

#[derive(Serialize)]
struct User<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    address: Option<&'a str>,
}

/// Where a direct write builds an object and where it puts it.
pub(super) struct Place<'a> {
    /// The storage root.
    pub root: &'a Path,
    /// The object's directory under `root`, as the storage layout maps it.
    pub object_root: &'a str,
    /// Where the object is built first (in the target's own staging).
    pub build: &'a Path,
    /// How long the half-built object waits before it moves into place
    /// (zero but in tests that kill the process mid-store).
    pub pause: std::time::Duration,
    /// Whether the source's files are moved in or copied.
    pub bring: Bring,
    /// What the caller knows of the files (their digests, and which are
    /// unchanged since they were hashed).
    pub checks: &'a Checks<'a>,
}

/// How a direct write takes each file from the source directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Bring {
    /// By rename: no byte is written (the first target, on the source's
    /// file system). The caller checked every file's SHA-256 first
    /// ([`check_sha256`]).
    Move,
    /// By copy, each file's SHA-512 computed from the bytes as they are
    /// copied and compared with the caller's before anything is committed
    /// (every further target: no two targets share a file). A file the
    /// version records without copying (its content already held) is
    /// checked as for a move ([`check_sha256`]).
    Copy,
}

/// Writes version 1 of object `ark` at `place` from `files` (logical path,
/// SHA-512, size), each moved from `source_dir/<logical path>`.
///
/// # Errors
///
/// [`StorageError::Io`] when the disk fails; [`StorageError::UnusableRoot`]
/// when something already occupies the object's directory. On every error
/// the build directory is removed; the files already moved into it go with
/// it, so the caller's source is to be rebuilt before a retry (as after a
/// failed rocfl move).
pub(super) fn write_v1(
    place: &Place<'_>,
    ark: &str,
    source_dir: &Path,
    files: &[StoredFile],
    meta: &VersionMeta,
) -> Result<PathBuf, StorageError> {
    let (root, build) = (place.root, place.build);
    let target = root.join(place.object_root);
    if fs::symlink_metadata(&target).is_ok() {
        return Err(unusable(
            &target,
            "the object's directory exists, but holds no object rocfl can read",
        ));
    }
    let written = build_object(place, ark, source_dir, files, meta).and_then(|()| {
        hold(place.pause, ark)?;
        check_stopping(ark)?;
        let parent = target.parent().unwrap_or(root);
        fs::create_dir_all(parent).map_err(|e| io_error(parent, e))?;
        fs::rename(build, &target).map_err(|e| io_error(&target, e))
    });
    if let Err(e) = written {
        if let Err(cleanup) = fs::remove_dir_all(build) {
            if cleanup.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(dir = %build.display(), error = %cleanup, "cannot remove a half-built OCFL object");
            }
        }
        return Err(e);
    }
    Ok(target)
}

fn build_object(
    place: &Place<'_>,
    ark: &str,
    source_dir: &Path,
    files: &[StoredFile],
    meta: &VersionMeta,
) -> Result<(), StorageError> {
    let build = place.build;
    let content = build.join("v1").join("content");
    fs::create_dir_all(&content).map_err(|e| io_error(&content, e))?;
    let mut manifest: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut state: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut sha256: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for file in files {
        bring_in(place.bring, ark, source_dir, &content, file)?;
        let content_path = format!("v1/content/{}", file.logical_path);
        if let Some(digest) = fixity_of(place.checks, &file.logical_path) {
            sha256.entry(digest).or_default().push(content_path.clone());
        }
        manifest.entry(&file.sha512).or_default().push(content_path);
        state
            .entry(&file.sha512)
            .or_default()
            .push(&file.logical_path);
    }
    let inventory = Inventory {
        id: ark,
        kind: "https://ocfl.io/1.1/spec/#inventory",
        digest_algorithm: "sha512",
        head: "v1",
        content_directory: "content",
        manifest,
        versions: BTreeMap::from([("v1", version_of(meta, state))]),
        fixity: if sha256.is_empty() {
            BTreeMap::new()
        } else {
            BTreeMap::from([(FIXITY, sha256)])
        },
    };
    let json = serde_json::to_vec(&inventory).map_err(|e| encoding(ark, e))?;
    let sidecar = sidecar(&json);
    for dir in [build, &build.join("v1")] {
        write(&dir.join("inventory.json"), &json)?;
        write(&dir.join("inventory.json.sha512"), sidecar.as_bytes())?;
    }
    write(&build.join("0=ocfl_object_1.1"), b"ocfl_object_1.1\n")
}

/// Adds version `head + 1` to the object at `place` (which holds `head`)
/// from `files`, each not already held by the object moved from
/// `source_dir/<logical path>`; a file whose digest the object holds is
/// recorded in the new state only (OCFL's deduplication) and left where it
/// is. `Ok(None)` when the object is not one this writer takes (see the
/// module's documentation): nothing was touched, and the caller stores
/// through rocfl.
///
/// # Errors
///
/// [`StorageError::Io`] when the disk fails. An error before the commit
/// leaves the object at `head` (the next store cleans what was left); the
/// files already moved are gone from `source_dir`, so the caller's source
/// is to be rebuilt before a retry.
pub(super) fn write_next(
    place: &Place<'_>,
    ark: &str,
    source_dir: &Path,
    files: &[StoredFile],
    meta: &VersionMeta,
    head: u32,
) -> Result<Option<u32>, StorageError> {
    let object = place.root.join(place.object_root);
    let Some(mut inventory) = held_inventory(&object, head)? else {
        return Ok(None);
    };
    let version = head + 1;
    let name = format!("v{version}");
    let orphan = object.join(&name);
    if fs::symlink_metadata(&orphan).is_ok() {
        tracing::warn!(ark, version, "removing a version directory its inventory does not name (a store stopped before its commit)");
        fs::remove_dir_all(&orphan).map_err(|e| io_error(&orphan, e))?;
    }
    let build = place.build;
    let built = build_version(place, ark, &mut inventory, &name, source_dir, files, meta);
    let written = built.and_then(|json| {
        hold(place.pause, ark)?;
        check_stopping(ark)?;
        fs::rename(build, &orphan).map_err(|e| io_error(&orphan, e))?;
        replace(&object, "inventory.json.sha512", sidecar(&json).as_bytes())?;
        replace(&object, "inventory.json", &json)
    });
    if let Err(e) = written {
        for dir in [build, orphan.as_path()] {
            if let Err(cleanup) = fs::remove_dir_all(dir) {
                if cleanup.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(dir = %dir.display(), error = %cleanup, "cannot remove a half-built OCFL version");
                }
            }
        }
        return Err(e);
    }
    Ok(Some(version))
}

/// The root inventory of the object at `object` as JSON, when it is one
/// [`write_next`] takes and its head is `head`; a sidecar left stale by a
/// store that stopped before its commit is restored first.
fn held_inventory(object: &Path, head: u32) -> Result<Option<serde_json::Value>, StorageError> {
    if !object.join("0=ocfl_object_1.1").is_file() || object.join("extensions").exists() {
        return Ok(None);
    }
    let path = object.join("inventory.json");
    let bytes = fs::read(&path).map_err(|e| io_error(&path, e))?;
    let Ok(inventory) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return Ok(None);
    };
    let head_name = format!("v{head}");
    let takes = inventory["type"] == "https://ocfl.io/1.1/spec/#inventory"
        && inventory["digestAlgorithm"] == "sha512"
        && inventory["head"] == head_name.as_str()
        && inventory["versions"].get(&head_name).is_some()
        && inventory["manifest"]
            .as_object()
            .is_some_and(|m| m.keys().all(|d| !d.bytes().any(|b| b.is_ascii_uppercase())))
        && inventory["contentDirectory"]
            .as_str()
            .is_none_or(|c| !c.is_empty() && !c.contains('/'));
    if !takes {
        return Ok(None);
    }
    let sidecar_path = object.join("inventory.json.sha512");
    let recorded = fs::read_to_string(&sidecar_path).unwrap_or_default();
    if recorded != sidecar(&bytes) {
        // Only a sidecar our own store left stale is restored: the head
        // version's copy of the inventory must be this very inventory.
        let copy = object.join(&head_name).join("inventory.json");
        if fs::read(&copy).ok().as_deref() != Some(bytes.as_slice()) {
            return Ok(None);
        }
        replace(object, "inventory.json.sha512", sidecar(&bytes).as_bytes())?;
    }
    Ok(Some(inventory))
}

/// Builds version `name` in `build` (its new content and its inventory)
/// and adds it to `inventory`, whose encoding is returned.
fn build_version(
    place: &Place<'_>,
    ark: &str,
    inventory: &mut serde_json::Value,
    name: &str,
    source_dir: &Path,
    files: &[StoredFile],
    meta: &VersionMeta,
) -> Result<Vec<u8>, StorageError> {
    let build = place.build;
    let content_dir = inventory["contentDirectory"]
        .as_str()
        .unwrap_or("content")
        .to_string();
    let content = build.join(&content_dir);
    fs::create_dir_all(&content).map_err(|e| io_error(&content, e))?;
    let manifest = inventory["manifest"]
        .as_object_mut()
        .ok_or_else(|| unusable(build, "the inventory has no manifest"))?;
    let mut added: HashSet<&str> = HashSet::new();
    let mut state: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut recorded_only = Vec::new();
    for file in files {
        let digest = file.sha512.as_str();
        if !manifest.contains_key(digest) && added.insert(digest) {
            bring_in(place.bring, ark, source_dir, &content, file)?;
        } else {
            recorded_only.push(file);
        }
        state.entry(digest).or_default().push(&file.logical_path);
    }
    if place.bring == Bring::Copy {
        // Never read by the copy: checked as a move checks every file.
        check_sha256(ark, source_dir, recorded_only, place.checks)?;
    }
    let mut sha256: Vec<(String, String)> = Vec::new();
    for file in files {
        if added.remove(file.sha512.as_str()) {
            let content_path = format!("{name}/{content_dir}/{}", file.logical_path);
            if let Some(digest) = fixity_of(place.checks, &file.logical_path) {
                sha256.push((digest, content_path.clone()));
            }
            manifest.insert(file.sha512.clone(), serde_json::json!([content_path]));
        }
    }
    add_fixity(inventory, sha256);
    let version = serde_json::to_value(version_of(meta, state)).map_err(|e| encoding(name, e))?;
    let versions = inventory["versions"]
        .as_object_mut()
        .ok_or_else(|| unusable(build, "the inventory has no versions"))?;
    versions.insert(name.to_string(), version);
    inventory["head"] = serde_json::Value::from(name);
    let json = serde_json::to_vec(inventory).map_err(|e| encoding(name, e))?;
    write(&build.join("inventory.json"), &json)?;
    write(
        &build.join("inventory.json.sha512"),
        sidecar(&json).as_bytes(),
    )?;
    Ok(json)
}

/// Adds `entries` (SHA-256, content path) to the inventory's `sha256`
/// fixity block, made when the inventory has none; an inventory whose
/// `fixity` or `fixity.sha256` is not an object (written by another tool)
/// is left as it is.
fn add_fixity(inventory: &mut serde_json::Value, entries: Vec<(String, String)>) {
    if entries.is_empty() {
        return;
    }
    let Some(object) = inventory.as_object_mut() else {
        return;
    };
    let fixity = object
        .entry("fixity")
        .or_insert_with(|| serde_json::json!({}));
    let Some(block) = fixity
        .as_object_mut()
        .map(|f| f.entry(FIXITY).or_insert_with(|| serde_json::json!({})))
        .and_then(|b| b.as_object_mut())
    else {
        return;
    };
    for (digest, content_path) in entries {
        let paths = block.entry(digest).or_insert_with(|| serde_json::json!([]));
        if let Some(paths) = paths.as_array_mut() {
            paths.push(serde_json::Value::from(content_path));
        }
    }
}

/// Moves or copies (as `bring` says) the source file of `file` into a
/// version's `content` directory (its parent directories made), unless the
/// process is stopping. A copy's SHA-512, computed from the bytes as they
/// are copied, must be `file.sha512`.
fn bring_in(
    bring: Bring,
    ark: &str,
    source_dir: &Path,
    content: &Path,
    file: &StoredFile,
) -> Result<(), StorageError> {
    let logical_path = &file.logical_path;
    let to = content.join(logical_path);
    if let Some(parent) = to.parent().filter(|p| *p != content) {
        fs::create_dir_all(parent).map_err(|e| io_error(parent, e))?;
    }
    check_stopping(ark)?;
    let from = source_dir.join(logical_path);
    match bring {
        Bring::Move => fs::rename(&from, &to).map_err(|e| io_error(&from, e)),
        Bring::Copy => {
            let actual = copy_hashed(&from, &to)?;
            if actual.eq_ignore_ascii_case(&file.sha512) {
                return Ok(());
            }
            Err(StorageError::DigestMismatch {
                ark: ark.to_string(),
                problems: vec![format!(
                    "{logical_path} has SHA-512 {actual} as copied, not {}",
                    file.sha512
                )],
            })
        }
    }
}

/// Copies `from` to the new file `to` in chunks of at most 1 MiB and returns the
/// SHA-512 of the bytes copied (lower-case hexadecimal).
fn copy_hashed(from: &Path, to: &Path) -> Result<String, StorageError> {
    use crate::digest::{Algorithm, HashingWriter};
    use std::io::{Read, Write};
    let mut source = fs::File::open(from).map_err(|e| io_error(from, e))?;
    let target = fs::File::create_new(to).map_err(|e| io_error(to, e))?;
    let mut out = HashingWriter::new(target, &[Algorithm::Sha512]);
    // No larger than the file: most files of a deep object are small.
    let size = source.metadata().map_err(|e| io_error(from, e))?.len();
    let mut chunk = vec![0u8; usize::try_from(size.clamp(1, 1 << 20)).unwrap_or(1 << 20)];
    loop {
        let n = match source.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_error(from, e)),
        };
        out.write_all(&chunk[..n]).map_err(|e| io_error(to, e))?;
    }
    let (_, _, digests) = out.finish();
    Ok(digests
        .into_iter()
        .next()
        .map(|(_, hex)| hex)
        .unwrap_or_default())
}

/// The OCFL version record of `meta` with `state`.
fn version_of<'a>(meta: &'a VersionMeta, state: BTreeMap<&'a str, Vec<&'a str>>) -> Version<'a> {
    Version {
        created: meta.created.to_rfc3339_opts(SecondsFormat::AutoSi, true),
        state,
        message: &meta.message,
        user: User {
            name: &meta.user_name,
            address: meta.user_address.as_deref(),
        },
    }
}

fn encoding(what: &str, e: serde_json::Error) -> StorageError {
    StorageError::Io {
        context: format!("encoding the inventory of {what}"),
        source: std::io::Error::other(e),
    }
}

/// The sidecar of an inventory encoded as `json`.
fn sidecar(json: &[u8]) -> String {
    format!("{}  inventory.json\n", hex::encode(Sha512::digest(json)))
}

/// Replaces `dir/name` with `bytes`: written aside, then renamed over it.
fn replace(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), StorageError> {
    let aside = dir.join(format!(".{name}.new"));
    write(&aside, bytes)?;
    let path = dir.join(name);
    fs::rename(&aside, &path).map_err(|e| io_error(&path, e))
}

/// Waits `pause` (tests only: a store held half built), ending early with
/// [`StorageError::Stopped`] when the process stops.
fn hold(pause: std::time::Duration, ark: &str) -> Result<(), StorageError> {
    let until = std::time::Instant::now() + pause;
    loop {
        check_stopping(ark)?;
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        std::thread::sleep(left.min(std::time::Duration::from_millis(50)));
    }
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), StorageError> {
    fs::write(path, bytes).map_err(|e| io_error(path, e))
}
