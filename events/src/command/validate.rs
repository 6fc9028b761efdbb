//! Input checks at the door: every field of a submission and a job spec,
//! bounded and validated before anything is decided.

use crate::event::{Digest, Identifiers, Submission};

use super::*;

pub(super) fn validate_identifiers(ids: &Identifiers) -> Result<(), Rejection> {
    let bytes = ids.primary_id.as_ref().map_or(0, String::len)
        + ids.local_ids.iter().map(String::len).sum::<usize>();
    check_size("identifiers", bytes, MAX_JOB_FIELD_BYTES)?;
    if let Some(p) = &ids.primary_id {
        check_text("primary_id", p)?;
    }
    for l in &ids.local_ids {
        check_text("local_id", l)?;
    }
    Ok(())
}

pub(super) fn check_priority(p: u8) -> Result<(), Rejection> {
    if p > MAX_PRIORITY {
        return Err(Rejection::Invalid {
            field: "priority".into(),
            reason: format!("{p} is outside 0-{MAX_PRIORITY}"),
        });
    }
    Ok(())
}

/// Whether ZooKeeper accepts the character in a path segment (its
/// `PathUtils.validatePath` refuses surrogates, private use, U+FFF0–U+FFFF,
/// anything above the BMP, and control characters).
pub(super) fn zookeeper_path_char(c: char) -> bool {
    let u = c as u32;
    !(u == 0
        || (0x1..=0x1f).contains(&u)
        || (0x7f..=0x9f).contains(&u)
        || (0xd800..=0xf8ff).contains(&u)
        || (0xfff0..=0xffff).contains(&u)
        || u > 0xffff)
}

/// A profile name becomes a ZooKeeper path segment (`/locks/collections/<profile>`).
pub(super) fn check_profile(profile: &str) -> Result<(), Rejection> {
    let bad = |reason: &str| Rejection::Invalid {
        field: "profile".into(),
        reason: format!("{profile:?} {reason}"),
    };
    if profile.is_empty() {
        return Err(bad("is empty"));
    }
    if profile.len() > 200 {
        return Err(bad("is longer than 200 characters"));
    }
    if profile == "."
        || profile == ".."
        || profile.contains('/')
        || profile
            .chars()
            .any(|c| c.is_control() || !zookeeper_path_char(c))
    {
        return Err(bad(
            "must be a single ZooKeeper path segment: no '/', no control, private-use or non-BMP characters, not '.' or '..'",
        ));
    }
    Ok(())
}

pub(super) fn check_text(field: &str, value: &str) -> Result<(), Rejection> {
    if value.chars().any(|c| c.is_control() && c != '\t') {
        return Err(Rejection::Invalid {
            field: field.into(),
            reason: format!("{value:?} contains control characters"),
        });
    }
    Ok(())
}

/// The most text a submission may carry (its fields, manifest lines and
/// extra fields together). It is projected into one ZooKeeper node, which
/// must stay well under ZooKeeper's 1 MiB `jute.maxbuffer`.
pub const MAX_SUBMISSION_BYTES: usize = 512 * 1024;

/// The most text one job's payload URL, identifiers or metadata may carry.
pub const MAX_JOB_FIELD_BYTES: usize = 64 * 1024;

pub(super) fn submission_bytes(s: &Submission) -> usize {
    let erc = [&s.erc.who, &s.erc.what, &s.erc.when, &s.erc.r#where];
    s.profile_name.len()
        + s.submitter.len()
        + s.payload_url.len()
        + s.response_type.len()
        + s.manifest.iter().map(|l| l.len() + 3).sum::<usize>()
        + erc
            .iter()
            .map(|e| e.as_ref().map_or(0, String::len))
            .sum::<usize>()
        + s.digest
            .as_ref()
            .map_or(0, |d| d.algorithm.len() + d.value.len())
        + s.extra
            .iter()
            .map(|(k, v)| k.len() + v.len() + 6)
            .sum::<usize>()
}

pub(super) fn check_size(field: &str, bytes: usize, limit: usize) -> Result<(), Rejection> {
    if bytes > limit {
        return Err(Rejection::Invalid {
            field: field.into(),
            reason: format!("is {bytes} bytes; at most {limit} are accepted"),
        });
    }
    Ok(())
}

pub(super) fn validate_submission(s: &Submission) -> Result<(), Rejection> {
    check_size("submission", submission_bytes(s), MAX_SUBMISSION_BYTES)?;
    check_profile(&s.profile_name)?;
    let required = |field: &str, v: &str| {
        if v.trim().is_empty() {
            Err(Rejection::Invalid {
                field: field.into(),
                reason: "is required".into(),
            })
        } else {
            check_text(field, v)
        }
    };
    required("submitter", &s.submitter)?;
    // What becomes one job's field is held to the job's limits here, at the
    // door: a submission the engine accepts must not hold a job it would
    // refuse to create when the batch is acquired.
    check_size("payload_url", s.payload_url.len(), MAX_JOB_FIELD_BYTES)?;
    let erc = [&s.erc.who, &s.erc.what, &s.erc.when, &s.erc.r#where];
    check_size(
        "erc_who, erc_what, erc_when and erc_where together",
        erc.iter().map(|e| e.as_ref().map_or(0, String::len)).sum(),
        MAX_JOB_FIELD_BYTES,
    )?;
    for (i, line) in s.manifest.iter().enumerate() {
        check_size(
            &format!("manifest line {}", i + 1),
            line.len(),
            MAX_JOB_FIELD_BYTES,
        )?;
    }
    if s.manifest.is_empty() {
        required("payload_url", &s.payload_url)?;
    }
    check_text("payload_url", &s.payload_url)?;
    for (i, line) in s.manifest.iter().enumerate() {
        if line.trim().is_empty() {
            return Err(Rejection::Invalid {
                field: format!("manifest line {}", i + 1),
                reason: "is empty".into(),
            });
        }
        check_text(&format!("manifest line {}", i + 1), line)?;
    }
    if let Some(d) = &s.digest {
        validate_digest(d)?;
    }
    for key in s.extra.keys() {
        if is_reserved_submission_key(key) {
            return Err(Rejection::Invalid {
                field: format!("extra.{key}"),
                reason: format!("{key:?} is a submission field of its own; give it as that field"),
            });
        }
        check_text(&format!("extra.{key}"), key)?;
    }
    Ok(())
}

/// The keys Merritt's own readers use, written beside the documented ones in
/// the submission and configuration nodes, in the order they are written;
/// extra fields may not shadow them either.
pub const MERRITT_READER_KEYS: [&str; 6] = [
    "profile",
    "submissionDate",
    "filename",
    "responseForm",
    "title",
    "creator",
];

/// Whether an extra submission field named `key` would shadow a key of the
/// projected node.
pub fn is_reserved_submission_key(key: &str) -> bool {
    RESERVED_SUBMISSION_KEYS.contains(&key) || MERRITT_READER_KEYS.contains(&key)
}

/// Keys of the projected submission node that extra fields may not shadow.
pub const RESERVED_SUBMISSION_KEYS: [&str; 14] = [
    "profile_name",
    "submitter",
    "payload_url",
    "type",
    "response_type",
    "submission_mode",
    "erc_who",
    "erc_what",
    "erc_when",
    "erc_where",
    "batchID",
    "manifest",
    "digest_type",
    "digest_value",
];

/// Checks one job of an expansion as the engine does when it creates the
/// job (sizes, required fields, text): a batch whose expansion holds a job
/// that fails this can be failed with the reason rather than refused for
/// ever.
///
/// # Errors
/// [`Rejection::Invalid`] naming the field.
pub fn validate_spec(spec: &JobSpec) -> Result<(), Rejection> {
    check_size("payload_url", spec.payload_url.len(), MAX_JOB_FIELD_BYTES)?;
    let ids = spec.identifiers.primary_id.as_ref().map_or(0, String::len)
        + spec
            .identifiers
            .local_ids
            .iter()
            .map(String::len)
            .sum::<usize>();
    check_size("identifiers", ids, MAX_JOB_FIELD_BYTES)?;
    let m = &spec.metadata;
    let meta: usize = [&m.who, &m.what, &m.when, &m.r#where]
        .iter()
        .map(|e| e.as_ref().map_or(0, String::len))
        .sum();
    check_size("metadata", meta, MAX_JOB_FIELD_BYTES)?;
    if spec.payload_url.trim().is_empty() {
        return Err(Rejection::Invalid {
            field: "payload_url".into(),
            reason: "is required".into(),
        });
    }
    check_text("payload_url", &spec.payload_url)?;
    if let Some(p) = spec.priority {
        check_priority(p)?;
    }
    if let Some(d) = &spec.digest {
        validate_digest(d)?;
    }
    Ok(())
}

/// The digest algorithms a depositor may name, with their hex lengths.
pub const DIGEST_ALGORITHMS: [(&str, usize); 4] =
    [("md5", 32), ("sha1", 40), ("sha256", 64), ("sha512", 128)];

pub(super) fn validate_digest(d: &Digest) -> Result<(), Rejection> {
    let Some((_, len)) = DIGEST_ALGORITHMS
        .iter()
        .find(|(a, _)| a.eq_ignore_ascii_case(&d.algorithm))
    else {
        return Err(Rejection::Invalid {
            field: "digest.algorithm".into(),
            reason: format!("{:?} is not one of md5, sha1, sha256, sha512", d.algorithm),
        });
    };
    if d.value.len() != *len || !d.value.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Rejection::Invalid {
            field: "digest.value".into(),
            reason: format!(
                "a {} digest is {len} hex digits, got {:?}",
                d.algorithm, d.value
            ),
        });
    }
    Ok(())
}
