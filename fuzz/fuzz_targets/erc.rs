//! The ERC record (`mrt-erc.txt`, ANVL) and its Dublin Core twin
//! (`mrt-dc.xml`) written from arbitrary depositor fields. `ingest` parses
//! no ERC of others: it writes these from the submission's `erc_*` fields
//! and local ids, which are hostile input. Whatever they hold, the ANVL
//! text stays one record of labelled elements (no blank line, no stray
//! label, continuation lines start with a space) and the XML stays
//! well-formed element text (no raw `<` or `>`, every `&` an entity; line
//! feeds are text, as XML allows).
#![no_main]

use ingest_steps::erc::{write_dublin_core, write_erc, ErcFields};
use libfuzzer_sys::fuzz_target;

fn field(part: Option<&str>) -> Option<String> {
    part.map(str::to_string)
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    // Fields separated by U+001E; the fourth and later are `where`s.
    let mut parts = text.split('\u{1e}');
    let fields = ErcFields {
        who: field(parts.next()),
        what: field(parts.next()),
        when: field(parts.next()),
        wheres: parts.map(str::to_string).collect(),
    };
    let erc = write_erc(&fields);
    assert!(erc.starts_with("erc:\n") && erc.ends_with('\n'), "{erc:?}");
    let mut labels = Vec::new();
    for line in erc.lines().skip(1) {
        assert!(!line.trim().is_empty(), "a blank line ends the record: {erc:?}");
        assert!(!line.chars().any(char::is_control), "a control character: {line:?}");
        if line.starts_with(' ') {
            assert!(!labels.is_empty(), "a continuation before any element");
            continue;
        }
        let (label, _) = line.split_once(": ").unwrap_or_else(|| panic!("no label: {line:?}"));
        assert!(matches!(label, "who" | "what" | "when" | "where"), "label {label:?}");
        labels.push(label.to_string());
    }
    assert_eq!(&labels[..3], ["who", "what", "when"], "{erc:?}");
    assert!(labels[3..].iter().all(|l| l == "where") && labels.len() >= 4);

    let dc = write_dublin_core(&fields);
    let body = dc
        .strip_prefix("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<dc xmlns:dc=\"http://purl.org/dc/elements/1.1/\">\n")
        .and_then(|b| b.strip_suffix("</dc>\n"))
        .unwrap_or_else(|| panic!("the frame: {dc:?}"));
    // Element by element: text may hold line feeds (XML allows them), but
    // never a raw `<` or `>`, and every `&` starts an entity.
    let mut rest = body;
    while !rest.trim().is_empty() {
        let inner = rest.trim_start();
        assert!(inner.starts_with("<dc:"), "{inner:?}");
        let open_end = inner.find('>').unwrap_or_else(|| panic!("{inner:?}"));
        let tag = &inner[1..open_end];
        let after = &inner[open_end + 1..];
        let close = format!("</{tag}>");
        let text_end = after.find('<').unwrap_or_else(|| panic!("unclosed {tag}: {inner:?}"));
        let text = &after[..text_end];
        assert!(after[text_end..].starts_with(&close), "unclosed {tag}: {inner:?}");
        assert!(!text.contains('>'), "raw markup: {text:?}");
        for (i, _) in text.match_indices('&') {
            let tail = &text[i..];
            assert!(
                ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;", "&#xD;"]
                    .iter()
                    .any(|e| tail.starts_with(e)),
                "a bare &: {text:?}"
            );
        }
        rest = &after[text_end + close.len()..];
    }
});
