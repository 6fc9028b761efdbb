//! The checkm 0.7 manifest parser on arbitrary bytes: never a panic, every
//! error names a line within the input and quotes it bounded.
#![no_main]

use ingest_steps::checkm::{parse_with_limits, ParseLimits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = ParseLimits {
        max_bytes: 1 << 20,
        max_entries: 10_000,
        max_fields: 64,
        max_line_bytes: 64 * 1024,
    };
    match parse_with_limits(data, &limits) {
        Ok(manifest) => {
            for record in manifest.records() {
                let _ = record;
            }
            for entry in &manifest.entries {
                assert!(entry.line >= 1);
            }
        }
        Err(e) => {
            let lines = data.split(|b| *b == b'\n').count().max(1);
            assert!(e.line <= lines + 1, "line {} of {lines}", e.line);
            assert!(e.message.len() <= 4096, "an unbounded message");
        }
    }
});
