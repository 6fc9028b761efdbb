//! A parser for Checkm 0.7 manifests, in the forms Merritt uses.
//!
//! ```text
//! #%checkm_0.7
//! #%profile | http://uc3.cdlib.org/registry/ingest/manifest/mrt-ingest-manifest
//! #%prefix | nfo: | http://www.semanticdesktop.org/ontologies/2007/03/22/nfo#
//! #%fields | nfo:fileUrl | nfo:hashAlgorithm | nfo:hashValue | nfo:fileSize | nfo:fileLastModified | nfo:fileName
//! http://example.org/hello.txt | md5 | b1946ac92492d2347c6235b4d2611184 | 6 | | hello.txt
//! #%eof
//! ```
//!
//! The rules, as this parser applies them:
//!
//! - The first non-blank line is `#%checkm_0.7` (the token in any case).
//! - `#%profile | URL` (once), `#%prefix | pfx: | URI` (any number),
//!   `#%fields | f1 | f2 …` (once, before the first entry). Any other `#%`
//!   line is an error that names it. Lines starting with a plain `#` are
//!   comments; blank lines are ignored. Directive names match in any case.
//! - Data lines are `|`-separated values, each trimmed; an empty value is
//!   unset. Without `#%fields`, the checkm 0.7 default fields apply
//!   ([`DEFAULT_FIELDS`]).
//! - `#%eof` ends the manifest and is required; nothing but blank lines may
//!   follow it.
//! - CRLF line ends and a UTF-8 byte order mark are tolerated; invalid UTF-8
//!   is an error.
//!
//! Parsing stops at the first problem and reports it with its 1-based line
//! number ([`ManifestError`]).
//!
//! ```
//! use ingest_steps::checkm::parse;
//!
//! let text = b"#%checkm_0.7\n\
//!     #%fields | nfo:fileUrl | nfo:fileName | mrt:localIdentifier\n\
//!     http://example.org/a.txt | a.txt | id1;id2;id1\n\
//!     #%eof\n";
//! let manifest = parse(text).unwrap();
//! let record = manifest.records().next().unwrap();
//! assert_eq!(record.line(), 3);
//! assert_eq!(record.file_url(), Some("http://example.org/a.txt"));
//! assert_eq!(record.local_identifiers(), vec!["id1", "id2"]);
//! ```

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The fields of a checkm 0.7 manifest without a `#%fields` line, in order.
pub const DEFAULT_FIELDS: [&str; 6] = [
    "sourcefileorurl",
    "alg",
    "digest",
    "length",
    "modified",
    "targetfile",
];

/// The UTF-8 byte order mark, tolerated at the start of a manifest.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// The longest excerpt of a line quoted in an error message, in characters.
const QUOTE_CHARS: usize = 80;

/// Limits on what the parser accepts, so that a hostile manifest cannot
/// exhaust memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParseLimits {
    /// The largest manifest accepted, in bytes (default 64 MiB).
    pub max_bytes: usize,
    /// The most data lines accepted (default 1,000,000).
    pub max_entries: usize,
    /// The most fields a `#%fields` line may declare (default 256).
    pub max_fields: usize,
    /// The longest line accepted, in bytes (default 64 KiB, the engine's
    /// cap on one field of a job): a longer one is refused naming its line,
    /// never quoted.
    pub max_line_bytes: usize,
}

impl Default for ParseLimits {
    fn default() -> Self {
        ParseLimits {
            max_bytes: 64 * 1024 * 1024,
            max_entries: 1_000_000,
            max_fields: 256,
            max_line_bytes: 64 * 1024,
        }
    }
}

/// A problem in a manifest, with the 1-based line it was found on.
///
/// ### Handling
/// The manifest is wrong, not the system: refuse the submission (HTTP 400 or
/// a failed job) and show the message, which names the line, to the
/// depositor. Retrying cannot help.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("line {line}: {message}")]
#[non_exhaustive]
pub struct ManifestError {
    /// The 1-based line of the problem.
    pub line: usize,
    /// What is wrong, in a sentence.
    pub message: String,
}

impl ManifestError {
    /// A problem on `line` (1-based).
    pub fn new(line: usize, message: impl Into<String>) -> Self {
        ManifestError {
            line,
            message: message.into(),
        }
    }
}

/// A parsed manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The `#%profile` URL, if given.
    pub profile: Option<String>,
    /// The line of the `#%profile` directive, to point errors about the
    /// profile at it.
    pub profile_line: Option<usize>,
    /// The `#%prefix` declarations, in order.
    pub prefixes: Vec<Prefix>,
    /// The field names as declared by `#%fields`, or [`DEFAULT_FIELDS`].
    pub fields: Vec<String>,
    /// The data lines, in order.
    pub entries: Vec<Entry>,
    /// The line of `#%eof`.
    pub eof_line: usize,
}

/// A `#%prefix | pfx: | URI` declaration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prefix {
    /// The prefix without its trailing colon (`mrt`).
    pub prefix: String,
    /// The URI it stands for.
    pub uri: String,
}

/// One data line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The 1-based line number.
    pub line: usize,
    /// One value per field of the manifest, in the order of
    /// [`Manifest::fields`]; `None` when the value is empty or missing.
    ///
    /// A line may give fewer values than there are fields: the missing
    /// trailing values are unset. Merritt's own sample `mock_object.checkm`
    /// declares 7 fields and gives 6 values. A line may also end with more
    /// `|` separators than fields, as Merritt's batch samples do (11 fields,
    /// 12 values, the last empty): extra values are accepted only when empty.
    pub values: Vec<Option<String>>,
}

impl Manifest {
    /// The index of a field, matched case-insensitively and with or without
    /// its prefix (`nfo:fileUrl`, `fileUrl` and `FILEURL` are the same).
    pub fn field_index(&self, name: &str) -> Option<usize> {
        let wanted = unprefixed(name);
        self.fields
            .iter()
            .position(|field| unprefixed(field).eq_ignore_ascii_case(wanted))
    }

    /// The entries with accessors by field name.
    pub fn records(&self) -> impl ExactSizeIterator<Item = Record<'_>> + '_ {
        self.entries.iter().map(move |entry| Record {
            manifest: self,
            entry,
        })
    }
}

/// An entry seen through its manifest's fields: the accessors by name.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    manifest: &'a Manifest,
    entry: &'a Entry,
}

impl<'a> Record<'a> {
    /// The 1-based line of the entry.
    pub fn line(&self) -> usize {
        self.entry.line
    }

    /// The entry itself.
    pub fn entry(&self) -> &'a Entry {
        self.entry
    }

    /// The value of a field (see [`Manifest::field_index`] for how names
    /// match); `None` when the field is not declared or the value is unset.
    pub fn get(&self, field: &str) -> Option<&'a str> {
        let index = self.manifest.field_index(field)?;
        self.entry.values.get(index)?.as_deref()
    }

    /// The first of several names (aliases) that has a value.
    fn get_any(&self, fields: &[&str]) -> Option<&'a str> {
        fields.iter().find_map(|field| self.get(field))
    }

    /// `nfo:fileUrl` (checkm: `SourceFileOrURL`).
    pub fn file_url(&self) -> Option<&'a str> {
        self.get_any(&["fileUrl", "sourcefileorurl"])
    }

    /// `nfo:hashAlgorithm` (checkm: `Alg`), as written.
    pub fn hash_algorithm(&self) -> Option<&'a str> {
        self.get_any(&["hashAlgorithm", "alg"])
    }

    /// `nfo:hashValue` (checkm: `Digest`), as written.
    pub fn hash_value(&self) -> Option<&'a str> {
        self.get_any(&["hashValue", "digest"])
    }

    /// `nfo:fileSize` (checkm: `Length`) in bytes.
    ///
    /// # Errors
    /// When the value is not a whole number of bytes (digits only, fits in
    /// a `u64`); the error names the line.
    pub fn file_size(&self) -> Result<Option<u64>, ManifestError> {
        let Some(text) = self.get_any(&["fileSize", "length"]) else {
            return Ok(None);
        };
        let digits = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
        match text.parse::<u64>() {
            Ok(size) if digits => Ok(Some(size)),
            _ => Err(ManifestError::new(
                self.line(),
                format!("file size {:?} is not a whole number of bytes", quote(text)),
            )),
        }
    }

    /// `nfo:fileLastModified` (checkm: `ModTime`), as written.
    pub fn last_modified(&self) -> Option<&'a str> {
        self.get_any(&["fileLastModified", "modified"])
    }

    /// `nfo:fileName` (checkm: `TargetFileName`): the file's path in the
    /// object, unchecked (see [`crate::paths`]).
    pub fn file_name(&self) -> Option<&'a str> {
        self.get_any(&["fileName", "targetfile"])
    }

    /// `mrt:mimeType`.
    pub fn mime_type(&self) -> Option<&'a str> {
        self.get("mimeType")
    }

    /// `mrt:primaryIdentifier` (an ARK).
    pub fn primary_identifier(&self) -> Option<&'a str> {
        self.get("primaryIdentifier")
    }

    /// `mrt:localIdentifier`, split on `;`: each id trimmed, empty ones
    /// dropped, duplicates removed keeping the first occurrence's place.
    pub fn local_identifiers(&self) -> Vec<String> {
        let mut seen = HashSet::new();
        self.get("localIdentifier")
            .unwrap_or_default()
            .split(';')
            .map(str::trim)
            .filter(|id| !id.is_empty() && seen.insert(*id))
            .map(str::to_owned)
            .collect()
    }

    /// `mrt:creator` (ERC who).
    pub fn creator(&self) -> Option<&'a str> {
        self.get("creator")
    }

    /// `mrt:title` (ERC what).
    pub fn title(&self) -> Option<&'a str> {
        self.get("title")
    }

    /// `mrt:date` (ERC when).
    pub fn date(&self) -> Option<&'a str> {
        self.get("date")
    }
}

/// Parses a manifest with the default [`ParseLimits`].
///
/// # Errors
/// The first problem found, with its line (see the module documentation for
/// the rules).
pub fn parse(input: &[u8]) -> Result<Manifest, ManifestError> {
    parse_with_limits(input, &ParseLimits::default())
}

/// Parses a manifest, refusing one that exceeds `limits`.
///
/// # Errors
/// The first problem found, with its line; a manifest over a limit is
/// refused at the line where the limit is crossed.
pub fn parse_with_limits(input: &[u8], limits: &ParseLimits) -> Result<Manifest, ManifestError> {
    if input.len() > limits.max_bytes {
        // Point at the line where the limit is crossed.
        let line = input[..limits.max_bytes]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1;
        return Err(ManifestError::new(
            line,
            format!("the manifest is larger than {} bytes", limits.max_bytes),
        ));
    }
    let body = input.strip_prefix(BOM).unwrap_or(input);
    let mut parser = Parser::new(limits);
    let mut last_line = 1;
    for (index, raw) in body.split(|&b| b == b'\n').enumerate() {
        let number = index + 1;
        if !raw.is_empty() {
            last_line = number;
        }
        if raw.len() > limits.max_line_bytes {
            return Err(ManifestError::new(
                number,
                format!(
                    "the line is {} bytes, more than {} bytes",
                    raw.len(),
                    limits.max_line_bytes
                ),
            ));
        }
        parser.line(number, decode(number, raw)?)?;
    }
    parser.finish(last_line)
}

fn decode(number: usize, raw: &[u8]) -> Result<&str, ManifestError> {
    std::str::from_utf8(raw).map_err(|e| {
        ManifestError::new(
            number,
            format!("invalid UTF-8 at byte {} of the line", e.valid_up_to() + 1),
        )
    })
}

/// Where the parser is in the manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Before `#%checkm_0.7`.
    Header,
    /// Between the header and `#%eof`.
    Body,
    /// After `#%eof`, at this line.
    Ended(usize),
}

struct Parser<'l> {
    limits: &'l ParseLimits,
    stage: Stage,
    profile: Option<(String, usize)>,
    prefixes: Vec<Prefix>,
    /// The declared fields and the line of `#%fields`.
    fields: Option<(Vec<String>, usize)>,
    entries: Vec<Entry>,
}

impl<'l> Parser<'l> {
    fn new(limits: &'l ParseLimits) -> Self {
        Parser {
            limits,
            stage: Stage::Header,
            profile: None,
            prefixes: Vec::new(),
            fields: None,
            entries: Vec::new(),
        }
    }

    fn line(&mut self, number: usize, text: &str) -> Result<(), ManifestError> {
        let text = text.trim();
        if text.is_empty() {
            return Ok(());
        }
        match self.stage {
            Stage::Header if is_header(text) => {
                self.stage = Stage::Body;
                Ok(())
            }
            Stage::Header => Err(ManifestError::new(
                number,
                format!(
                    "expected #%checkm_0.7 as the first line, found {:?}",
                    quote(text)
                ),
            )),
            Stage::Ended(eof) => Err(ManifestError::new(
                number,
                format!("content after #%eof (line {eof})"),
            )),
            Stage::Body if text.starts_with("#%") => self.directive(number, text),
            Stage::Body if text.starts_with('#') => Ok(()),
            Stage::Body => self.data(number, text),
        }
    }

    fn directive(&mut self, number: usize, text: &str) -> Result<(), ManifestError> {
        let mut parts = text.split('|').map(str::trim);
        let keyword = parts.next().unwrap_or_default().to_ascii_lowercase();
        let mut args: Vec<&str> = parts.collect();
        while args.last() == Some(&"") {
            args.pop();
        }
        match keyword.as_str() {
            "#%profile" => self.profile(number, &args),
            "#%prefix" => self.prefix(number, &args),
            "#%fields" => self.fields(number, &args),
            "#%eof" if args.is_empty() => {
                self.stage = Stage::Ended(number);
                Ok(())
            }
            "#%eof" => Err(ManifestError::new(number, "#%eof takes no values")),
            _ if is_header(&keyword) => {
                Err(ManifestError::new(number, "a second #%checkm_0.7 header"))
            }
            _ => Err(ManifestError::new(
                number,
                format!(
                    "unknown directive {:?} (expected #%profile, #%prefix, #%fields or #%eof)",
                    quote(&keyword)
                ),
            )),
        }
    }

    fn profile(&mut self, number: usize, args: &[&str]) -> Result<(), ManifestError> {
        if let Some((_, first)) = &self.profile {
            return Err(ManifestError::new(
                number,
                format!("a second #%profile (the first is on line {first})"),
            ));
        }
        match args {
            [url] if !url.is_empty() => {
                self.profile = Some(((*url).to_owned(), number));
                Ok(())
            }
            _ => Err(ManifestError::new(
                number,
                "#%profile takes exactly one value, the profile URL",
            )),
        }
    }

    fn prefix(&mut self, number: usize, args: &[&str]) -> Result<(), ManifestError> {
        match args {
            [prefix, uri] if !prefix.trim_end_matches(':').is_empty() && !uri.is_empty() => {
                self.prefixes.push(Prefix {
                    prefix: prefix.trim_end_matches(':').to_owned(),
                    uri: (*uri).to_owned(),
                });
                Ok(())
            }
            _ => Err(ManifestError::new(
                number,
                "#%prefix takes exactly two values, the prefix and its URI",
            )),
        }
    }

    fn fields(&mut self, number: usize, args: &[&str]) -> Result<(), ManifestError> {
        if let Some((_, first)) = &self.fields {
            return Err(ManifestError::new(
                number,
                format!("a second #%fields (the first is on line {first})"),
            ));
        }
        if let Some(entry) = self.entries.first() {
            return Err(ManifestError::new(
                number,
                format!("#%fields after the first entry (line {})", entry.line),
            ));
        }
        if args.is_empty() {
            return Err(ManifestError::new(number, "#%fields names no fields"));
        }
        if args.len() > self.limits.max_fields {
            return Err(ManifestError::new(
                number,
                format!("more than {} fields", self.limits.max_fields),
            ));
        }
        check_field_names(number, args)?;
        self.fields = Some((args.iter().map(|f| (*f).to_owned()).collect(), number));
        Ok(())
    }

    fn data(&mut self, number: usize, text: &str) -> Result<(), ManifestError> {
        if self.entries.len() >= self.limits.max_entries {
            return Err(ManifestError::new(
                number,
                format!("more than {} entries", self.limits.max_entries),
            ));
        }
        let declared = match &self.fields {
            Some((fields, _)) => fields.len(),
            None => DEFAULT_FIELDS.len(),
        };
        let mut values = Vec::with_capacity(declared);
        for (index, value) in text.split('|').map(str::trim).enumerate() {
            if index < declared {
                values.push((!value.is_empty()).then(|| value.to_owned()));
            } else if !value.is_empty() {
                return Err(self.too_many_values(number, text, declared));
            }
        }
        values.resize(declared, None);
        self.entries.push(Entry {
            line: number,
            values,
        });
        Ok(())
    }

    fn too_many_values(&self, number: usize, text: &str, declared: usize) -> ManifestError {
        let given = text.split('|').count();
        let source = match &self.fields {
            Some((_, line)) => format!("#%fields (line {line}) declares"),
            None => "without #%fields, checkm 0.7 has".to_owned(),
        };
        ManifestError::new(
            number,
            format!("{given} values, but {source} {declared} fields"),
        )
    }

    fn finish(self, last_line: usize) -> Result<Manifest, ManifestError> {
        let eof_line = match self.stage {
            Stage::Header => {
                return Err(ManifestError::new(
                    1,
                    "the manifest is empty: expected #%checkm_0.7",
                ))
            }
            Stage::Body => {
                return Err(ManifestError::new(
                    last_line,
                    "the manifest ends without #%eof (it may have been cut short)",
                ))
            }
            Stage::Ended(line) => line,
        };
        let (profile, profile_line) = match self.profile {
            Some((url, line)) => (Some(url), Some(line)),
            None => (None, None),
        };
        let fields = match self.fields {
            Some((fields, _)) => fields,
            None => DEFAULT_FIELDS.iter().map(|f| (*f).to_owned()).collect(),
        };
        Ok(Manifest {
            profile,
            profile_line,
            prefixes: self.prefixes,
            fields,
            entries: self.entries,
            eof_line,
        })
    }
}

/// `#%checkm_0.7`, in any case (the line is already trimmed).
fn is_header(text: &str) -> bool {
    text.eq_ignore_ascii_case("#%checkm_0.7")
}

/// Field names must be non-empty and distinct once their prefix and case
/// are ignored, or the accessors by name would be ambiguous.
fn check_field_names(number: usize, fields: &[&str]) -> Result<(), ManifestError> {
    let mut seen: Vec<&str> = Vec::with_capacity(fields.len());
    for (index, field) in fields.iter().enumerate() {
        if unprefixed(field).is_empty() {
            return Err(ManifestError::new(
                number,
                format!("field {} of #%fields is empty", index + 1),
            ));
        }
        if let Some(first) = seen
            .iter()
            .find(|s| unprefixed(s).eq_ignore_ascii_case(unprefixed(field)))
        {
            return Err(ManifestError::new(
                number,
                format!("fields {:?} and {:?} are the same field", first, field),
            ));
        }
        seen.push(field);
    }
    Ok(())
}

/// A field name without its namespace prefix (`nfo:fileUrl` → `fileUrl`).
fn unprefixed(name: &str) -> &str {
    match name.split_once(':') {
        // A URI used as a field name keeps its colon.
        Some((prefix, rest)) if !prefix.contains('/') && !rest.contains('/') => rest,
        _ => name,
    }
}

/// At most [`QUOTE_CHARS`] characters of `text`, to quote in a message.
fn quote(text: &str) -> String {
    let mut quoted: String = text.chars().take(QUOTE_CHARS).collect();
    if quoted.len() < text.len() {
        quoted.push('…');
    }
    quoted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(text: &str) -> ManifestError {
        parse(text.as_bytes()).unwrap_err()
    }

    #[test]
    fn unprefixed_names() {
        assert_eq!(unprefixed("nfo:fileUrl"), "fileUrl");
        assert_eq!(unprefixed("fileUrl"), "fileUrl");
        assert_eq!(unprefixed("http://x/y:z"), "http://x/y:z");
    }

    #[test]
    fn quote_cuts_long_lines() {
        assert_eq!(quote("abc"), "abc");
        assert_eq!(quote(&"é".repeat(100)), format!("{}…", "é".repeat(80)));
    }

    #[test]
    fn header_must_come_first() {
        let e = error("# a comment\n#%checkm_0.7\n#%eof\n");
        assert_eq!(e.line, 1);
        assert!(e.message.starts_with("expected #%checkm_0.7"), "{e}");
    }

    #[test]
    fn empty_input() {
        assert_eq!(
            error("\n\n"),
            ManifestError::new(1, "the manifest is empty: expected #%checkm_0.7")
        );
    }
}
