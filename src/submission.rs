//! Submissions as depositors write them (a YAML/JSON file or CLI options),
//! and the simple expansion of a submission into jobs.
//!
//! The expansion here handles the simple forms: an inline manifest of
//! `URL [LOCAL_ID [ARK]]` lines (one job per line, as in the transitions
//! document) or a single payload URL (one job). Full Checkm manifests come
//! with the real ingest steps.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use ingest_events::command::JobSpec;
use ingest_events::event::{Digest, Erc, Identifiers, PayloadType, Submission, SubmissionMode};
use serde::{Deserialize, Serialize};

/// A submission as a depositor writes it. Field names follow the transitions
/// document (`profile`, `type`, `payload_url`, `manifest`, `erc_*`).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SubmissionInput {
    /// Who submits.
    pub submitter: Option<String>,
    /// The collection profile.
    #[serde(alias = "profile_name")]
    pub profile: Option<String>,
    /// The payload type (`file`, `container`, `object-manifest`, …).
    #[serde(rename = "type", alias = "payload_type")]
    pub payload_type: Option<String>,
    /// The payload URL.
    pub payload_url: Option<String>,
    /// `add` or `update`.
    pub submission_mode: Option<String>,
    /// The response type.
    pub response_type: Option<String>,
    /// Inline manifest lines.
    #[serde(default)]
    pub manifest: Vec<String>,
    /// ERC who.
    pub erc_who: Option<String>,
    /// ERC what (title).
    pub erc_what: Option<String>,
    /// ERC when (date).
    pub erc_when: Option<String>,
    /// ERC where (local id).
    pub erc_where: Option<String>,
    /// `ALGORITHM:HEX`, the depositor's digest of a single-file payload.
    pub digest: Option<String>,
    /// Further fields, kept as given.
    #[serde(default)]
    pub extra: BTreeMap<String, String>,
}

impl SubmissionInput {
    /// Reads a submission file (YAML or JSON).
    ///
    /// # Errors
    /// When the file cannot be read or parsed; the message names the file and
    /// the line.
    pub fn from_file(path: &Path) -> Result<SubmissionInput> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read submission file {}", path.display()))?;
        serde_norway::from_str(&text)
            .with_context(|| format!("invalid submission file {}", path.display()))
    }

    /// Fills fields missing here from `other` (options override the file).
    pub fn or(self, other: SubmissionInput) -> SubmissionInput {
        SubmissionInput {
            submitter: self.submitter.or(other.submitter),
            profile: self.profile.or(other.profile),
            payload_type: self.payload_type.or(other.payload_type),
            payload_url: self.payload_url.or(other.payload_url),
            submission_mode: self.submission_mode.or(other.submission_mode),
            response_type: self.response_type.or(other.response_type),
            manifest: if self.manifest.is_empty() {
                other.manifest
            } else {
                self.manifest
            },
            erc_who: self.erc_who.or(other.erc_who),
            erc_what: self.erc_what.or(other.erc_what),
            erc_when: self.erc_when.or(other.erc_when),
            erc_where: self.erc_where.or(other.erc_where),
            digest: self.digest.or(other.digest),
            extra: if self.extra.is_empty() {
                other.extra
            } else {
                self.extra
            },
        }
    }

    /// Checks required fields and builds the submission.
    ///
    /// # Errors
    /// Names the missing or invalid field.
    pub fn build(self) -> Result<Submission> {
        let Some(profile_name) = self.profile else {
            bail!("missing field `profile` (the collection profile)")
        };
        let Some(submitter) = self.submitter else {
            bail!("missing field `submitter`")
        };
        let payload_url = self.payload_url.unwrap_or_default();
        if payload_url.is_empty() && self.manifest.is_empty() {
            bail!("missing field `payload_url` (or inline `manifest` lines)");
        }
        let payload_type = match self.payload_type {
            Some(t) => t
                .parse::<PayloadType>()
                .map_err(anyhow::Error::msg)
                .context("invalid field `type`")?,
            None if !self.manifest.is_empty() => PayloadType::ObjectManifest,
            None => PayloadType::File,
        };
        let submission_mode = match self.submission_mode {
            Some(m) => m
                .parse::<SubmissionMode>()
                .map_err(anyhow::Error::msg)
                .context("invalid field `submission_mode`")?,
            None => SubmissionMode::Add,
        };
        let digest = self
            .digest
            .map(|d| parse_digest(&d))
            .transpose()
            .context("invalid field `digest`")?;
        Ok(Submission {
            profile_name,
            submitter,
            payload_url,
            payload_type,
            response_type: self.response_type.unwrap_or_else(|| "json".into()),
            submission_mode,
            manifest: self.manifest,
            erc: Erc {
                who: self.erc_who,
                what: self.erc_what,
                when: self.erc_when,
                r#where: self.erc_where,
            },
            digest,
            extra: self.extra,
        })
    }
}

/// Parses `ALGORITHM:HEX`.
///
/// # Errors
/// When there is no colon.
pub fn parse_digest(text: &str) -> Result<Digest> {
    let Some((algorithm, value)) = text.split_once(':') else {
        bail!("{text:?} is not ALGORITHM:HEX (e.g. sha256:9f86d0…)");
    };
    Ok(Digest {
        algorithm: algorithm.trim().to_ascii_lowercase(),
        value: value.trim().to_ascii_lowercase(),
    })
}

/// Expands a submission into jobs, for the simple forms: one job per inline
/// manifest line (`URL [LOCAL_ID [ARK]]`), else one job for the payload URL.
///
/// # Errors
/// Names the manifest line that has too many fields.
pub fn expand_simple(s: &Submission) -> Result<Vec<JobSpec>> {
    if s.manifest.is_empty() {
        let local_ids = s
            .erc
            .r#where
            .iter()
            .flat_map(|w| split_local_ids(w))
            .collect();
        return Ok(vec![JobSpec {
            payload_url: s.payload_url.clone(),
            payload_type: s.payload_type,
            identifiers: Identifiers {
                primary_id: None,
                local_ids,
            },
            metadata: s.erc.clone(),
            digest: s.digest.clone(),
            priority: None,
        }]);
    }
    s.manifest
        .iter()
        .enumerate()
        .map(|(i, line)| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (url, local, ark) = match fields.as_slice() {
                [url] => (*url, None, None),
                [url, local] => (*url, Some(*local), None),
                [url, local, ark] => (*url, Some(*local), Some(*ark)),
                _ => bail!(
                    "manifest line {}: {line:?} has {} fields; expected URL [LOCAL_ID [ARK]]",
                    i + 1,
                    fields.len()
                ),
            };
            Ok(JobSpec {
                payload_url: url.to_string(),
                payload_type: s.payload_type,
                identifiers: Identifiers {
                    primary_id: ark.map(str::to_string),
                    local_ids: local.map(split_local_ids).unwrap_or_default(),
                },
                metadata: Erc {
                    who: s.erc.who.clone(),
                    what: s.erc.what.clone(),
                    when: s.erc.when.clone(),
                    r#where: local.map(str::to_string),
                },
                digest: None,
                priority: None,
            })
        })
        .collect()
}

/// Local ids are `;`-separated (Merritt's `mrt:localIdentifier`).
pub fn split_local_ids(text: &str) -> Vec<String> {
    text.split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}
