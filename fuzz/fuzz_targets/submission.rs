//! The submission body on arbitrary bytes, as JSON (`POST /batches`) and as
//! YAML (`ingest submit --file`): never a panic; what parses either builds
//! a submission or is refused naming a field, with a bounded message; a
//! built submission expands or is refused the same way.
#![no_main]

use ingest_protocol::submission::{expand_simple, SubmissionInput};
use libfuzzer_sys::fuzz_target;

fn check(input: SubmissionInput) {
    match input.build() {
        Ok(submission) => match expand_simple(&submission) {
            Ok(specs) => {
                for spec in specs {
                    assert!(spec.priority.is_none_or(|p| p <= 99));
                }
            }
            Err(e) => bounded(&e.field(), &e.to_string()),
        },
        Err(e) => bounded(&e.field(), &e.to_string()),
    }
}

fn bounded(field: &str, message: &str) {
    assert!(!field.is_empty(), "a refusal names its field");
    assert!(field.len() <= 1024, "an unbounded field name");
    assert!(message.len() <= 8192, "an unbounded refusal: {} bytes", message.len());
}

fuzz_target!(|data: &[u8]| {
    if let Ok(input) = serde_json::from_slice::<SubmissionInput>(data) {
        check(input);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(input) = serde_norway::from_str::<SubmissionInput>(text) {
            check(input);
        }
    }
});
