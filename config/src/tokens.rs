//! Bearer tokens: [`Secret`] never prints, comparisons take constant time,
//! and each role's token comes from a file or the environment, never a flag.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::*;

/// A secret (a bearer token). Its `Debug` output is redacted and it has no
/// `Display`, so it cannot end up in a log line by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The value, for the one place that must compare or send it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `presented` equals the secret, in time that depends only on
    /// the secret's length (not on where the first difference is).
    pub fn matches(&self, presented: &[u8]) -> bool {
        constant_time_eq(self.0.as_bytes(), presented)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Compares `expected` with `presented` in time that depends only on
/// `expected.len()`.
pub fn constant_time_eq(expected: &[u8], presented: &[u8]) -> bool {
    let mut diff: usize = expected.len() ^ presented.len();
    for (i, e) in expected.iter().enumerate() {
        let p = presented.get(i).copied().unwrap_or(0);
        diff |= usize::from(e ^ p);
    }
    std::hint::black_box(diff) == 0
}

/// The API's bearer tokens, one per role.
#[derive(Debug, Clone)]
pub struct Tokens {
    /// Admin routes (and depositor routes).
    pub admin: Secret,
    /// Depositor routes.
    pub depositor: Secret,
    /// Worker routes.
    pub worker: Secret,
    /// `/metrics`, when set; without it scraping needs no token.
    pub metrics: Option<Secret>,
    /// Admins with tokens of their own (recorded as `admin:NAME`); the
    /// shared `admin` token is recorded as `admin:admin`.
    pub admins: Vec<crate::NamedAdmin>,
    /// Depositors with tokens of their own, each limited to its collections
    /// (recorded as `depositor:NAME`); the shared `depositor` token still
    /// sees every collection. Empty: one depositor, the shared token.
    pub depositors: Vec<crate::NamedDepositor>,
}

impl Tokens {
    /// Every named admin's and depositor's token differs from every role's
    /// token and from each other's (a token names one identity). Messages
    /// name the admin or depositor, never a token.
    pub(crate) fn check_distinct(&self) -> Result<(), ConfigError> {
        let roles = [
            Some(&self.admin),
            Some(&self.depositor),
            Some(&self.worker),
            self.metrics.as_ref(),
        ];
        let refuse = |field: &str, who: &str, name: &str, other: &str| {
            Err(invalid(
                &Origin::Override("the tokens"),
                field,
                format!("{name}'s token is also {other}; each {who} needs their own"),
            ))
        };
        for admin in &self.admins {
            if roles.into_iter().flatten().any(|t| *t == admin.token) {
                return refuse("tokens.admins_file", "admin", &admin.name, "a role's token");
            }
        }
        for d in &self.depositors {
            if roles.into_iter().flatten().any(|t| *t == d.token) {
                return refuse(
                    "tokens.depositors_file",
                    "depositor",
                    &d.name,
                    "a role's token",
                );
            }
            if let Some(a) = self.admins.iter().find(|a| a.token == d.token) {
                let other = format!("admin {}'s token", a.name);
                return refuse("tokens.depositors_file", "depositor", &d.name, &other);
            }
        }
        Ok(())
    }
}

/// How one role's token is configured.
pub(crate) struct TokenSpec {
    pub(crate) role: &'static str,
    pub(crate) env: &'static str,
    pub(crate) file_env: &'static str,
    pub(crate) file_flag: &'static str,
    pub(crate) what: &'static str,
}

impl TokenSpec {
    pub(crate) const ADMIN: TokenSpec = TokenSpec {
        role: "admin",
        env: "INGEST_ADMIN_TOKEN",
        file_env: "INGEST_ADMIN_TOKEN_FILE",
        file_flag: "--admin-token-file or INGEST_ADMIN_TOKEN_FILE",
        what: "admin token file",
    };
    pub(crate) const DEPOSITOR: TokenSpec = TokenSpec {
        role: "depositor",
        env: "INGEST_DEPOSITOR_TOKEN",
        file_env: "INGEST_DEPOSITOR_TOKEN_FILE",
        file_flag: "--depositor-token-file or INGEST_DEPOSITOR_TOKEN_FILE",
        what: "depositor token file",
    };
    pub(crate) const WORKER: TokenSpec = TokenSpec {
        role: "worker",
        env: "INGEST_WORKER_TOKEN",
        file_env: "INGEST_WORKER_TOKEN_FILE",
        file_flag: "--worker-token-file or INGEST_WORKER_TOKEN_FILE",
        what: "worker token file",
    };
    pub(crate) const METRICS: TokenSpec = TokenSpec {
        role: "metrics",
        env: "INGEST_METRICS_TOKEN",
        file_env: "INGEST_METRICS_TOKEN_FILE",
        file_flag: "--metrics-token-file or INGEST_METRICS_TOKEN_FILE",
        what: "metrics token file",
    };
}

/// One role's token: `--X-token-file` (or `INGEST_X_TOKEN_FILE`) wins over
/// `INGEST_X_TOKEN`, which wins over the file's `tokens.X_file`.
pub(crate) fn token(
    spec: &TokenSpec,
    file_path: Option<PathBuf>,
    flag_path: Option<PathBuf>,
    file_origin: &Origin,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<Secret>, ConfigError> {
    let field = format!("tokens.{}_file", spec.role);
    let from_file = |path: &Path, origin: &Origin| -> Result<Secret, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            what: spec.what,
            path: path.to_path_buf(),
            source,
        })?;
        check_token(text.trim_end_matches(['\n', '\r']).trim(), origin, &field)
    };
    if let Some(path) = flag_path {
        return from_file(&path, &Origin::Override(spec.file_flag)).map(Some);
    }
    if let Some(value) = env(spec.env) {
        return check_token(value.trim(), &Origin::Env(spec.env), &field).map(Some);
    }
    match file_path {
        Some(path) => from_file(&path, file_origin).map(Some),
        None => Ok(None),
    }
}

/// The roles whose tokens a client (the CLI) reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokenRole {
    /// `INGEST_ADMIN_TOKEN_FILE`, else `INGEST_ADMIN_TOKEN`.
    Admin,
    /// `INGEST_DEPOSITOR_TOKEN_FILE`, else `INGEST_DEPOSITOR_TOKEN`.
    Depositor,
}

/// A client's token of `role` from the environment, read exactly as the
/// server reads its own ([`token`]: the `_FILE` variable wins over the
/// value, and the same checks apply), so a CLI and the server it talks to
/// never disagree on which token is meant.
///
/// # Errors
/// An unreadable file, or a token the server would refuse to start with
/// (too short, not printable ASCII); the token itself is never quoted.
pub fn token_from_env(role: TokenRole) -> Result<Option<Secret>, ConfigError> {
    let spec = match role {
        TokenRole::Admin => &TokenSpec::ADMIN,
        TokenRole::Depositor => &TokenSpec::DEPOSITOR,
    };
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let file = env(spec.file_env).map(PathBuf::from);
    token(
        spec,
        None,
        file,
        &Origin::Named("the environment".into()),
        &env,
    )
}

pub(crate) fn required_token(t: Option<Secret>, spec: &TokenSpec) -> Result<Secret, ConfigError> {
    t.ok_or_else(|| {
        invalid(
            &Origin::Named("the configuration".into()),
            &format!("tokens.{}_file", spec.role),
            format!(
                "no {} token: set {}, or name a file holding it with {} or tokens.{}_file",
                spec.role, spec.env, spec.file_flag, spec.role
            ),
        )
    })
}

pub(crate) fn check_token(
    value: &str,
    origin: &Origin,
    field: &str,
) -> Result<Secret, ConfigError> {
    // The messages never include the token itself.
    if value.chars().count() < MIN_TOKEN_CHARS {
        return Err(invalid(
            origin,
            field,
            format!("the token is shorter than {MIN_TOKEN_CHARS} characters"),
        ));
    }
    if value
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || !c.is_ascii())
    {
        return Err(invalid(
            origin,
            field,
            "the token must be printable ASCII without spaces (it is sent in an HTTP header)",
        ));
    }
    Ok(Secret::new(value))
}
