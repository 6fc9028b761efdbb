//! The worker daemons a process runs: [`DaemonKind`], and the one grammar
//! `NAME=off|on|TASKS` of `serve --daemons`, `worker --daemons` and
//! `INGEST_DAEMONS`.

use std::collections::BTreeMap;
use std::fmt;

use clap::ValueEnum;
use ingest_events::JobState;
use serde::Serialize;

use crate::file::*;
use crate::*;

/// The daemons `ingest serve` can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, ValueEnum)]
pub enum DaemonKind {
    /// Acquires pending batches and expands them into jobs.
    BatchPending,
    /// Reports batches whose jobs have all finished.
    BatchReporting,
    /// Sends update reports of failed batches.
    BatchUpdateReporting,
    /// Starts pending jobs (Pending → Estimating).
    JobPending,
    /// The Estimating step.
    Estimating,
    /// The Provisioning step.
    Provisioning,
    /// The Downloading step.
    Downloading,
    /// The Processing step.
    Processing,
    /// The Storing step.
    Storing,
    /// The Recording step.
    Recording,
    /// The Notify step.
    Notify,
    /// Takes assembly requests of the small access queue (`/access/small`).
    AccessSmall,
    /// Takes assembly requests of the large access queue (`/access/large`).
    AccessLarge,
}

impl DaemonKind {
    /// Every daemon.
    pub const ALL: [DaemonKind; 13] = [
        DaemonKind::BatchPending,
        DaemonKind::BatchReporting,
        DaemonKind::BatchUpdateReporting,
        DaemonKind::JobPending,
        DaemonKind::Estimating,
        DaemonKind::Provisioning,
        DaemonKind::Downloading,
        DaemonKind::Processing,
        DaemonKind::Storing,
        DaemonKind::Recording,
        DaemonKind::Notify,
        DaemonKind::AccessSmall,
        DaemonKind::AccessLarge,
    ];

    /// The name used in the file, in `--daemon` and in `INGEST_DAEMONS`.
    pub fn name(self) -> &'static str {
        match self {
            DaemonKind::BatchPending => "batch_pending",
            DaemonKind::BatchReporting => "batch_reporting",
            DaemonKind::BatchUpdateReporting => "batch_update_reporting",
            DaemonKind::JobPending => "job_pending",
            DaemonKind::Estimating => "estimating",
            DaemonKind::Provisioning => "provisioning",
            DaemonKind::Downloading => "downloading",
            DaemonKind::Processing => "processing",
            DaemonKind::Storing => "storing",
            DaemonKind::Recording => "recording",
            DaemonKind::Notify => "notify",
            DaemonKind::AccessSmall => "access_small",
            DaemonKind::AccessLarge => "access_large",
        }
    }

    /// Looks a daemon up by name (`-` and `_` alike, any case).
    pub fn from_name(name: &str) -> Option<DaemonKind> {
        let folded = name.trim().to_ascii_lowercase().replace('-', "_");
        Self::ALL.into_iter().find(|d| d.name() == folded)
    }

    /// The daemon that works on jobs in `state`, if one does.
    pub fn for_job_state(state: JobState) -> Option<DaemonKind> {
        match state {
            JobState::Pending => Some(DaemonKind::JobPending),
            JobState::Estimating => Some(DaemonKind::Estimating),
            JobState::Provisioning => Some(DaemonKind::Provisioning),
            JobState::Downloading => Some(DaemonKind::Downloading),
            JobState::Processing => Some(DaemonKind::Processing),
            JobState::Storing => Some(DaemonKind::Storing),
            JobState::Recording => Some(DaemonKind::Recording),
            JobState::Notify => Some(DaemonKind::Notify),
            _ => None,
        }
    }

    pub(crate) fn names() -> String {
        Self::ALL.map(DaemonKind::name).join(", ")
    }
}

impl fmt::Display for DaemonKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One daemon's switch and concurrency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DaemonSettings {
    /// Whether it runs.
    pub enabled: bool,
    /// How many tasks it runs at once (at least 1).
    pub tasks: u32,
}

impl Default for DaemonSettings {
    fn default() -> DaemonSettings {
        DaemonSettings {
            enabled: true,
            tasks: 1,
        }
    }
}

/// Every daemon's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Daemons(BTreeMap<DaemonKind, DaemonSettings>);

impl Default for Daemons {
    fn default() -> Daemons {
        Daemons(
            DaemonKind::ALL
                .into_iter()
                .map(|d| (d, DaemonSettings::default()))
                .collect(),
        )
    }
}

impl Daemons {
    /// One daemon's settings.
    pub fn get(&self, kind: DaemonKind) -> DaemonSettings {
        self.0.get(&kind).copied().unwrap_or_default()
    }

    /// Every daemon with its settings.
    pub fn iter(&self) -> impl Iterator<Item = (DaemonKind, DaemonSettings)> + '_ {
        self.0.iter().map(|(k, v)| (*k, *v))
    }
}

/// Parses one `NAME=off|on|TASKS` setting, the one grammar of `serve
/// --daemons`, `worker --daemons` and `INGEST_DAEMONS`. A bare `NAME` is
/// `NAME=on`; a job state's name (`downloading`) names its daemon.
///
/// # Errors
/// What is wrong with the setting.
pub fn parse_daemon(text: &str) -> Result<(DaemonKind, DaemonSettings), ValueError> {
    let (kind, spec) = parse_daemon_setting(text)?;
    let mut settings = DaemonSettings::default();
    if let Some(e) = spec.enabled {
        settings.enabled = e;
    }
    if let Some(t) = spec.tasks {
        if t == 0 || t > MAX_DAEMON_TASKS {
            return Err(ValueError::TaskCount {
                text: text.to_string(),
                max: MAX_DAEMON_TASKS,
            });
        }
        settings.tasks = t;
    }
    Ok((kind, settings))
}

pub(crate) fn parse_daemon_setting(text: &str) -> Result<(DaemonKind, DaemonSpec), ValueError> {
    let text = text.trim();
    let (name, spec) = text.split_once('=').unwrap_or((text, "on"));
    let lower = name.trim().to_ascii_lowercase();
    let kind = DaemonKind::from_name(&lower)
        .or_else(|| {
            lower
                .parse::<JobState>()
                .ok()
                .and_then(DaemonKind::for_job_state)
        })
        .ok_or_else(|| ValueError::NotADaemon {
            name: name.to_string(),
            known: DaemonKind::names(),
        })?;
    let spec = match spec.trim().to_ascii_lowercase().as_str() {
        "off" | "false" | "no" => DaemonSpec {
            enabled: Some(false),
            tasks: None,
        },
        "on" | "true" | "yes" => DaemonSpec {
            enabled: Some(true),
            tasks: None,
        },
        n => {
            let tasks = n.parse::<u32>().map_err(|_| ValueError::NotDaemonSpec {
                text: text.to_string(),
                spec: spec.to_string(),
            })?;
            DaemonSpec {
                enabled: Some(true),
                tasks: Some(tasks),
            }
        }
    };
    Ok((kind, spec))
}

pub(crate) struct DaemonSpec {
    pub(crate) enabled: Option<bool>,
    pub(crate) tasks: Option<u32>,
}

pub(crate) fn daemons(
    file: &BTreeMap<String, FileDaemon>,
    file_origin: &Origin,
    env: &dyn Fn(&str) -> Option<String>,
    flags: &[String],
) -> Result<Daemons, ConfigError> {
    let mut out = Daemons::default();
    let mut origins: BTreeMap<DaemonKind, Origin> = BTreeMap::new();
    let mut apply = |kind: DaemonKind, spec: DaemonSpec, origin: Origin| {
        let s = out.0.entry(kind).or_default();
        if let Some(e) = spec.enabled {
            s.enabled = e;
        }
        if let Some(t) = spec.tasks {
            s.tasks = t;
        }
        origins.insert(kind, origin);
    };
    for (name, d) in file {
        let kind = DaemonKind::from_name(name).ok_or_else(|| {
            invalid(
                file_origin,
                &format!("daemons.{name}"),
                format!("not a daemon (known: {})", DaemonKind::names()),
            )
        })?;
        apply(
            kind,
            DaemonSpec {
                enabled: d.enabled,
                tasks: d.tasks,
            },
            file_origin.clone(),
        );
    }
    if let Some(list) = env("INGEST_DAEMONS") {
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (kind, spec) = parse_daemon_setting(item)
                .map_err(|r| invalid(&Origin::Env("INGEST_DAEMONS"), "daemons", r))?;
            apply(kind, spec, Origin::Env("INGEST_DAEMONS"));
        }
    }
    for item in flags {
        let (kind, spec) = parse_daemon_setting(item)
            .map_err(|r| invalid(&Origin::Override("--daemon"), "daemons", r))?;
        apply(kind, spec, Origin::Override("--daemon"));
    }
    for (kind, s) in &out.0 {
        if s.tasks == 0 || s.tasks > MAX_DAEMON_TASKS {
            let origin = origins.get(kind).cloned().unwrap_or(Origin::Default);
            return Err(invalid(
                &origin,
                &format!("daemons.{kind}.tasks"),
                format!(
                    "{} is outside 1-{MAX_DAEMON_TASKS} (use enabled: false or {kind}=off to switch it off)",
                    s.tasks
                ),
            ));
        }
    }
    Ok(out)
}
