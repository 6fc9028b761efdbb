//! What the storage benches read from their command line.

/// The sizes named on the command line (`cargo bench --bench B -- 10 20`),
/// or `defaults`; `None` when the binary is not run by `cargo bench`
/// (cargo passes `--bench` only then): as a test target (`cargo test
/// --all-targets`, nextest's `--list`) a bench must print nothing and do
/// nothing.
pub fn sizes<T: std::str::FromStr + Clone>(defaults: &[T]) -> Option<Vec<T>> {
    if !std::env::args().any(|a| a == "--bench") {
        return None;
    }
    let given: Vec<T> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    Some(if given.is_empty() {
        defaults.to_vec()
    } else {
        given
    })
}
