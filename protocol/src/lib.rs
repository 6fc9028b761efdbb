//! `ingest-protocol`: the wire contract of `ingest`, one type per message.
//!
//! The server parses these types and its clients (the workers, the remote
//! CLI, the load driver, the tests) build them; there is no second
//! description of the wire:
//! - [`submission`]: the submission a depositor sends (`POST /batches`),
//!   its validation ([`submission::SubmissionError`] names the field), and
//!   the simple expansion into jobs;
//! - [`history`]: one row per event, as every history answer carries them;
//! - [`listing`]: the filters, cursors and pages of `GET /batches` and
//!   `GET /jobs`;
//! - [`view`]: what `show` and `status` print, the same locally and through
//!   a server;
//! - [`api`]: the other request and response bodies of the HTTP API, and
//!   [`api::ErrorBody`] with its stable error codes;
//! - [`endpoint`]: the routes, one type per endpoint naming its method,
//!   route pattern, body and reply, which the server's route table, the
//!   client and the workers all use.
//!
//! ```
//! use ingest_protocol::submission::SubmissionInput;
//!
//! let input = SubmissionInput {
//!     submitter: Some("alice".into()),
//!     payload_url: Some("https://example.org/a.zip".into()),
//!     ..SubmissionInput::default()
//! };
//! let err = input.build().unwrap_err();
//! assert_eq!(err.field(), "profile");
//! ```
#![deny(missing_docs)]

pub mod access;
pub mod api;
pub mod callback;
pub mod consistency;
pub mod delivery;
pub mod endpoint;
pub mod fence;
pub mod history;
pub mod inventory;
pub mod listing;
pub mod node;
pub mod outbound;
pub mod profile;
pub mod report;
pub mod submission;
pub mod view;

/// The most bytes of a message (a failure reason, a manifest error) kept
/// in an event or a log line; longer ones are cut by [`cut`].
pub const MAX_MESSAGE_BYTES: usize = 4096;

/// The bytes a URL path segment or query value keeps as they are: RFC
/// 3986's unreserved characters.
const UNRESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `value` percent-encoded as one URL path segment or query value: every
/// byte but RFC 3986's unreserved characters (so `/`, `:` and spaces are
/// encoded too).
pub fn encode_segment(value: &str) -> String {
    percent_encoding::utf8_percent_encode(value, UNRESERVED).to_string()
}

/// `value` as it is displayed, cut to [`MAX_MESSAGE_BYTES`] with [`cut`]'s
/// marker, without formatting more than that first: what every log line
/// and message that can carry outside input quotes (`error = %bounded(&e)`).
pub fn bounded<T: std::fmt::Display>(value: T) -> Bounded<T> {
    Bounded(value)
}

/// A value displayed at most [`MAX_MESSAGE_BYTES`] long ([`bounded`]).
#[derive(Debug, Clone, Copy)]
pub struct Bounded<T>(pub T);

impl<T: std::fmt::Display> std::fmt::Display for Bounded<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut limited = Limited {
            out: f,
            left: MAX_MESSAGE_BYTES,
            cut: 0,
        };
        std::fmt::write(&mut limited, format_args!("{}", self.0))?;
        let cut = limited.cut;
        if cut > 0 {
            write!(f, "… [{cut} more bytes cut]")?;
        }
        Ok(())
    }
}

/// Writes through at most `left` bytes and counts the rest.
struct Limited<'a, 'b> {
    out: &'a mut std::fmt::Formatter<'b>,
    left: usize,
    cut: usize,
}

impl std::fmt::Write for Limited<'_, '_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        if s.len() <= self.left {
            self.left -= s.len();
            return self.out.write_str(s);
        }
        let mut end = self.left;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.cut += s.len() - end;
        self.left = 0;
        self.out.write_str(&s[..end])
    }
}

/// `text` cut to at most `max` bytes (at a character boundary), with a
/// marker saying how many bytes were cut; unchanged when it fits.
pub fn cut(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!(
        "{}… [{} more bytes cut]",
        &text[..end],
        text.len() - end
    ))
}

/// `text` cut to about `max` bytes by taking out its middle, with a marker
/// saying how many bytes were cut; unchanged when it fits. For messages
/// whose end says what to do ("… a new submission is required"), which
/// [`cut`] would drop.
pub fn cut_middle(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut head = max / 2;
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len() - (max - max / 2);
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    std::borrow::Cow::Owned(format!(
        "{} … [{} bytes cut] … {}",
        &text[..head],
        tail - head,
        &text[tail..]
    ))
}

#[cfg(test)]
mod tests {
    use super::{bounded, cut, cut_middle, encode_segment, MAX_MESSAGE_BYTES};

    #[test]
    fn cut_middle_keeps_both_ends() {
        let text = format!(
            "{}é{} a new submission is required",
            "a".repeat(300),
            "b".repeat(300)
        );
        let cut = cut_middle(&text, 100);
        assert!(cut.starts_with("aaaa"), "{cut}");
        assert!(cut.ends_with("a new submission is required"), "{cut}");
        assert!(cut.contains("bytes cut]"), "{cut}");
        assert!(cut.len() < 160, "{cut}");
        assert_eq!(cut_middle("short", 100), "short");
    }

    /// One encoder for the admin pages' links and the storage manifest's
    /// content URLs: an ark and a file path each stay one segment.
    #[test]
    fn a_segment_keeps_only_unreserved_bytes() {
        assert_eq!(
            encode_segment("ark:/99999/fk4 x~-._"),
            "ark%3A%2F99999%2Ffk4%20x~-._"
        );
        assert_eq!(encode_segment("été?&#%"), "%C3%A9t%C3%A9%3F%26%23%25");
    }

    #[test]
    fn cut_keeps_short_text_and_marks_what_it_cuts() {
        assert_eq!(cut("short", 10), "short");
        let long = "é".repeat(10); // 20 bytes
        let c = cut(&long, 5);
        assert!(c.starts_with("éé…"), "{c}");
        assert!(c.ends_with("[16 more bytes cut]"), "{c}");
    }

    #[test]
    fn bounded_displays_what_cut_gives_across_pieces() {
        assert_eq!(bounded("short").to_string(), "short");
        let huge = "x".repeat(20 * 1024 * 1024);
        let shown = bounded(format_args!("line 4: {huge} | a")).to_string();
        assert_eq!(
            shown,
            cut(&format!("line 4: {huge} | a"), MAX_MESSAGE_BYTES)
        );
        assert!(shown.len() < MAX_MESSAGE_BYTES + 64, "{}", shown.len());
        let multi = "é".repeat(MAX_MESSAGE_BYTES);
        let shown = bounded(&multi).to_string();
        assert_eq!(shown, cut(&multi, MAX_MESSAGE_BYTES));
    }
}
