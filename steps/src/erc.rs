//! The descriptive files Merritt stores with every object version: the ERC
//! record `mrt-erc.txt` (ANVL) and its Dublin Core twin `mrt-dc.xml`.
//!
//! ```
//! use ingest_steps::erc::{write_erc, ErcFields};
//!
//! let fields = ErcFields {
//!     who: Some("Doe, Jane".into()),
//!     what: Some("Field notes".into()),
//!     when: None,
//!     wheres: vec!["ark:/99999/fk4abc".into(), "local-17".into()],
//! };
//! assert_eq!(
//!     write_erc(&fields),
//!     "erc:\nwho: Doe, Jane\nwhat: Field notes\nwhen: (:unas)\nwhere: ark:/99999/fk4abc\nwhere: local-17\n"
//! );
//! ```

/// The ERC code for a value that is unassigned (not given).
pub const UNAS: &str = "(:unas)";

/// The Dublin Core elements namespace.
pub const DC_NAMESPACE: &str = "http://purl.org/dc/elements/1.1/";

/// The "kernel" fields of an object's ERC record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ErcFields {
    /// The creator(s); `None` or blank when not given.
    pub who: Option<String>,
    /// The title; `None` or blank when not given.
    pub what: Option<String>,
    /// The date; `None` or blank when not given.
    pub when: Option<String>,
    /// Where the object is found: its ark first, then local ids. Blank
    /// entries are skipped.
    pub wheres: Vec<String>,
}

/// The `mrt-erc.txt` text: an ANVL record labelled `erc:`.
///
/// A value's lines are trimmed and folded onto continuation lines that
/// start with a space; blank lines and control characters are dropped (a
/// blank line would end the ANVL record). A missing or blank value, and a
/// missing `where`, is written as `(:unas)`.
pub fn write_erc(fields: &ErcFields) -> String {
    let mut out = String::from("erc:\n");
    push_element(&mut out, "who", fields.who.as_deref());
    push_element(&mut out, "what", fields.what.as_deref());
    push_element(&mut out, "when", fields.when.as_deref());
    let wheres: Vec<String> = fields
        .wheres
        .iter()
        .map(|w| fold(w))
        .filter(|w| !w.is_empty())
        .collect();
    if wheres.is_empty() {
        push_element(&mut out, "where", None);
    }
    for w in &wheres {
        push_element(&mut out, "where", Some(w));
    }
    out
}

/// The `mrt-dc.xml` text: `creator`, `title`, `date` and one `identifier`
/// per `where`, in that order.
///
/// Missing or blank values are left out (Dublin Core has no code for
/// "unassigned"). Text is escaped (`& < > " '`), characters XML 1.0 forbids
/// are dropped, and a carriage return is written as `&#xD;` so a parser
/// does not turn it into a line feed.
pub fn write_dublin_core(fields: &ErcFields) -> String {
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    out.push_str(&format!("<dc xmlns:dc=\"{DC_NAMESPACE}\">\n"));
    let singles = [
        ("creator", &fields.who),
        ("title", &fields.what),
        ("date", &fields.when),
    ];
    for (element, value) in singles {
        if let Some(v) = value {
            push_dc(&mut out, element, v);
        }
    }
    for w in &fields.wheres {
        push_dc(&mut out, "identifier", w);
    }
    out.push_str("</dc>\n");
    out
}

/// Escapes `text` for XML content or attribute values and drops the
/// characters XML 1.0 cannot carry.
pub fn xml_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\r' => out.push_str("&#xD;"),
            c if is_xml_char(c) => out.push(c),
            _ => {}
        }
    }
    out
}

/// Whether XML 1.0 allows `c` (production `Char`). Rust's `char` already
/// excludes the surrogates.
fn is_xml_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
}

/// Appends `<dc:element>value</dc:element>`, unless nothing of the value
/// is left once escaped and trimmed.
fn push_dc(out: &mut String, element: &str, value: &str) {
    let escaped = xml_escape(value.trim());
    let text = escaped.trim();
    if !text.is_empty() {
        out.push_str(&format!("  <dc:{element}>{text}</dc:{element}>\n"));
    }
}

fn push_element(out: &mut String, label: &str, value: Option<&str>) {
    let folded = value.map(fold).filter(|v| !v.is_empty());
    out.push_str(label);
    out.push_str(": ");
    out.push_str(folded.as_deref().unwrap_or(UNAS));
    out.push('\n');
}

/// The value's non-blank lines, cleaned and joined with continuation
/// line breaks.
fn fold(value: &str) -> String {
    value
        .split(['\n', '\r'])
        .map(|line| {
            let cleaned: String = line
                .chars()
                .map(|c| if c == '\t' { ' ' } else { c })
                .filter(|c| !c.is_control())
                .collect();
            cleaned.trim().to_string()
        })
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join("\n ")
}
