//! Where arks come from: the built-in NOID minter (a sled tree beside the
//! log), or the EZID HTTP API when one is configured (`--ezid-url`).
//!
//! EZID mints under a shoulder with `POST {base}/shoulder/{shoulder}` and
//! HTTP basic auth; it answers `201` with `success: ark:/…` (its ANVL
//! response format) or an `error: …` line. The request carries the
//! object's ERC metadata (`erc.who`, `erc.what`, `erc.when`, `erc.where`)
//! in EZID's ANVL form, names and values escaped as EZID requires (`%`,
//! `:`, CR and LF percent-encoded; see [`anvl_escape`]).

use std::time::Duration;

use ingest_events::event::Erc;
use ingest_steps::noid::Minter;

/// The longest ERC value sent to EZID, in bytes (longer ones are cut).
pub const MAX_ERC_VALUE_BYTES: usize = 4096;

/// `text` escaped for an EZID ANVL name or value: `%`, `:`, CR and LF
/// become `%25`, `%3A`, `%0D` and `%0A` (EZID's API documentation escapes
/// exactly these, in names and values alike).
pub fn anvl_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '%' => out.push_str("%25"),
            ':' => out.push_str("%3A"),
            '\r' => out.push_str("%0D"),
            '\n' => out.push_str("%0A"),
            c => out.push(c),
        }
    }
    out
}

/// The body of a mint request: `_profile: erc` and the four ERC kernel
/// elements, a missing or blank one as `(:unas)`, each value cut to
/// [`MAX_ERC_VALUE_BYTES`] and escaped with [`anvl_escape`].
pub fn mint_request_body(erc: &Erc) -> String {
    let mut body = String::from("_profile: erc\n");
    for (name, value) in [
        ("erc.who", &erc.who),
        ("erc.what", &erc.what),
        ("erc.when", &erc.when),
        ("erc.where", &erc.r#where),
    ] {
        let value = value
            .as_deref()
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(|v| ingest_protocol::cut(v, MAX_ERC_VALUE_BYTES))
            .unwrap_or(std::borrow::Cow::Borrowed("(:unas)"));
        body.push_str(&anvl_escape(name));
        body.push_str(": ");
        body.push_str(&anvl_escape(&value));
        body.push('\n');
    }
    body
}

/// How an ark could not be minted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MintError {
    /// The minter or EZID is unavailable (I/O, timeout, 5xx): retry later.
    #[error("{0}")]
    Unavailable(String),
    /// A refusal that a retry will not change (bad credentials, unknown
    /// shoulder, an unreadable answer): an operator must fix the settings.
    #[error("{0}")]
    Refused(String),
}

pub use ingest_config::EzidSettings;

/// An EZID client.
#[derive(Debug, Clone)]
pub struct Ezid {
    http: reqwest::Client,
    settings: EzidSettings,
}

impl Ezid {
    /// A client for `settings`.
    ///
    /// # Errors
    /// When the HTTP client cannot be built or the base is not an http(s) URL.
    pub fn new(settings: EzidSettings) -> Result<Ezid, MintError> {
        let url = reqwest::Url::parse(&settings.base).map_err(|e| {
            MintError::Refused(format!(
                "the EZID URL {:?} is not a URL: {e}",
                settings.base
            ))
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(MintError::Refused(format!(
                "the EZID URL {:?} must be http(s)",
                settings.base
            )));
        }
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| MintError::Refused(format!("cannot build the HTTP client: {e}")))?;
        Ok(Ezid { http, settings })
    }

    /// Mints one ark for an object described by `erc`.
    ///
    /// # Errors
    /// [`MintError::Unavailable`] for I/O, timeouts and 5xx;
    /// [`MintError::Refused`] for anything else that is not a new ark.
    pub async fn mint(&self, erc: &Erc) -> Result<String, MintError> {
        let url = format!(
            "{}/shoulder/{}",
            self.settings.base.trim_end_matches('/'),
            self.settings.shoulder
        );
        let resp = self
            .http
            .post(&url)
            .basic_auth(&self.settings.user, Some(&self.settings.password))
            .header(reqwest::header::CONTENT_TYPE, "text/plain; charset=UTF-8")
            .body(mint_request_body(erc))
            .send()
            .await
            .map_err(|e| MintError::Unavailable(format!("EZID {url}: {e}")))?;
        let status = resp.status();
        let text = resp
            .text()
            .await
            .map_err(|e| MintError::Unavailable(format!("EZID {url}: reading the answer: {e}")))?;
        let first = text.lines().next().unwrap_or_default().trim();
        if status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            return Err(MintError::Unavailable(format!(
                "EZID {url} answered {status}: {first}"
            )));
        }
        match first.strip_prefix("success:") {
            Some(rest) if status.is_success() => {
                // `success: ark:/99999/fk4xyz | ark:/…` (the second is a shadow id).
                let ark = rest.split('|').next().unwrap_or_default().trim();
                if ingest_steps::noid::is_ark(ark) {
                    Ok(ark.to_string())
                } else {
                    Err(MintError::Refused(format!(
                        "EZID {url} answered {first:?}, which names no ark"
                    )))
                }
            }
            _ => Err(MintError::Refused(format!(
                "EZID {url} answered {status}: {first}"
            ))),
        }
    }
}

/// The server's source of arks.
#[derive(Debug, Clone)]
pub enum ArkMinter {
    /// The built-in NOID minter.
    Noid(Minter),
    /// The EZID API.
    Ezid(Ezid),
}

impl ArkMinter {
    /// Mints one ark for an object described by `erc` (sent to EZID; the
    /// built-in minter needs none).
    ///
    /// # Errors
    /// See [`MintError`].
    pub async fn mint(&self, erc: &Erc) -> Result<String, MintError> {
        match self {
            ArkMinter::Noid(m) => {
                let m = m.clone();
                tokio::task::spawn_blocking(move || m.mint())
                    .await
                    .map_err(|e| MintError::Unavailable(format!("the minter task failed: {e}")))?
                    .map_err(|e| MintError::Unavailable(format!("the NOID minter failed: {e}")))
            }
            ArkMinter::Ezid(e) => e.mint(erc).await,
        }
    }

    /// Where the arks come from, for logs.
    pub fn describe(&self) -> String {
        match self {
            ArkMinter::Noid(_) => "the built-in NOID minter".into(),
            ArkMinter::Ezid(e) => {
                format!("EZID at {} under {}", e.settings.base, e.settings.shoulder)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::post;

    async fn fake(status: StatusCode, answer: &'static str) -> String {
        let app = axum::Router::new().route(
            "/shoulder/{*shoulder}",
            post(move |headers: HeaderMap| async move {
                // "user:secret" in basic auth.
                let auth = headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default();
                if auth != "Basic dXNlcjpzZWNyZXQ=" {
                    return (StatusCode::UNAUTHORIZED, "error: unauthorized".to_string());
                }
                (status, answer.to_string())
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        format!("http://{addr}")
    }

    fn client(base: String, password: &str) -> Ezid {
        Ezid::new(EzidSettings {
            base,
            shoulder: "ark:/99999/fk4".into(),
            user: "user".into(),
            password: password.into(),
        })
        .expect("client")
    }

    #[test]
    fn the_mint_request_carries_the_erc_escaped_as_ezid_requires() {
        let erc = Erc {
            who: Some("Doe, Jane: 100% sure".into()),
            what: Some("Line one\r\nline two".into()),
            when: None,
            r#where: Some("  ".into()),
        };
        assert_eq!(
            mint_request_body(&erc),
            "_profile: erc\n\
             erc.who: Doe, Jane%3A 100%25 sure\n\
             erc.what: Line one%0D%0Aline two\n\
             erc.when: (%3Aunas)\n\
             erc.where: (%3Aunas)\n"
        );
        let long = Erc {
            what: Some("x".repeat(10 * MAX_ERC_VALUE_BYTES)),
            ..Erc::default()
        };
        assert!(mint_request_body(&long).len() < 2 * MAX_ERC_VALUE_BYTES);
    }

    #[tokio::test]
    async fn ezid_answers_are_read_and_classified() {
        let ok = fake(
            StatusCode::CREATED,
            "success: ark:/99999/fk4abc123 | ark:/b9999/fk4abc123\n",
        )
        .await;
        assert_eq!(
            client(ok.clone(), "secret")
                .mint(&Erc::default())
                .await
                .expect("mint"),
            "ark:/99999/fk4abc123"
        );
        let refused = client(ok, "wrong").mint(&Erc::default()).await;
        assert!(
            matches!(&refused, Err(MintError::Refused(m)) if m.contains("401")),
            "{refused:?}"
        );
        let down = fake(
            StatusCode::SERVICE_UNAVAILABLE,
            "error: down for maintenance",
        )
        .await;
        let r = client(down, "secret").mint(&Erc::default()).await;
        assert!(
            matches!(&r, Err(MintError::Unavailable(m)) if m.contains("maintenance")),
            "{r:?}"
        );
        let odd = fake(StatusCode::CREATED, "success: doi:10.1/x").await;
        assert!(matches!(
            client(odd, "secret").mint(&Erc::default()).await,
            Err(MintError::Refused(_))
        ));
        assert!(Ezid::new(EzidSettings {
            base: "ftp://x".into(),
            shoulder: "s".into(),
            user: "u".into(),
            password: "p".into()
        })
        .is_err());
    }
}
