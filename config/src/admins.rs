//! Per-admin tokens: a file of `NAME TOKEN` lines, so each admin's actions
//! are recorded as `admin:NAME`, bound to the token they presented (not to
//! a name a client claims).
//!
//! The file is named by `tokens.admins_file`, `--admins-file` or
//! `INGEST_ADMINS_FILE` (flag and environment win over the file). One admin
//! per line, the name and the token separated by white space; blank lines
//! and lines starting with `#` are skipped. Names are 1–64 characters of
//! `A-Z a-z 0-9 . _ -`; tokens follow the rules of every other token. The
//! shared admin token (`tokens.admin_file`) keeps working and is recorded
//! as `admin:admin`, so `admin` is not a name the file may use.

use std::path::Path;

use crate::*;

/// The longest admin name.
pub const MAX_ADMIN_NAME_CHARS: usize = 64;

/// The most admins one file may list.
pub const MAX_ADMINS: usize = 1000;

/// The name the shared admin token is recorded under.
pub const SHARED_ADMIN_NAME: &str = "admin";

/// One admin with a token of their own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedAdmin {
    /// The admin's name, recorded as `admin:NAME`.
    pub name: String,
    /// Their bearer token (also their login to the admin web UI).
    pub token: Secret,
}

/// Whether `name` is a valid admin name.
pub fn valid_admin_name(name: &str) -> bool {
    !name.is_empty()
        && name.chars().count() <= MAX_ADMIN_NAME_CHARS
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// Reads an admins file (see the module's documentation). Messages name the
/// file and the line, never a token.
pub(crate) fn read_admins(path: &Path, origin: &Origin) -> Result<Vec<NamedAdmin>, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        what: "admins file",
        path: path.to_path_buf(),
        source,
    })?;
    parse_admins(&text, origin)
}

pub(crate) fn parse_admins(text: &str, origin: &Origin) -> Result<Vec<NamedAdmin>, ConfigError> {
    let lines = NamedLines {
        field: "tokens.admins_file",
        who: "admin",
        usage: "give one admin per line: NAME TOKEN",
        reserved: (
            SHARED_ADMIN_NAME,
            "`admin` is the shared admin token's name; give each admin their own",
        ),
        max: MAX_ADMINS,
        columns: 0..=0,
    };
    Ok(lines
        .parse(text, origin)?
        .into_iter()
        .map(|l| NamedAdmin {
            name: l.name,
            token: l.token,
        })
        .collect())
}

/// One line of a file of named tokens (admins, depositors).
pub(crate) struct NamedLine {
    /// The line's number, from 1 (for messages).
    pub(crate) number: usize,
    pub(crate) name: String,
    pub(crate) token: Secret,
    /// The words after the token.
    pub(crate) rest: Vec<String>,
}

/// The rules of a file of `NAME TOKEN [WORD…]` lines: blank lines and `#`
/// comments skipped, names checked, unique, tokens checked and unique, at
/// most `max` lines. Messages name the file's field and the line, never a
/// token.
pub(crate) struct NamedLines {
    pub(crate) field: &'static str,
    pub(crate) who: &'static str,
    pub(crate) usage: &'static str,
    pub(crate) reserved: (&'static str, &'static str),
    pub(crate) max: usize,
    /// How many words may follow the token.
    pub(crate) columns: std::ops::RangeInclusive<usize>,
}

impl NamedLines {
    pub(crate) fn parse(&self, text: &str, origin: &Origin) -> Result<Vec<NamedLine>, ConfigError> {
        let mut out: Vec<NamedLine> = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let field = format!("{} line {}", self.field, i + 1);
            let mut parts = line.split_whitespace();
            let (Some(name), Some(token)) = (parts.next(), parts.next()) else {
                return Err(invalid(origin, &field, self.usage));
            };
            let rest: Vec<String> = parts
                .take(self.columns.end().saturating_add(1))
                .map(str::to_string)
                .collect();
            if !self.columns.contains(&rest.len()) {
                return Err(invalid(origin, &field, self.usage));
            }
            if !valid_admin_name(name) {
                return Err(invalid(
                    origin,
                    &field,
                    format!(
                        "a{} {} name is 1-{MAX_ADMIN_NAME_CHARS} characters of A-Z a-z 0-9 . _ -",
                        if self.who.starts_with('a') { "n" } else { "" },
                        self.who
                    ),
                ));
            }
            if name == self.reserved.0 {
                return Err(invalid(origin, &field, self.reserved.1));
            }
            let token = check_token(token, origin, &field)?;
            if out.iter().any(|a| a.name == name) {
                return Err(invalid(origin, &field, format!("{name} is listed twice")));
            }
            if out.iter().any(|a| a.token == token) {
                return Err(invalid(
                    origin,
                    &field,
                    format!(
                        "this token is another {}'s too; each {} needs their own",
                        self.who, self.who
                    ),
                ));
            }
            if out.len() == self.max {
                return Err(invalid(
                    origin,
                    &field,
                    format!("more than {} {}s", self.max, self.who),
                ));
            }
            out.push(NamedLine {
                number: i + 1,
                name: name.to_string(),
                token,
                rest,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admins_files_are_parsed_and_checked() {
        let o = Origin::Named("t".into());
        let ok = parse_admins(
            "# who\nalice  alice-token-0123456789\n\nbob\tbob-token-0123456789\n",
            &o,
        )
        .expect("parse");
        assert_eq!(ok.len(), 2);
        assert_eq!(ok[0].name, "alice");
        assert!(ok[1].token.matches(b"bob-token-0123456789"));
        for bad in [
            "alice",
            "alice a b",
            "al/ice alice-token-0123456789",
            "admin alice-token-0123456789",
            "alice short",
            "a alice-token-0123456789\na bob-token-0123456789",
            "a alice-token-0123456789\nb alice-token-0123456789",
        ] {
            let e = parse_admins(bad, &o).expect_err(bad).to_string();
            assert!(!e.contains("token-0123456789"), "{e} shows a token");
        }
    }
}
