//! Submissions as depositors write them (a YAML/JSON file or CLI options),
//! and the simple expansion of a submission into jobs.
//!
//! The expansion here handles the simple forms: an inline manifest of
//! `URL [LOCAL_ID [ARK]]` lines (one job per line, as in the transitions
//! document) or a single payload URL (one job). Full Checkm manifests come
//! with the real ingest steps.

use std::collections::BTreeMap;

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
    /// The submission's uuid (Merritt's `batchID`), when the depositor
    /// gives one: a second submission with the same uuid is the same batch.
    /// The server makes one otherwise. A field of its own, so that the
    /// unknown-field error lists it among the accepted ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Further fields, kept as given.
    #[serde(default)]
    pub extra: BTreeMap<String, String>,
}

impl SubmissionInput {
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
            uuid: self.uuid.or(other.uuid),
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
    /// [`SubmissionError`] naming the missing or invalid field.
    pub fn build(self) -> Result<Submission, SubmissionError> {
        let Some(profile_name) = self.profile else {
            return Err(SubmissionError::Missing {
                field: "profile",
                hint: " (the collection profile)",
            });
        };
        let Some(submitter) = self.submitter else {
            return Err(SubmissionError::Missing {
                field: "submitter",
                hint: "",
            });
        };
        let payload_url = self.payload_url.unwrap_or_default();
        if payload_url.is_empty() && self.manifest.is_empty() {
            return Err(SubmissionError::Missing {
                field: "payload_url",
                hint: " (or inline `manifest` lines)",
            });
        }
        let payload_type = match self.payload_type {
            Some(t) => t
                .parse::<PayloadType>()
                .map_err(|m| SubmissionError::invalid("type", m.to_string()))?,
            None if !self.manifest.is_empty() => PayloadType::ObjectManifest,
            None => PayloadType::File,
        };
        let submission_mode = match self.submission_mode {
            Some(m) => m
                .parse::<SubmissionMode>()
                .map_err(|m| SubmissionError::invalid("submission_mode", m.to_string()))?,
            None => SubmissionMode::Add,
        };
        let digest = self
            .digest
            .map(|d| parse_digest(&d))
            .transpose()
            .map_err(|e| SubmissionError::invalid("digest", e.to_string()))?;
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
/// [`SubmissionError::Invalid`] (field `digest`) when there is no colon.
pub fn parse_digest(text: &str) -> Result<Digest, SubmissionError> {
    let Some((algorithm, value)) = text.split_once(':') else {
        return Err(SubmissionError::invalid(
            "digest",
            format!(
                "{} is not ALGORITHM:HEX (e.g. sha256:9f86d0…)",
                quoted(text)
            ),
        ));
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
/// [`SubmissionError::ManifestLine`] naming the line that has too many
/// fields.
pub fn expand_simple(s: &Submission) -> Result<Vec<JobSpec>, SubmissionError> {
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
                _ => {
                    return Err(SubmissionError::ManifestLine {
                        line: i + 1,
                        message: format!(
                            "{} has {} fields; expected URL [LOCAL_ID [ARK]]",
                            quoted(line),
                            fields.len()
                        ),
                    })
                }
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

/// Why a submission was refused. Each variant names the field (or manifest
/// line) at fault, so a caller never has to read it out of the message.
///
/// ### Handling
/// A client error: answer 422 naming [`SubmissionError::field`]; nothing is
/// appended. Retrying the same submission gives the same error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SubmissionError {
    /// A required field is absent.
    #[error("missing field `{field}`{hint}")]
    Missing {
        /// The field's name as depositors write it.
        field: &'static str,
        /// A hint on what the field is, starting with a space (or empty).
        hint: &'static str,
    },
    /// A field has a value that cannot be used.
    #[error("invalid field `{field}`: {message}")]
    Invalid {
        /// The field's name as depositors write it.
        field: String,
        /// What is wrong with it (bounded: any quoted input is cut).
        message: String,
    },
    /// An inline manifest line cannot be expanded.
    #[error("manifest line {line}: {message}")]
    ManifestLine {
        /// The line's number, from 1.
        line: usize,
        /// What is wrong with it (bounded: the line is quoted cut).
        message: String,
    },
}

impl SubmissionError {
    fn invalid(field: &str, message: impl Into<String>) -> SubmissionError {
        SubmissionError::Invalid {
            field: field.to_string(),
            message: message.into(),
        }
    }

    /// The field at fault, as an API error names it (`profile`,
    /// `manifest line 3`, …).
    pub fn field(&self) -> String {
        match self {
            SubmissionError::Missing { field, .. } => (*field).to_string(),
            SubmissionError::Invalid { field, .. } => field.clone(),
            SubmissionError::ManifestLine { line, .. } => format!("manifest line {line}"),
        }
    }
}

/// The longest piece of a depositor's input quoted in an error message.
pub const MAX_QUOTED_CHARS: usize = 200;

/// `text` as a Rust string literal, cut to [`MAX_QUOTED_CHARS`] characters
/// with a marker saying how much was cut, so no input is quoted whole.
pub fn quoted(text: &str) -> String {
    let total = text.chars().count();
    if total <= MAX_QUOTED_CHARS {
        return format!("{text:?}");
    }
    let head: String = text.chars().take(MAX_QUOTED_CHARS).collect();
    format!("{head:?}… ({} more characters)", total - MAX_QUOTED_CHARS)
}
