//! The storage manifest of an object version: the checkm 0.7 file Merritt's
//! storage service reads to fetch and record every file of a version.
//!
//! The same manifest serves a new object and a new version of an existing
//! one: Merritt's storage service tells them apart by the request (add or
//! update, the update carrying its own list of deletions), not by the
//! manifest, whose profile is `mrt-add-manifest` in both cases.
//!
//! The checkm format has no escape for its `|` separator or for line
//! breaks, so a value containing one is refused rather than written.
//!
//! ```
//! use ingest_steps::digest::Algorithm;
//! use ingest_steps::storage_manifest::{render, ManifestFile};
//!
//! let file = ManifestFile {
//!     url: "http://ingest.example/1/producer/a.txt".into(),
//!     algorithm: Algorithm::Md5,
//!     digest: "900150983cd24fb0d6963f7d28e17f72".into(),
//!     size: 3,
//!     last_modified: None,
//!     name: "producer/a.txt".into(),
//!     mime_type: Some("text/plain".into()),
//! };
//! let text = render(&[file]).unwrap();
//! assert!(text.ends_with(
//!     "\nhttp://ingest.example/1/producer/a.txt | md5 | 900150983cd24fb0d6963f7d28e17f72 | 3 |  | producer/a.txt | text/plain\n#%eof\n"
//! ));
//! ```

use chrono::{DateTime, SecondsFormat, Utc};

use crate::digest::Algorithm;

/// The profile of a storage add manifest.
pub const PROFILE: &str = "http://uc3.cdlib.org/registry/store/manifest/mrt-add-manifest";

/// The header lines, each ending in a line feed.
///
/// The MIME type column is `mrt:mimeType`, as in Merritt's published
/// ingest manifests: the NFO ontology has no MIME type term.
pub const HEADER: &str = "#%checkm_0.7\n\
#%profile | http://uc3.cdlib.org/registry/store/manifest/mrt-add-manifest\n\
#%prefix | mrt: | http://merritt.cdlib.org/terms#\n\
#%prefix | nfo: | http://www.semanticdesktop.org/ontologies/2007/03/22/nfo#\n\
#%fields | nfo:fileUrl | nfo:hashAlgorithm | nfo:hashValue | nfo:fileSize | nfo:fileLastModified | nfo:fileName | mrt:mimeType\n";

/// The last line.
pub const EOF_LINE: &str = "#%eof\n";

/// One file of a version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestFile {
    /// Where the storage service fetches the file.
    pub url: String,
    /// The algorithm of `digest`.
    pub algorithm: Algorithm,
    /// The digest, hexadecimal in either case (written in lower case).
    pub digest: String,
    /// The size in bytes.
    pub size: u64,
    /// The modification time, written as `2024-05-01T12:00:00+00:00`.
    pub last_modified: Option<DateTime<Utc>>,
    /// The file's path within the version, e.g. `producer/data.csv`.
    pub name: String,
    /// The MIME type, if known.
    pub mime_type: Option<String>,
}

/// Why a manifest could not be written. Every variant names the file.
///
/// ### Handling
/// All are problems of the input, not of I/O: retrying gives the same
/// answer. Fail the job with the message; the depositor (or the step that
/// built the list) has to change the file name, URL or digest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestError {
    /// A value is empty, contains `|`, a line break or another control
    /// character, or has leading or trailing whitespace (which checkm
    /// readers trim): checkm cannot carry it.
    ///
    /// ### Handling
    /// Fail the job: the file has to be renamed or served from another URL.
    #[error(
        "file {file:?}: the {field} {value:?} cannot be written in a checkm manifest: {reason}"
    )]
    Unrepresentable {
        /// The file's name (its URL if the name is empty).
        file: String,
        /// The column: `url`, `name` or `mime type`.
        field: &'static str,
        /// The value as given.
        value: String,
        /// What makes it unrepresentable.
        reason: &'static str,
    },

    /// The digest is not hexadecimal of the algorithm's length.
    ///
    /// ### Handling
    /// Fail the job: the step that computed the digest has a bug, or the
    /// declared digest is wrong.
    #[error("file {file:?}: {algorithm} digest {digest:?} is not {} hexadecimal characters", algorithm.hex_len())]
    BadDigest {
        /// The file's name.
        file: String,
        /// The algorithm named for it.
        algorithm: Algorithm,
        /// The digest as given.
        digest: String,
    },

    /// Two files have the same name.
    ///
    /// ### Handling
    /// Fail the job: a version holds one file per name.
    #[error("file {name:?} is listed more than once")]
    DuplicateName {
        /// The repeated name.
        name: String,
    },
}

/// The manifest text: the header, one line per file sorted by name (byte
/// order), and `#%eof`. The same files give the same bytes in any order.
///
/// # Errors
/// See [`ManifestError`]; nothing is written for a list with an error.
pub fn render(files: &[ManifestFile]) -> Result<String, ManifestError> {
    render_inner(files, None)
}

/// [`render`], with one comment line (`# COMMENT`, which checkm readers
/// skip) after the header: `ingest` names the job that stored a version
/// there, so a version committed by an earlier run of the same job is
/// recognised whatever its URLs.
///
/// # Errors
/// See [`ManifestError`]; a comment that is empty, has a line break or
/// another control character is [`ManifestError::Unrepresentable`].
pub fn render_with_comment(files: &[ManifestFile], comment: &str) -> Result<String, ManifestError> {
    render_inner(files, Some(comment))
}

/// The comment line of a manifest made by [`render_with_comment`] (without
/// `# `), if it has one: the first `#` line after the header that is not
/// a `#%` directive.
pub fn comment_of(text: &str) -> Option<&str> {
    text.lines()
        .take_while(|l| !l.starts_with(EOF_LINE.trim_end()))
        .find(|l| l.starts_with("# "))
        .map(|l| &l[2..])
}

/// The URL of a stored file in Merritt's storage form,
/// `BASE/content/NODE/ARK/VERSION/FILE` (mrt-store's `content` route), with
/// the ark and the file name percent-encoded as one path segment each
/// (`ark%3A%2F99999%2Ffk4x`, `producer%2Fa.txt`). `base` is used without
/// a trailing `/`.
pub fn content_url(base: &str, node: u32, ark: &str, version: u32, name: &str) -> String {
    format!(
        "{}/content/{node}/{}/{version}/{}",
        base.trim_end_matches('/'),
        encode_segment(ark),
        encode_segment(name)
    )
}

/// Percent-encodes every byte but RFC 3986's unreserved characters.
pub use ingest_protocol::encode_segment;

fn render_inner(files: &[ManifestFile], comment: Option<&str>) -> Result<String, ManifestError> {
    let mut sorted: Vec<&ManifestFile> = files.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let duplicate = sorted.windows(2).find_map(|pair| match pair {
        [a, b] if a.name == b.name => Some(a.name.clone()),
        _ => None,
    });
    if let Some(name) = duplicate {
        return Err(ManifestError::DuplicateName { name });
    }
    let mut out = String::from(HEADER);
    if let Some(comment) = comment {
        let reason = if comment.trim().is_empty() {
            Some("it is empty")
        } else if comment.chars().any(char::is_control) {
            Some("it contains a line break or another control character")
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(ManifestError::Unrepresentable {
                file: "(comment)".into(),
                field: "comment",
                value: ingest_protocol::cut(comment, 200).to_string(),
                reason,
            });
        }
        out.push_str("# ");
        out.push_str(comment);
        out.push('\n');
    }
    for file in sorted {
        out.push_str(&line(file)?);
        out.push('\n');
    }
    out.push_str(EOF_LINE);
    Ok(out)
}

/// One file's line, without the line feed.
fn line(file: &ManifestFile) -> Result<String, ManifestError> {
    check_value(file, "url", &file.url, true)?;
    check_value(file, "name", &file.name, true)?;
    let mime = file.mime_type.as_deref().unwrap_or("");
    check_value(file, "mime type", mime, false)?;
    let digest = checked_digest(file)?;
    let modified = file
        .last_modified
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Secs, false))
        .unwrap_or_default();
    Ok([
        file.url.as_str(),
        file.algorithm.name(),
        &digest,
        &file.size.to_string(),
        &modified,
        &file.name,
        mime,
    ]
    .join(" | "))
}

fn check_value(
    file: &ManifestFile,
    field: &'static str,
    value: &str,
    required: bool,
) -> Result<(), ManifestError> {
    let reason = if value.is_empty() {
        required.then_some("it is empty")
    } else if value.contains('|') {
        Some("it contains the column separator '|'")
    } else if value.contains(['\n', '\r']) {
        Some("it contains a line break")
    } else if value.chars().any(char::is_control) {
        Some("it contains a control character")
    } else if value.trim() != value {
        Some("it has leading or trailing whitespace")
    } else {
        None
    };
    match reason {
        None => Ok(()),
        Some(reason) => Err(ManifestError::Unrepresentable {
            file: file_label(file),
            field,
            value: value.to_string(),
            reason,
        }),
    }
}

/// The digest in lower case, once checked.
fn checked_digest(file: &ManifestFile) -> Result<String, ManifestError> {
    let d = &file.digest;
    if file.algorithm.is_digest(d) {
        return Ok(d.to_ascii_lowercase());
    }
    Err(ManifestError::BadDigest {
        file: file_label(file),
        algorithm: file.algorithm,
        digest: d.clone(),
    })
}

/// How errors name a file: by name, or by URL when the name is empty.
fn file_label(file: &ManifestFile) -> String {
    if file.name.is_empty() {
        file.url.clone()
    } else {
        file.name.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str) -> ManifestFile {
        ManifestFile {
            url: content_url("http://h:1/", 9501, "ark:/99999/fk4x", 2, name),
            algorithm: Algorithm::Sha256,
            digest: "ab".repeat(32),
            size: 3,
            last_modified: None,
            name: name.into(),
            mime_type: None,
        }
    }

    #[test]
    fn content_urls_are_merritts_form() {
        assert_eq!(
            content_url(
                "http://h:1/",
                9501,
                "ark:/99999/fk4x",
                2,
                "producer/a b|c.txt"
            ),
            "http://h:1/content/9501/ark%3A%2F99999%2Ffk4x/2/producer%2Fa%20b%7Cc.txt"
        );
        assert_eq!(encode_segment("é~-._"), "%C3%A9~-._");
    }

    #[test]
    fn a_comment_names_the_job_after_the_header() {
        let text = render_with_comment(&[file("producer/a.txt")], "ingest job jid1 of batch bid1")
            .expect("rendered");
        assert!(text.starts_with(HEADER), "{text}");
        assert_eq!(
            &text[HEADER.len()..],
            "# ingest job jid1 of batch bid1\nhttp://h:1/content/9501/ark%3A%2F99999%2Ffk4x/2/producer%2Fa.txt | sha256 | abababababababababababababababababababababababababababababababab | 3 |  | producer/a.txt | \n#%eof\n"
        );
        assert_eq!(comment_of(&text), Some("ingest job jid1 of batch bid1"));
        assert_eq!(comment_of(&render(&[file("a")]).expect("plain")), None);
        for bad in ["", "  ", "two\nlines", "tab\there"] {
            assert!(
                matches!(
                    render_with_comment(&[file("a")], bad),
                    Err(ManifestError::Unrepresentable {
                        field: "comment",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
    }
}
