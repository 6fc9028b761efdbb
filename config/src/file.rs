//! The configuration file: its schema (YAML or TOML, one schema for `serve`
//! and `worker`), reading it, and layering it under the environment and
//! the flags, key by key.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::*;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileConfig {
    pub(crate) data_dir: Option<PathBuf>,
    pub(crate) listen: Option<String>,
    pub(crate) lifecycle: Option<PathBuf>,
    pub(crate) log_format: Option<String>,
    pub(crate) profiles_dir: Option<PathBuf>,
    #[serde(default)]
    pub(crate) tokens: FileTokens,
    #[serde(default)]
    pub(crate) zookeeper: FileZooKeeper,
    #[serde(default)]
    pub(crate) daemons: BTreeMap<String, FileDaemon>,
    #[serde(default)]
    pub(crate) provisioning: FileProvisioning,
    #[serde(default)]
    pub(crate) http: FileHttp,
    #[serde(default)]
    pub(crate) ui: FileUi,
    /// `--steps`, `--step-ms`, `--failure-rate`, `--seed` ([`StepsArgs`]).
    pub(crate) steps: Option<serde_json::Value>,
    /// The real steps' options ([`RealArgs`]).
    pub(crate) real_steps: Option<serde_json::Value>,
    /// `--naan`, `--shoulder`, `--ezid-*` ([`IdArgs`]).
    pub(crate) ids: Option<serde_json::Value>,
    /// Snapshots and signed checkpoints ([`crate::ArchiveArgs`]).
    pub(crate) archive: Option<serde_json::Value>,
    /// Several engines on one root ([`crate::ReplicationArgs`]).
    pub(crate) replication: Option<serde_json::Value>,
    /// `ingest worker`'s own settings ([`FileWorker`]).
    #[serde(default)]
    pub(crate) worker: FileWorker,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileTokens {
    pub(crate) admin_file: Option<PathBuf>,
    pub(crate) depositor_file: Option<PathBuf>,
    pub(crate) worker_file: Option<PathBuf>,
    pub(crate) metrics_file: Option<PathBuf>,
    pub(crate) admins_file: Option<PathBuf>,
    pub(crate) depositors_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileZooKeeper {
    pub(crate) hosts: Option<String>,
    pub(crate) root: Option<String>,
    pub(crate) session_timeout_secs: Option<f64>,
    pub(crate) request_timeout_secs: Option<f64>,
    pub(crate) auth_file: Option<PathBuf>,
    pub(crate) worker_identity: Option<String>,
    pub(crate) merritt_identity: Option<String>,
    pub(crate) open_object_locks: Option<bool>,
    pub(crate) foreign_writes: Option<crate::ForeignWrites>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileDaemon {
    pub(crate) enabled: Option<bool>,
    pub(crate) tasks: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileProvisioning {
    pub(crate) threshold_percent: Option<Percent>,
    pub(crate) working_storage: Option<PathBuf>,
}

/// `70`, `70.5` or `"70%"`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum Percent {
    Number(f64),
    Text(String),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileHttp {
    pub(crate) max_body_bytes: Option<usize>,
    pub(crate) max_record_bytes: Option<usize>,
    pub(crate) header_read_timeout_secs: Option<u64>,
    pub(crate) max_connections: Option<usize>,
    pub(crate) max_connections_per_client: Option<usize>,
    pub(crate) listing_items_per_second: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileUi {
    pub(crate) secure_cookies: Option<bool>,
    pub(crate) session_idle_secs: Option<u64>,
    pub(crate) session_max_secs: Option<u64>,
}

/// A value and where it came from.
pub(crate) struct Layered<T> {
    pub(crate) value: T,
    pub(crate) origin: Origin,
}

/// The flag (or its variable, which clap merged into it) wins over the file.
pub(crate) fn layer<T>(
    file: Option<T>,
    over: Option<T>,
    file_origin: &Origin,
    flag: &'static str,
) -> Option<Layered<T>> {
    match (over, file) {
        (Some(value), _) => Some(Layered {
            value,
            origin: Origin::Override(flag),
        }),
        (None, Some(value)) => Some(Layered {
            value,
            origin: file_origin.clone(),
        }),
        (None, None) => None,
    }
}

/// A number layered like [`layer`], defaulted, and refused (naming where
/// it came from and `key`) unless it lies in `range`; `unit` ends the
/// reason ("seconds", or "" for a count).
pub(crate) fn layer_in<T>(
    (file, over): (Option<T>, Option<T>),
    file_origin: &Origin,
    (flag, key): (&'static str, &str),
    default: T,
    range: std::ops::RangeInclusive<T>,
    unit: &str,
) -> Result<T, crate::ConfigError>
where
    T: PartialOrd + std::fmt::Display + Copy,
{
    let l = layer(file, over, file_origin, flag).unwrap_or(Layered {
        value: default,
        origin: Origin::Default,
    });
    if range.contains(&l.value) {
        Ok(l.value)
    } else {
        Err(crate::error::invalid(
            &l.origin,
            key,
            format!(
                "{} is outside {}-{}{}{unit}",
                l.value,
                range.start(),
                range.end(),
                if unit.is_empty() { "" } else { " " }
            ),
        ))
    }
}

/// The `worker:` section of the configuration file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileWorker {
    /// `--name`.
    pub(crate) name: Option<String>,
    /// `--daemons`, one entry per daemon.
    #[serde(default)]
    pub(crate) daemons: Vec<String>,
    /// `--token-file`.
    pub(crate) token_file: Option<PathBuf>,
    /// `--metrics-listen`.
    pub(crate) metrics_listen: Option<String>,
}

/// A section of the configuration file that mirrors a group of flags
/// (`steps`, `real_steps`, `ids`): one parser for each setting, clap's, and
/// the file's keys are the flags' names with `_` for `-`.
pub(crate) struct Section<'a> {
    pub(crate) name: &'static str,
    pub(crate) origin: &'a Origin,
    pub(crate) given: &'a std::collections::BTreeSet<String>,
    /// The file's text, to say on which line a key is.
    pub(crate) text: &'a str,
}

impl Section<'_> {
    /// The line of `key` inside this section (YAML `key:` or TOML `key =`),
    /// counted from 1.
    pub(crate) fn line_of(&self, key: &str) -> Option<usize> {
        let lines: Vec<&str> = self.text.lines().collect();
        let start = lines.iter().position(|l| {
            let t = l.trim();
            t.starts_with(&format!("{}:", self.name)) || t == format!("[{}]", self.name)
        })?;
        lines[start + 1..]
            .iter()
            .position(|l| {
                let t = l.trim_start();
                t.strip_prefix(key)
                    .is_some_and(|rest| rest.trim_start().starts_with([':', '=']))
            })
            .map(|i| start + 2 + i)
    }

    /// The flags' values, with every key of the file's section that the
    /// command line and the environment did not set.
    ///
    /// # Errors
    /// An unknown key or a value of the wrong type, naming the section and
    /// the key.
    pub(crate) fn merge<T: Serialize + serde::de::DeserializeOwned>(
        &self,
        flags: &T,
        section: Option<&serde_json::Value>,
    ) -> Result<T, ConfigError> {
        let Some(section) = section else {
            return serde_json::to_value(flags)
                .and_then(serde_json::from_value)
                .map_err(|e| invalid(self.origin, self.name, e.to_string()));
        };
        let serde_json::Value::Object(entries) = section else {
            return Err(invalid(
                self.origin,
                self.name,
                "is a section: give it keys, one per option",
            ));
        };
        let mut merged = serde_json::to_value(flags)
            .map_err(|e| invalid(self.origin, self.name, e.to_string()))?;
        let known: Vec<String> = merged
            .as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        for (key, value) in entries {
            let field = format!("{}.{key}", self.name);
            let at = |reason: String| match self.line_of(key) {
                Some(line) => format!("line {line}: {reason}"),
                None => reason,
            };
            if !known.contains(key) {
                return Err(invalid(
                    self.origin,
                    &field,
                    at(format!(
                        "unknown key; the keys of `{}` are {}",
                        self.name,
                        known.join(", ")
                    )),
                ));
            }
            if self.given.contains(key) {
                continue;
            }
            let mut next = merged.clone();
            if let Some(o) = next.as_object_mut() {
                o.insert(key.clone(), value.clone());
            }
            // Checked key by key, so a wrong type names its key.
            serde_json::from_value::<T>(next.clone())
                .map_err(|e| invalid(self.origin, &field, at(e.to_string())))?;
            merged = next;
        }
        serde_json::from_value(merged).map_err(|e| invalid(self.origin, self.name, e.to_string()))
    }
}

pub(crate) fn read_config_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let what = "configuration file";
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })?;
    let parse_err = |message: String| ConfigError::Parse {
        what,
        path: path.to_path_buf(),
        message,
    };
    match ext.as_deref() {
        Some("yaml" | "yml") => {
            if text.trim().is_empty() {
                return Ok(FileConfig::default());
            }
            serde_norway::from_str(&text).map_err(|e| parse_err(e.to_string()))
        }
        Some("toml") => toml::from_str(&text).map_err(|e| parse_err(e.to_string())),
        _ => Err(parse_err(
            "the format is chosen by the extension: .yaml, .yml or .toml".into(),
        )),
    }
}

pub(crate) fn check_zk_hosts(hosts: &str) -> Result<(), ValueError> {
    let hosts = hosts.trim();
    if hosts.is_empty() {
        return Err(ValueError::NoHosts);
    }
    // A chroot belongs in zookeeper.root, not in the connect string.
    if hosts.contains('/') {
        return Err(ValueError::HostsWithChroot(hosts.to_string()));
    }
    for h in hosts.split(',') {
        let h = h.trim();
        let Some((host, port)) = h.rsplit_once(':') else {
            return Err(ValueError::NotHostPort(h.to_string()));
        };
        if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(ValueError::NotHostPort(h.to_string()));
        }
    }
    Ok(())
}

pub(crate) fn parse_percent(p: &Percent) -> Result<f64, ValueError> {
    let v = match p {
        Percent::Number(n) => *n,
        Percent::Text(t) => t
            .trim()
            .trim_end_matches('%')
            .trim()
            .parse::<f64>()
            .map_err(|_| ValueError::NotPercent(t.clone()))?,
    };
    if !(v.is_finite() && v > 0.0 && v <= 100.0) {
        return Err(ValueError::PercentOutOfRange(v));
    }
    Ok(v)
}
