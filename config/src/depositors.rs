//! Per-depositor tokens: a file of `NAME TOKEN COLLECTION…` lines, so each
//! depositor sees and submits only to its own collections, and what it
//! submits is recorded as `depositor:NAME`, bound to the token presented.
//!
//! The file is named by `tokens.depositors_file`, `--depositors-file` or
//! `INGEST_DEPOSITORS_FILE` (flag and environment win over the file). One
//! depositor per line: the name, the token and one or more collection
//! (profile) names, separated by white space; blank lines and lines
//! starting with `#` are skipped. Names are 1–64 characters of
//! `A-Z a-z 0-9 . _ -`; tokens follow the rules of every other token and
//! must differ from every other token; a collection is a profile name (a
//! ZooKeeper path segment without white space). The file is at most
//! [`MAX_DEPOSITORS_FILE_BYTES`]. The shared depositor token
//! (`tokens.depositor_file`) keeps working and still sees every collection:
//! without this file nothing changes.

use std::collections::BTreeSet;
use std::io::Read;
use std::path::Path;

use crate::admins::NamedLines;
use crate::*;

/// The most depositors one file may list.
pub const MAX_DEPOSITORS: usize = 1000;

/// The most collections one depositor may have.
pub const MAX_DEPOSITOR_COLLECTIONS: usize = 1000;

/// The longest collection name, in bytes (as the engine's profile check).
pub const MAX_COLLECTION_BYTES: usize = 200;

/// The largest depositors file read, in bytes.
pub const MAX_DEPOSITORS_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// The name the shared depositor token would take; not a name the file may
/// use, so a recorded `depositor:depositor` is never ambiguous.
pub const SHARED_DEPOSITOR_NAME: &str = "depositor";

/// One depositor with a token of its own and the collections it owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedDepositor {
    /// The depositor's name, recorded as `depositor:NAME`.
    pub name: String,
    /// Its bearer token.
    pub token: Secret,
    /// The collections (profile names) it may submit to and see.
    pub collections: BTreeSet<String>,
}

/// Whether `name` may be a collection in the depositors file.
pub fn valid_collection_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_COLLECTION_BYTES
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c == ',' || c.is_whitespace() || c.is_control())
}

/// Reads a depositors file (see the module's documentation), at most
/// [`MAX_DEPOSITORS_FILE_BYTES`]. Messages name the file and the line,
/// never a token.
pub(crate) fn read_depositors(
    path: &Path,
    origin: &Origin,
) -> Result<Vec<NamedDepositor>, ConfigError> {
    let read_error = |source| ConfigError::Read {
        what: "depositors file",
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let mut text = String::new();
    file.take(MAX_DEPOSITORS_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(read_error)?;
    if text.len() as u64 > MAX_DEPOSITORS_FILE_BYTES {
        return Err(invalid(
            origin,
            "tokens.depositors_file",
            format!("the file is larger than {MAX_DEPOSITORS_FILE_BYTES} bytes"),
        ));
    }
    parse_depositors(&text, origin)
}

pub(crate) fn parse_depositors(
    text: &str,
    origin: &Origin,
) -> Result<Vec<NamedDepositor>, ConfigError> {
    let lines = NamedLines {
        field: "tokens.depositors_file",
        who: "depositor",
        usage: "give one depositor per line: NAME TOKEN COLLECTION [COLLECTION…]",
        reserved: (
            SHARED_DEPOSITOR_NAME,
            "`depositor` is the shared depositor token's name; choose another",
        ),
        max: MAX_DEPOSITORS,
        columns: 1..=MAX_DEPOSITOR_COLLECTIONS,
    };
    let mut out = Vec::new();
    for line in lines.parse(text, origin)? {
        let field = format!("tokens.depositors_file line {}", line.number);
        let mut collections = BTreeSet::new();
        for (n, c) in line.rest.into_iter().enumerate() {
            if !valid_collection_name(&c) {
                return Err(invalid(
                    origin,
                    &field,
                    format!(
                        "collection {} is not a profile name (1-{MAX_COLLECTION_BYTES} bytes, no '/', ',', white space or control characters, not '.' or '..')",
                        n + 1
                    ),
                ));
            }
            if !collections.insert(c) {
                return Err(invalid(
                    origin,
                    &field,
                    format!("collection {} is listed twice", n + 1),
                ));
            }
        }
        out.push(NamedDepositor {
            name: line.name,
            token: line.token,
            collections,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depositors_files_are_parsed_and_checked() {
        let o = Origin::Named("t".into());
        let ok = parse_depositors(
            "# who\nlib-a  a-token-0123456789 demo  other\n\nlib-b\tb-token-0123456789 b_coll\n",
            &o,
        )
        .expect("parse");
        assert_eq!(ok.len(), 2);
        assert_eq!(ok[0].name, "lib-a");
        assert_eq!(
            ok[0].collections.iter().collect::<Vec<_>>(),
            ["demo", "other"]
        );
        assert!(ok[1].token.matches(b"b-token-0123456789"));
        for (bad, line) in [
            ("a a-token-0123456789", "line 1"),
            ("a", "line 1"),
            ("# c\n\nal/ice a-token-0123456789 demo", "line 3"),
            ("depositor a-token-0123456789 demo", "line 1"),
            ("a short demo", "line 1"),
            ("a a-token-0123456789 de/mo", "line 1"),
            ("a a-token-0123456789 ..", "line 1"),
            ("a a-token-0123456789 x,y", "line 1"),
            ("a a-token-0123456789 x x", "line 1"),
            ("a a-token-0123456789 x\na b-token-0123456789 y", "line 2"),
            ("a a-token-0123456789 x\nb a-token-0123456789 y", "line 2"),
        ] {
            let e = parse_depositors(bad, &o).expect_err(bad).to_string();
            assert!(!e.contains("token-0123456789"), "{e} shows a token");
            assert!(e.contains(line), "{e} does not name {line}");
        }
        let long = format!("a a-token-0123456789 {}", "c".repeat(201));
        assert!(parse_depositors(&long, &o).is_err());
        let many: String = (0..=MAX_DEPOSITORS)
            .map(|i| format!("d{i} token-number-{i:08}-xyz c\n"))
            .collect();
        let e = parse_depositors(&many, &o)
            .expect_err("too many")
            .to_string();
        assert!(e.contains("more than 1000 depositors"), "{e}");
    }

    #[test]
    fn a_depositors_file_is_bounded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("depositors");
        let line = "a a-token-0123456789 demo\n";
        let mut text = String::from(line);
        text.push_str(&"#".repeat(MAX_DEPOSITORS_FILE_BYTES as usize));
        std::fs::write(&path, text).expect("write");
        let e = read_depositors(&path, &Origin::Named("t".into()))
            .expect_err("too big")
            .to_string();
        assert!(e.contains("larger than"), "{e}");
    }
}
