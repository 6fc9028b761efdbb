//! The file `ingest serve` keeps in its data directory while it runs, so a
//! CLI that finds the directory locked can say where the server is.

use std::path::Path;

/// The file `ingest serve` writes in its data directory while it runs, so
/// that a CLI that finds the directory locked can say where the server is.
pub const SERVER_FILE: &str = "serve.json";

/// What `ingest serve` records in [`SERVER_FILE`].
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ServerFile {
    /// The server's process id.
    pub pid: u32,
    /// Its API's base URL.
    pub url: String,
}

/// Reads the server file of `data_dir`, if a server wrote one.
pub fn server_file(data_dir: &Path) -> Option<ServerFile> {
    let text = std::fs::read_to_string(data_dir.join(SERVER_FILE)).ok()?;
    serde_json::from_str(&text).ok()
}

/// The hint added to "the log is in use" errors.
pub fn locked_hint(data_dir: &Path) -> String {
    match server_file(data_dir) {
        Some(s) => format!(
            "`ingest serve` (pid {}) holds {}; run the command through it: `ingest --engine {} …` (or set INGEST_ENGINE={}), with INGEST_ADMIN_TOKEN set to its admin token",
            s.pid,
            data_dir.display(),
            s.url,
            s.url
        ),
        None => format!(
            "another process holds {}; if it is `ingest serve`, run the command through it with `ingest --engine URL …` (or INGEST_ENGINE=URL) and INGEST_ADMIN_TOKEN",
            data_dir.display()
        ),
    }
}
