//! The admin web UI's settings (`ingest serve`, pages under `/ui`).

use std::time::Duration;

/// Seconds of inactivity after which a UI session ends, by default.
pub const DEFAULT_UI_SESSION_IDLE_SECS: u64 = 30 * 60;
/// Seconds after login at which a UI session ends whatever happens, by default.
pub const DEFAULT_UI_SESSION_MAX_SECS: u64 = 12 * 60 * 60;

/// The admin web UI's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UiSettings {
    /// Mark the session cookie `Secure` (set it when the server is reached
    /// over https, e.g. behind a TLS proxy).
    pub secure_cookies: bool,
    /// A session unused this long ends.
    pub session_idle: Duration,
    /// A session ends this long after login, used or not.
    pub session_max: Duration,
}

impl Default for UiSettings {
    fn default() -> Self {
        UiSettings {
            secure_cookies: false,
            session_idle: Duration::from_secs(DEFAULT_UI_SESSION_IDLE_SECS),
            session_max: Duration::from_secs(DEFAULT_UI_SESSION_MAX_SECS),
        }
    }
}
