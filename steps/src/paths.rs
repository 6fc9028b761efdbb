//! Untrusted file names: the names in manifests (`nfo:fileName`, the last
//! segment of a URL) and the entry names inside containers.
//!
//! A name is accepted only when it is a plain relative path that stays below
//! the directory it is joined to, on every platform we may write it on:
//!
//! ```
//! use ingest_steps::paths::{safe_relative_path, PathError};
//! use std::path::PathBuf;
//!
//! assert_eq!(safe_relative_path("a//b/./c.txt").unwrap(), PathBuf::from("a/b/c.txt"));
//! assert!(matches!(safe_relative_path("../etc/passwd"), Err(PathError::ParentComponent { .. })));
//! ```
//!
//! The checks are lexical: they never touch the file system. A symbolic link
//! that already exists under the root can still lead elsewhere; the
//! container extraction never creates one, and the root is the caller's.

use std::path::{Component, Path, PathBuf};

/// Decodes `%XX` escapes (a URL's path segment, its user name or
/// password); `None` when the result is not UTF-8. A `%` not followed by
/// two hexadecimal digits is kept as it is, as browsers do. The one
/// decoder of the workspace.
pub fn percent_decode(text: &str) -> Option<String> {
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .ok()
        .map(std::borrow::Cow::into_owned)
}

use thiserror::Error;

/// The longest accepted path component, in bytes (the `NAME_MAX` of common
/// file systems).
pub const MAX_COMPONENT_BYTES: usize = 255;

/// The longest accepted name, in bytes, before normalization (`PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;

/// Why a name was refused. Every variant names the offending name; the
/// message says the rule.
///
/// ### Handling
/// All variants are a problem of the input, never of the system: report them
/// to whoever supplied the name (the depositor) and do not retry.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PathError {
    /// The name is empty.
    ///
    /// ### Handling
    /// Refuse the name; the depositor must give one.
    #[error("file name is empty")]
    Empty,
    /// The name names no file once `.` components and repeated or trailing
    /// separators are removed (`.`, `./`, `//`).
    ///
    /// ### Handling
    /// Refuse the name; the depositor must give a file name.
    #[error("file name {name:?} names no file once `.` and empty components are removed")]
    NoComponents {
        /// The name as given.
        name: String,
    },
    /// The name contains NUL or another control character.
    ///
    /// ### Handling
    /// Refuse the name: no file system stores such a name faithfully.
    #[error("file name {name:?} contains the control character {character:?}")]
    ControlCharacter {
        /// The name as given.
        name: String,
        /// The first control character found.
        character: char,
    },
    /// The name is absolute: it starts with `/` or `\`, or with a drive
    /// letter (`C:`).
    ///
    /// ### Handling
    /// Refuse the name; only paths relative to the object are allowed.
    #[error("file name {name:?} is absolute; only relative paths are allowed")]
    Absolute {
        /// The name as given.
        name: String,
    },
    /// The name has a `..` component, which could climb out of the directory
    /// it is joined to.
    ///
    /// ### Handling
    /// Refuse the name.
    #[error("file name {name:?} has a `..` component")]
    ParentComponent {
        /// The name as given.
        name: String,
    },
    /// The name contains a backslash.
    ///
    /// A backslash is a separator on Windows and an ordinary character on
    /// Unix, so the same name would mean different files on different
    /// systems (and `a\..\..\x` would climb on one of them). Rather than
    /// guess, such names are refused.
    ///
    /// ### Handling
    /// Refuse the name; the depositor should use `/` as the separator.
    #[error(
        "file name {name:?} contains a backslash; use `/` as the separator \
         (a backslash is a separator on Windows and a character elsewhere)"
    )]
    Backslash {
        /// The name as given.
        name: String,
    },
    /// A component is longer than [`MAX_COMPONENT_BYTES`].
    ///
    /// ### Handling
    /// Refuse the name.
    #[error("file name {name:?} has a component of {length} bytes (at most {max})", max = MAX_COMPONENT_BYTES)]
    ComponentTooLong {
        /// The name as given.
        name: String,
        /// The length of the longest offending component, in bytes.
        length: usize,
    },
    /// The name is longer than [`MAX_PATH_BYTES`].
    ///
    /// ### Handling
    /// Refuse the name.
    #[error("file name of {length} bytes is too long (at most {max}): {prefix:?}…", max = MAX_PATH_BYTES)]
    TooLong {
        /// The first 100 characters of the name.
        prefix: String,
        /// Its length in bytes.
        length: usize,
    },
    /// Joined under a root, the name would leave the root.
    ///
    /// [`safe_relative_path`] makes this impossible; the variant exists so
    /// that [`join_under`] never has to trust that.
    ///
    /// ### Handling
    /// Refuse the name, and report a bug.
    #[error("file name {name:?} leads outside {root}")]
    OutsideRoot {
        /// The name as given.
        name: String,
        /// The root it was joined to.
        root: PathBuf,
    },
}

/// Checks an untrusted name and returns it as a relative path made of
/// normal components only.
///
/// Repeated and trailing separators and `.` components are removed
/// (`a//b/` → `a/b`, `./a` → `a`).
///
/// # Errors
/// A [`PathError`] when the name is empty, contains a control character or a
/// backslash, is absolute (`/x`, `\x`, `C:x`), has a `..` component, names
/// nothing after normalization, or is too long (see [`MAX_COMPONENT_BYTES`]
/// and [`MAX_PATH_BYTES`]).
pub fn safe_relative_path(name: &str) -> Result<PathBuf, PathError> {
    Ok(components(name)?.into_iter().collect())
}

/// Like [`safe_relative_path`], but returns the normalized name as a string
/// with `/` separators, the same on every platform (`a//./b` → `a/b`).
///
/// # Errors
/// As [`safe_relative_path`].
pub fn normalized_name(name: &str) -> Result<String, PathError> {
    Ok(components(name)?.join("/"))
}

/// Joins an untrusted name under `root`: `root.join(safe_relative_path(name))`,
/// then checks that the result still starts with `root`.
///
/// The check is lexical: it does not resolve symbolic links already present
/// under `root`.
///
/// # Errors
/// As [`safe_relative_path`]; [`PathError::OutsideRoot`] if the joined path
/// would not start with `root`.
pub fn join_under(root: &Path, name: &str) -> Result<PathBuf, PathError> {
    let joined = root.join(safe_relative_path(name)?);
    if joined.starts_with(root) && joined != root {
        Ok(joined)
    } else {
        Err(PathError::OutsideRoot {
            name: name.to_owned(),
            root: root.to_path_buf(),
        })
    }
}

/// The checked, normalized components of `name`.
fn components(name: &str) -> Result<Vec<&str>, PathError> {
    check_whole_name(name)?;
    let parts: Vec<&str> = name
        .split('/')
        .filter(|part| !part.is_empty() && *part != ".")
        .collect();
    if parts.is_empty() {
        return Err(PathError::NoComponents {
            name: name.to_owned(),
        });
    }
    for part in &parts {
        check_component(name, part)?;
    }
    Ok(parts)
}

/// The rules about the name as a whole, in the order a reader would expect
/// the reasons: length first, then characters, then shape.
fn check_whole_name(name: &str) -> Result<(), PathError> {
    if name.is_empty() {
        return Err(PathError::Empty);
    }
    if name.len() > MAX_PATH_BYTES {
        return Err(PathError::TooLong {
            prefix: name.chars().take(100).collect(),
            length: name.len(),
        });
    }
    if let Some(character) = name.chars().find(|c| c.is_control()) {
        return Err(PathError::ControlCharacter {
            name: name.to_owned(),
            character,
        });
    }
    if is_absolute(name) {
        return Err(PathError::Absolute {
            name: name.to_owned(),
        });
    }
    if name.contains('\\') {
        return Err(PathError::Backslash {
            name: name.to_owned(),
        });
    }
    Ok(())
}

/// `/x`, `\x`, and a drive letter (`C:`, `C:\x`, `C:/x`, `C:x`, which is
/// relative to the current directory of drive C on Windows).
fn is_absolute(name: &str) -> bool {
    let bytes = name.as_bytes();
    let rooted = matches!(bytes.first(), Some(b'/' | b'\\'));
    let drive = bytes.len() >= 2 && bytes[0].is_ascii_alphabetic() && bytes[1] == b':';
    rooted || drive
}

fn check_component(name: &str, part: &str) -> Result<(), PathError> {
    if part == ".." {
        return Err(PathError::ParentComponent {
            name: name.to_owned(),
        });
    }
    if part.len() > MAX_COMPONENT_BYTES {
        return Err(PathError::ComponentTooLong {
            name: name.to_owned(),
            length: part.len(),
        });
    }
    // On Unix, any other string without `/` and NUL is a normal component;
    // this guards the assumption on other platforms, where `std` may parse a
    // component as a prefix or root.
    let mut parsed = Path::new(part).components();
    match (parsed.next(), parsed.next()) {
        (Some(Component::Normal(_)), None) => Ok(()),
        _ => Err(PathError::Absolute {
            name: name.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%20b.txt").as_deref(), Some("a b.txt"));
        assert_eq!(percent_decode("%C3%A9t%C3%A9").as_deref(), Some("été"));
        assert_eq!(percent_decode("100%").as_deref(), Some("100%"));
        assert_eq!(percent_decode("%zz%4").as_deref(), Some("%zz%4"));
        assert_eq!(percent_decode("%4").as_deref(), Some("%4"));
        assert_eq!(percent_decode("%41%").as_deref(), Some("A%"));
        assert_eq!(percent_decode("%FF"), None);
    }
    use proptest::prelude::*;

    fn reason(name: &str) -> PathError {
        safe_relative_path(name).unwrap_err()
    }

    #[test]
    fn accepts_and_normalizes_plain_names() {
        assert_eq!(safe_relative_path("a.txt").unwrap(), PathBuf::from("a.txt"));
        assert_eq!(safe_relative_path("a//b").unwrap(), PathBuf::from("a/b"));
        assert_eq!(safe_relative_path("./a").unwrap(), PathBuf::from("a"));
        assert_eq!(safe_relative_path("a/./b/").unwrap(), PathBuf::from("a/b"));
        assert_eq!(
            normalized_name("dir//sub/./f.txt").unwrap(),
            "dir/sub/f.txt"
        );
        // Dots inside a name, colons after the first character and
        // non-ASCII letters are ordinary characters.
        assert_eq!(normalized_name("..a/b..").unwrap(), "..a/b..");
        assert_eq!(normalized_name("ark:/13030/x").unwrap(), "ark:/13030/x");
        assert_eq!(
            normalized_name("données/été.txt").unwrap(),
            "données/été.txt"
        );
    }

    #[test]
    fn refuses_each_rule_with_the_name() {
        assert_eq!(reason(""), PathError::Empty);
        assert_eq!(reason("./"), PathError::NoComponents { name: "./".into() });
        assert_eq!(reason("//"), PathError::Absolute { name: "//".into() });
        assert_eq!(
            reason("a\0b"),
            PathError::ControlCharacter {
                name: "a\0b".into(),
                character: '\0'
            }
        );
        assert!(matches!(
            reason("a\nb"),
            PathError::ControlCharacter {
                character: '\n',
                ..
            }
        ));
        for absolute in ["/x", "\\x", "\\\\server\\share", "C:\\x", "C:/x", "c:x"] {
            assert_eq!(
                reason(absolute),
                PathError::Absolute {
                    name: absolute.into()
                },
                "{absolute}"
            );
        }
        for parent in ["..", "../x", "a/../../x", "a/.."] {
            assert_eq!(
                reason(parent),
                PathError::ParentComponent {
                    name: parent.into()
                },
                "{parent}"
            );
        }
        assert_eq!(
            reason("a\\b"),
            PathError::Backslash {
                name: "a\\b".into()
            }
        );
        let long = "x".repeat(256);
        assert_eq!(
            reason(&format!("a/{long}")),
            PathError::ComponentTooLong {
                name: format!("a/{long}"),
                length: 256
            }
        );
        let longest = ["y"; 2049].join("/");
        assert!(matches!(
            reason(&longest),
            PathError::TooLong { length: 4097, .. }
        ));
    }

    #[test]
    fn messages_name_the_name_and_the_rule() {
        assert_eq!(
            reason("../etc/passwd").to_string(),
            r#"file name "../etc/passwd" has a `..` component"#
        );
        assert!(reason("a\\b").to_string().contains("backslash"));
    }

    #[test]
    fn join_under_stays_under_the_root() {
        let root = Path::new("/srv/obj");
        assert_eq!(
            join_under(root, "a/b.txt").unwrap(),
            PathBuf::from("/srv/obj/a/b.txt")
        );
        assert!(matches!(
            join_under(root, "../x"),
            Err(PathError::ParentComponent { .. })
        ));
        assert!(matches!(
            join_under(root, "/etc/passwd"),
            Err(PathError::Absolute { .. })
        ));
    }

    proptest! {
        #[test]
        fn accepted_names_have_only_normal_components(name in any::<String>()) {
            check_accepted(&name)?;
        }

        #[test]
        fn accepted_path_like_names_stay_under_the_root(
            name in r"[a-zA-Z0-9./\\: ]{0,40}"
        ) {
            check_accepted(&name)?;
        }
    }

    fn check_accepted(name: &str) -> Result<(), TestCaseError> {
        if let Ok(path) = safe_relative_path(name) {
            prop_assert!(path.components().all(|c| matches!(c, Component::Normal(_))));
            let root = Path::new("/srv/root");
            let joined = join_under(root, name).expect("accepted name joins");
            prop_assert!(joined.starts_with(root));
            prop_assert!(joined != root);
            prop_assert!(joined
                .strip_prefix(root)
                .expect("under the root")
                .components()
                .all(|c| matches!(c, Component::Normal(_))));
        }
        Ok(())
    }
}
