//! Placeholder, replaced by the log benchmarks.
fn main() {}
