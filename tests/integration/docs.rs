//! The documentation's links: every relative link of the README,
//! ARCHITECTURE.md, the CHANGELOG and `docs/*.md` names a file that exists
//! and, with a `#fragment`, a heading of that file (GitHub's anchors). The
//! README's content moved into `docs/` (issue 26); a page renamed or a
//! heading reworded must not leave a link pointing nowhere.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// GitHub's anchor of a heading: lower case, punctuation other than `-`
/// and `_` dropped, spaces as `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.insert(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// The `](target)` links of `text` outside code blocks, with their lines.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            out.push((n + 1, rest[..end].to_string()));
            rest = &rest[end..];
        }
    }
    out
}

#[test]
fn every_relative_link_of_the_docs_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages: Vec<PathBuf> = ["README.md", "ARCHITECTURE.md", "CHANGELOG.md"]
        .iter()
        .map(|p| root.join(p))
        .collect();
    for entry in std::fs::read_dir(root.join("docs")).expect("docs/") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    assert!(pages.len() > 8, "the docs pages: {pages:?}");
    let mut broken = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).expect("read page");
        for (line, target) in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, fragment) = target.split_once('#').unwrap_or((&target, ""));
            let file = match file {
                "" => page.clone(),
                f => page.parent().expect("dir").join(f),
            };
            let shown = format!("{}:{line}: {target}", page.display());
            if !file.exists() {
                broken.push(format!("{shown} (no such file)"));
            } else if !fragment.is_empty() && file.extension().is_some_and(|e| e == "md") {
                let text = std::fs::read_to_string(&file).expect("read target");
                if !anchors(&text).contains(fragment) {
                    broken.push(format!("{shown} (no such heading)"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn anchors_are_githubs() {
    assert_eq!(
        anchor(" Consistency report (`ingest check`)"),
        "consistency-report-ingest-check"
    );
    assert_eq!(
        anchor("Metrics, dashboard and alerts"),
        "metrics-dashboard-and-alerts"
    );
    assert_eq!(
        links("see [a](b.md#c) and [d](https://e)"),
        [(1, "b.md#c".to_string()), (1, "https://e".to_string())]
    );
}
