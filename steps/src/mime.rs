//! MIME types of stored files: a depositor's, when it is a well-formed
//! `type/subtype`, else one found from the file name's extension.
//!
//! Detection is by extension only (a fixed table of the formats archives
//! hold most; anything else is `application/octet-stream`): it is
//! predictable, reads no content and cannot be fooled into running a
//! parser on hostile bytes. A type given in the depositor's manifest
//! (`mrt:mimeType`) always wins over detection.
//!
//! ```
//! use ingest_steps::mime::{checked, detect, mime_type};
//!
//! assert_eq!(detect("data/Scan 01.TIFF"), "image/tiff");
//! assert_eq!(checked(" text/csv; charset=utf-8 "), Some("text/csv; charset=utf-8"));
//! assert_eq!(checked("text | html"), None);
//! assert_eq!(mime_type(Some("text/x-custom"), "a.txt"), "text/x-custom");
//! assert_eq!(mime_type(None, "a.txt"), "text/plain");
//! ```

/// The longest MIME type kept (RFC 6838 caps each name at 127 characters).
pub const MAX_MIME_BYTES: usize = 255;

/// The type of a file whose extension is not in the table.
pub const OCTET_STREAM: &str = "application/octet-stream";

/// Extension (lower case) → MIME type.
const TABLE: &[(&str, &str)] = &[
    ("txt", "text/plain"),
    ("text", "text/plain"),
    ("md", "text/markdown"),
    ("csv", "text/csv"),
    ("tsv", "text/tab-separated-values"),
    ("htm", "text/html"),
    ("html", "text/html"),
    ("css", "text/css"),
    ("xml", "application/xml"),
    ("json", "application/json"),
    ("yaml", "application/yaml"),
    ("yml", "application/yaml"),
    ("pdf", "application/pdf"),
    ("rtf", "application/rtf"),
    ("doc", "application/msword"),
    (
        "docx",
        "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    ),
    ("xls", "application/vnd.ms-excel"),
    (
        "xlsx",
        "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    ),
    ("ppt", "application/vnd.ms-powerpoint"),
    (
        "pptx",
        "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    ),
    ("odt", "application/vnd.oasis.opendocument.text"),
    ("ods", "application/vnd.oasis.opendocument.spreadsheet"),
    ("epub", "application/epub+zip"),
    ("zip", "application/zip"),
    ("gz", "application/gzip"),
    ("tgz", "application/gzip"),
    ("tar", "application/x-tar"),
    ("warc", "application/warc"),
    ("jpg", "image/jpeg"),
    ("jpeg", "image/jpeg"),
    ("jp2", "image/jp2"),
    ("png", "image/png"),
    ("gif", "image/gif"),
    ("tif", "image/tiff"),
    ("tiff", "image/tiff"),
    ("svg", "image/svg+xml"),
    ("webp", "image/webp"),
    ("mp3", "audio/mpeg"),
    ("wav", "audio/wav"),
    ("flac", "audio/flac"),
    ("ogg", "audio/ogg"),
    ("mp4", "video/mp4"),
    ("mov", "video/quicktime"),
    ("mkv", "video/x-matroska"),
    ("webm", "video/webm"),
    ("checkm", "text/plain"),
];

/// The type of `name` by its extension (the part after the last `.` of its
/// last path segment, any case); [`OCTET_STREAM`] when unknown.
pub fn detect(name: &str) -> &'static str {
    let base = name.rsplit('/').next().unwrap_or(name);
    let Some((stem, ext)) = base.rsplit_once('.') else {
        return OCTET_STREAM;
    };
    if stem.is_empty() {
        return OCTET_STREAM;
    }
    let ext = ext.to_ascii_lowercase();
    TABLE
        .iter()
        .find(|(e, _)| *e == ext)
        .map_or(OCTET_STREAM, |(_, t)| t)
}

/// `given`, trimmed, when it is a MIME type the storage manifest can carry:
/// `type/subtype` of RFC 6838 name characters, optionally followed by
/// `;` parameters of printable ASCII other than `|`, at most
/// [`MAX_MIME_BYTES`] bytes. `None` for anything else.
pub fn checked(given: &str) -> Option<&str> {
    let given = given.trim();
    if given.is_empty() || given.len() > MAX_MIME_BYTES {
        return None;
    }
    let (essence, params) = match given.split_once(';') {
        Some((e, p)) => (e.trim_end(), Some(p)),
        None => (given, None),
    };
    let name_ok = |s: &str| {
        !s.is_empty()
            && s.len() <= 127
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
    };
    let (top, sub) = essence.split_once('/')?;
    if !name_ok(top) || !name_ok(sub) {
        return None;
    }
    if let Some(p) = params {
        if !p.bytes().all(|b| (b' '..=b'~').contains(&b) && b != b'|') {
            return None;
        }
    }
    Some(given)
}

/// The type to store for a file named `name`: the depositor's `given` type
/// when [`checked`] keeps it, else [`detect`]'s.
pub fn mime_type(given: Option<&str>, name: &str) -> String {
    given
        .and_then(checked)
        .unwrap_or_else(|| detect(name))
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection_by_extension() {
        for (name, want) in [
            ("a.txt", "text/plain"),
            ("dir.v2/README", OCTET_STREAM),
            (".hidden", OCTET_STREAM),
            ("x/y/Photo.JPG", "image/jpeg"),
            ("archive.tar.gz", "application/gzip"),
            ("noext.", OCTET_STREAM),
        ] {
            assert_eq!(detect(name), want, "{name}");
        }
    }

    #[test]
    fn given_types_are_kept_only_when_well_formed() {
        for (given, kept) in [
            ("text/plain", true),
            ("application/vnd.api+json", true),
            ("text/plain; charset=UTF-8", true),
            ("text", false),
            ("text/", false),
            ("/plain", false),
            ("text/pl ain", false),
            ("text/plain | x", false),
            ("text/plain; a=|", false),
            ("text/plain\nX: y", false),
            ("", false),
        ] {
            assert_eq!(checked(given).is_some(), kept, "{given:?}");
        }
        let long = format!("text/{}", "x".repeat(300));
        assert_eq!(checked(&long), None);
        assert_eq!(mime_type(Some("bogus"), "a.png"), "image/png");
    }
}
