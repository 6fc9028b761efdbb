//! Collection profiles as the server loads them and answers them
//! (`GET /collections/{profile}`), and as workers read their notification
//! settings.

use serde::{Deserialize, Serialize};

/// A collection profile: one YAML file in the profiles directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// The profile name depositors submit with (a ZooKeeper path segment).
    pub name: String,
    /// The priority of the collection's jobs (0–99, lower runs first); when
    /// absent, a batch's priority comes from its size.
    #[serde(default)]
    pub priority: Option<u8>,
    /// How the depositor is notified.
    #[serde(default)]
    pub notification: Notification,
}

/// A profile's notification settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Notification {
    /// A URL called when each job completes.
    #[serde(default)]
    pub callback_url: Option<String>,
    /// Who gets the batch reports by e-mail.
    #[serde(default)]
    pub emails: Vec<String>,
    /// Whether a summary is e-mailed when a batch's jobs are queued.
    #[serde(default)]
    pub summary_at_queueing: bool,
}
