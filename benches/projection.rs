//! Placeholder, replaced by the projection throughput bench.
fn main() {}
