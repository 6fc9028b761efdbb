//! E-mail of batch reports: SMTP through the `lettre` crate, and an outbox
//! of RFC 5322 messages (one `.eml` file each).
//!
//! Without an SMTP server every message is written to the outbox, so that
//! nothing is silently dropped. With `--smtp-url` the message is sent over
//! SMTP: `smtp://HOST[:PORT]` is plain SMTP (a local relay, port 25 by
//! default), `smtps://HOST[:PORT]` is SMTP over implicit TLS (465), and
//! `smtp+starttls://HOST[:PORT]` upgrades with STARTTLS (587, and refuses a
//! server that cannot). `USER:PASSWORD@` in the URL authenticates. When
//! sending fails the message is written to the outbox as well, exactly as it
//! would have been sent, and the error says where.

use std::path::{Path, PathBuf};
use std::time::Duration;

use lettre::message::header::{ContentTransferEncoding, ContentType};
use lettre::message::Body;
use lettre::message::Mailbox;
use lettre::transport::smtp::authentication::Credentials;
use lettre::{Address, AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

use super::RealConfig;

/// Why a message was not sent, or the outbox not set up. No variant holds
/// an SMTP password: URLs are shown redacted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MailError {
    /// The sender is not an e-mail address.
    #[error("the sender {from:?} is not an e-mail address: {source}")]
    Sender {
        /// The sender given.
        from: String,
        /// Why.
        source: lettre::address::AddressError,
    },
    /// The SMTP URL does not parse.
    #[error("invalid SMTP URL {shown:?}: {source}; {SMTP_URL_EXPECTED}")]
    InvalidUrl {
        /// The URL, redacted.
        shown: String,
        /// Why.
        source: <reqwest::Url as std::str::FromStr>::Err,
    },
    /// The SMTP URL has another scheme.
    #[error("SMTP URL {shown:?}: unknown scheme {scheme:?}; {SMTP_URL_EXPECTED}")]
    UnknownScheme {
        /// The URL, redacted.
        shown: String,
        /// Its scheme.
        scheme: String,
    },
    /// The SMTP URL has no host.
    #[error("SMTP URL {0:?} has no host; {SMTP_URL_EXPECTED}")]
    NoHost(String),
    /// The SMTP URL's credentials are not UTF-8 once decoded.
    #[error("SMTP URL {0:?}: the credentials are not UTF-8")]
    Credentials(String),
    /// No transport to the SMTP server could be built.
    #[error("SMTP URL {shown}: {source}")]
    Transport {
        /// The URL, redacted.
        shown: String,
        /// Why.
        source: lettre::transport::smtp::Error,
    },
    /// Recipients that are not e-mail addresses.
    #[error("the message {subject:?} was not sent: not an e-mail address: {}", .invalid.join(", "))]
    Recipients {
        /// The subject.
        subject: String,
        /// Each address refused, with why.
        invalid: Vec<String>,
    },
    /// No recipient.
    #[error("the message {0:?} has no recipients")]
    NoRecipients(String),
    /// The message could not be built.
    #[error("cannot build the message {subject:?}: {source}")]
    Build {
        /// The subject.
        subject: String,
        /// Why.
        source: lettre::error::Error,
    },
    /// The SMTP exchange failed; the message went to the outbox, or not.
    #[error("SMTP server {server}: {detail}{}", match .written {
        Ok(path) => format!("; the message was written to {}", path.display()),
        Err(w) => format!("; and {w}"),
    })]
    Smtp {
        /// The server.
        server: String,
        /// What went wrong, in words.
        detail: String,
        /// Where the message was written instead, or why it was not.
        written: Result<PathBuf, Box<MailError>>,
    },
    /// The outbox writer task failed.
    #[error("the outbox writer failed: {0}")]
    Writer(#[source] tokio::task::JoinError),
    /// The outbox could not be created.
    #[error("cannot create the outbox {}: {source}", dir.display())]
    CreateOutbox {
        /// The outbox.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A message could not be written to the outbox.
    #[error("cannot write the e-mail {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// What an SMTP URL looks like, for messages.
const SMTP_URL_EXPECTED: &str =
    "expected smtp://, smtps:// or smtp+starttls:// [USER:PASSWORD@]HOST[:PORT]";

/// Where a message went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// Written to the outbox, at this path.
    Outbox(PathBuf),
    /// Accepted by the SMTP server `host:port`.
    Smtp(String),
}

/// The mail sender of the batch daemons: an outbox folder and, optionally,
/// an SMTP server.
#[derive(Debug, Clone)]
pub struct Outbox {
    dir: PathBuf,
    from: Mailbox,
    smtp: Option<Smtp>,
}

/// The configured SMTP server and the `lettre` transport to it.
#[derive(Debug, Clone)]
struct Smtp {
    /// `host:port`, for messages.
    address: String,
    transport: AsyncSmtpTransport<Tokio1Executor>,
}

/// How the connection to the SMTP server is secured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Security {
    /// `smtp://`: none (a local relay).
    Plain,
    /// `smtps://`: TLS from the start.
    Tls,
    /// `smtp+starttls://`: STARTTLS, required.
    StartTls,
}

/// An SMTP server as given by `--smtp-url`. The credentials' `Debug` does
/// not show them.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SmtpServer {
    security: Security,
    /// The host name, or an IP address (without brackets).
    host: String,
    port: u16,
    credentials: Option<Credentials>,
}

/// How long connecting, or one SMTP command and its reply, may take.
const SMTP_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a whole SMTP session may take.
const SMTP_SESSION_TIMEOUT: Duration = Duration::from_secs(300);

impl Outbox {
    /// The outbox of `config`: `--outbox`, else `<work_dir>/outbox`; SMTP
    /// when `--smtp-url` is set; the sender is `--mail-from`.
    ///
    /// # Errors
    /// A sender that is not an e-mail address; an SMTP URL that is not
    /// `smtp://`, `smtps://` or `smtp+starttls://` `[USER:PASSWORD@]HOST[:PORT]`.
    pub fn new(config: &RealConfig) -> Result<Outbox, MailError> {
        let dir = config
            .args
            .outbox
            .clone()
            .unwrap_or_else(|| config.work_dir.join("outbox"));
        Outbox::with(dir, &config.args.mail_from, config.args.smtp_url.as_deref())
    }

    /// An outbox in `dir`, sending as `from`, through `smtp_url` if given.
    ///
    /// # Errors
    /// See [`Outbox::new`].
    pub fn with(
        dir: impl Into<PathBuf>,
        from: &str,
        smtp_url: Option<&str>,
    ) -> Result<Outbox, MailError> {
        let from = clean_header(from)
            .parse::<Mailbox>()
            .map_err(|source| MailError::Sender {
                from: from.to_string(),
                source,
            })?;
        let smtp = smtp_url
            .filter(|u| !u.trim().is_empty())
            .map(|url| {
                let server = parse_smtp_url(url)?;
                let transport = server.transport().map_err(|source| MailError::Transport {
                    shown: redact_url(url),
                    source,
                })?;
                Ok::<_, MailError>(Smtp {
                    address: server.address(),
                    transport,
                })
            })
            .transpose()?;
        Ok(Outbox {
            dir: dir.into(),
            from,
            smtp,
        })
    }

    /// The folder messages are written to.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Sends a plain-text message to `to`: over SMTP when a server is
    /// configured, else into the outbox.
    ///
    /// # Errors
    /// No recipients, or one that is not an e-mail address; the outbox
    /// cannot be written; the SMTP exchange failed (the message is then also
    /// in the outbox, and the error says where).
    pub async fn send(
        &self,
        to: &[String],
        subject: &str,
        body: &str,
    ) -> Result<Delivery, MailError> {
        let mut recipients = Vec::with_capacity(to.len());
        let mut invalid = Vec::new();
        for raw in to {
            let address = clean_address(raw);
            if address.is_empty() {
                continue;
            }
            match address.parse::<Address>() {
                Ok(a) => recipients.push(Mailbox::new(None, a)),
                Err(e) => invalid.push(format!("{address:?} ({e})")),
            }
        }
        if !invalid.is_empty() {
            return Err(MailError::Recipients {
                subject: subject.to_string(),
                invalid,
            });
        }
        if recipients.is_empty() {
            return Err(MailError::NoRecipients(subject.to_string()));
        }
        let message = build_message(&self.from, recipients, subject, body)?;
        // The bytes sent are the bytes an outbox file holds.
        let eml = message.formatted();
        let Some(smtp) = &self.smtp else {
            let path = self.write(eml).await?;
            tracing::info!(path = %path.display(), subject, "e-mail written to the outbox");
            return Ok(Delivery::Outbox(path));
        };
        let sent = match tokio::time::timeout(
            SMTP_SESSION_TIMEOUT,
            smtp.transport.send_raw(message.envelope(), &eml),
        )
        .await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(describe(&e)),
            Err(_) => Err(format!(
                "the session took longer than {} s",
                SMTP_SESSION_TIMEOUT.as_secs()
            )),
        };
        match sent {
            Ok(()) => {
                tracing::info!(server = %smtp.address, subject, "e-mail sent");
                Ok(Delivery::Smtp(smtp.address.clone()))
            }
            Err(detail) => Err(MailError::Smtp {
                server: smtp.address.clone(),
                detail,
                written: self.write(eml).await.map_err(Box::new),
            }),
        }
    }

    /// Writes `message` atomically (a temporary file renamed into place)
    /// under a unique name.
    async fn write(&self, message: Vec<u8>) -> Result<PathBuf, MailError> {
        let dir = self.dir.clone();
        tokio::task::spawn_blocking(move || write_new(&dir, &message))
            .await
            .map_err(MailError::Writer)?
    }
}

/// A `lettre` SMTP error in words: the server's reply, or what went wrong.
fn describe(e: &lettre::transport::smtp::Error) -> String {
    if let Some(code) = e.status() {
        let reply = std::error::Error::source(e)
            .map(|s| s.to_string())
            .unwrap_or_default();
        let reply = reply.split_whitespace().collect::<Vec<_>>().join(" ");
        let kind = if e.is_permanent() {
            "refused"
        } else {
            "temporarily refused"
        };
        return format!("{kind}: the server answered {code} {reply}");
    }
    if e.is_timeout() {
        return format!("timed out ({e})");
    }
    if e.is_tls() {
        return format!("TLS failed ({e})");
    }
    e.to_string()
}

/// The message lettre sends: From, To, Subject, Date, Message-ID and a
/// plain-text UTF-8 body (line endings made CRLF; 7bit when it can be, else
/// quoted-printable or base64, so any server takes it). Header values come
/// through lettre's typed headers and are cleaned of CR and LF besides.
fn build_message(
    from: &Mailbox,
    to: Vec<Mailbox>,
    subject: &str,
    body: &str,
) -> Result<Message, MailError> {
    let domain = from.email.domain();
    let mut builder = Message::builder().from(from.clone());
    for mailbox in to {
        builder = builder.to(mailbox);
    }
    builder
        .subject(clean_header(subject))
        .date_now()
        .message_id(Some(format!(
            "<{}@{domain}>",
            uuid::Uuid::new_v4().simple()
        )))
        .header(lettre::message::header::MIME_VERSION_1_0)
        .header(ContentType::TEXT_PLAIN)
        .body(text_body(body))
        .map_err(|source| MailError::Build {
            subject: subject.to_string(),
            source,
        })
}

/// The body of `text`, line endings made CRLF: as it is (`7bit`) when it is
/// ASCII with lines of at most 998 octets and no NUL (RFC 5322 §2.3), so that the outbox files stay readable; else lettre's choice of
/// quoted-printable or base64. (lettre alone would encode any line of 76
/// characters or more, such as a long URL.) Dot-stuffing is lettre's, on
/// the wire.
fn text_body(text: &str) -> Body {
    let text = crlf(text);
    let seven_bit =
        text.is_ascii() && !text.contains('\0') && text.split("\r\n").all(|line| line.len() <= 998);
    if seven_bit {
        Body::dangerous_pre_encoded(text.into_bytes(), ContentTransferEncoding::SevenBit)
    } else {
        Body::new(text)
    }
}

/// Text with every line ending (LF, CRLF, or a bare CR) made CRLF.
fn crlf(text: &str) -> String {
    text.replace("\r\n", "\n")
        .replace('\r', "\n")
        .replace('\n', "\r\n")
}

/// A header value without CR or LF (each replaced by a space, runs trimmed),
/// so that it cannot start a new header.
pub fn clean_header(value: &str) -> String {
    value
        .split(['\r', '\n'])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// An address as given, without CR, LF, angle brackets or spaces.
fn clean_address(address: &str) -> String {
    address
        .chars()
        .filter(|c| !matches!(c, '\r' | '\n' | '<' | '>') && !c.is_whitespace())
        .collect()
}

impl SmtpServer {
    /// `host:port`, an IPv6 address in brackets.
    fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The lettre transport to this server (one connection per message).
    fn transport(
        &self,
    ) -> Result<AsyncSmtpTransport<Tokio1Executor>, lettre::transport::smtp::Error> {
        type Transport = AsyncSmtpTransport<Tokio1Executor>;
        let builder = match self.security {
            Security::Plain => Transport::builder_dangerous(self.host.as_str()),
            Security::Tls => Transport::relay(&self.host)?,
            Security::StartTls => Transport::starttls_relay(&self.host)?,
        };
        let builder = builder.port(self.port).timeout(Some(SMTP_TIMEOUT));
        let builder = match &self.credentials {
            Some(c) => builder.credentials(c.clone()),
            None => builder,
        };
        Ok(builder.build())
    }
}

/// The URL without its password, for messages.
fn redact_url(url: &str) -> String {
    match reqwest::Url::parse(url.trim()) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        Ok(u) => u.to_string(),
        Err(_) => "(unparsable)".into(),
    }
}

fn parse_smtp_url(url: &str) -> Result<SmtpServer, MailError> {
    let shown = redact_url(url);
    let parsed = reqwest::Url::parse(url.trim()).map_err(|source| MailError::InvalidUrl {
        shown: shown.clone(),
        source,
    })?;
    let (security, default_port) = match parsed.scheme() {
        "smtp" => (Security::Plain, 25),
        "smtps" => (Security::Tls, 465),
        "smtp+starttls" => (Security::StartTls, 587),
        other => {
            return Err(MailError::UnknownScheme {
                shown,
                scheme: other.to_string(),
            })
        }
    };
    // An IPv6 literal comes back bracketed; lettre wants the bare address.
    let host = parsed
        .host_str()
        .map(|h| h.trim_start_matches('[').trim_end_matches(']'))
        .filter(|h| !h.is_empty())
        .ok_or_else(|| MailError::NoHost(shown.clone()))?
        .to_string();
    let decode = |s: &str| {
        ingest_steps::paths::percent_decode(s).ok_or_else(|| MailError::Credentials(shown.clone()))
    };
    let credentials = match (parsed.username(), parsed.password()) {
        ("", None) => None,
        (user, password) => Some(Credentials::new(
            decode(user)?,
            decode(password.unwrap_or(""))?,
        )),
    };
    Ok(SmtpServer {
        security,
        host,
        port: parsed.port().unwrap_or(default_port),
        credentials,
    })
}

/// Writes `bytes` under a new unique name in the outbox `dir`.
fn write_new(dir: &Path, bytes: &[u8]) -> Result<PathBuf, MailError> {
    std::fs::create_dir_all(dir).map_err(|source| MailError::CreateOutbox {
        dir: dir.to_path_buf(),
        source,
    })?;
    let name = format!(
        "{}-{}.eml",
        chrono::Utc::now().format("%Y%m%dT%H%M%S%.6fZ"),
        uuid::Uuid::new_v4().simple()
    );
    let path = dir.join(&name);
    super::atomic::write_atomically(&dir.join(format!(".{name}.tmp")), &path, bytes).map_err(
        |source| MailError::Write {
            path: path.clone(),
            source,
        },
    )?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    use tokio::net::TcpListener;

    fn read_one(dir: &Path) -> String {
        let files: Vec<_> = std::fs::read_dir(dir)
            .expect("outbox")
            .map(|e| e.expect("entry").path())
            .collect();
        assert_eq!(files.len(), 1, "{files:?}");
        assert_eq!(files[0].extension().and_then(|e| e.to_str()), Some("eml"));
        std::fs::read_to_string(&files[0]).expect("message")
    }

    #[tokio::test]
    async fn the_outbox_gets_a_crlf_message_with_headers() {
        let tmp = tempfile::tempdir().expect("tmp");
        let outbox =
            Outbox::with(tmp.path().join("outbox"), "ingest@example.org", None).expect("outbox");
        let delivery = outbox
            .send(
                &["curator@example.org".into(), "b@example.org".into()],
                "ingest batch bid1: 2 completed, 0 failed",
                "line one\nline two\n.dot\n",
            )
            .await
            .expect("sent");
        let Delivery::Outbox(path) = delivery else {
            panic!("not the outbox: {delivery:?}")
        };
        assert!(path.starts_with(tmp.path().join("outbox")));
        let text = read_one(outbox.dir());
        assert!(
            text.starts_with("From: ingest@example.org\r\nTo: curator@example.org, b@example.org\r\nSubject: ingest batch bid1: 2 completed, 0 failed\r\nDate: "),
            "{text}"
        );
        for h in [
            "\r\nMessage-ID: <",
            "@example.org>\r\n",
            "\r\nMIME-Version: 1.0\r\n",
            "\r\nContent-Type: text/plain; charset=utf-8\r\n",
            "\r\nContent-Transfer-Encoding: 7bit\r\n",
            "\r\n\r\nline one\r\nline two\r\n.dot\r\n",
        ] {
            assert!(text.contains(h), "{h:?} not in {text:?}");
        }
        // Every LF is part of a CRLF.
        assert_eq!(text.matches('\n').count(), text.matches("\r\n").count());
        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(outbox.dir()).expect("dir").count(), 1);
    }

    #[tokio::test]
    async fn every_message_gets_its_own_file() {
        let tmp = tempfile::tempdir().expect("tmp");
        let outbox = Outbox::with(tmp.path(), "ingest@example.org", None).expect("outbox");
        let mut paths = std::collections::BTreeSet::new();
        for i in 0..5 {
            let Ok(Delivery::Outbox(p)) = outbox
                .send(&["a@example.org".into()], &format!("m{i}"), "b")
                .await
            else {
                panic!("not the outbox")
            };
            paths.insert(p);
        }
        assert_eq!(paths.len(), 5);
        assert_eq!(std::fs::read_dir(tmp.path()).expect("dir").count(), 5);
    }

    #[tokio::test]
    async fn header_injection_is_stripped() {
        let tmp = tempfile::tempdir().expect("tmp");
        let outbox = Outbox::with(tmp.path(), "ingest@example.org", None).expect("outbox");
        outbox
            .send(
                &["a@example.org".into()],
                "hello\r\nBcc: evil@example.org\nX-Evil: 1",
                "body",
            )
            .await
            .expect("sent");
        let text = read_one(tmp.path());
        let (headers, _) = text.split_once("\r\n\r\n").expect("headers");
        assert!(!headers
            .lines()
            .any(|l| l.starts_with("Bcc") || l.starts_with("X-Evil")));
        assert!(headers.contains("Subject: hello Bcc: evil@example.org X-Evil: 1\r\n"));

        // A recipient with a header smuggled in is not an address: nothing
        // is sent, and the error says why.
        let error = outbox
            .send(
                &["a@example.org\r\nBcc: victim@example.org".into()],
                "s",
                "b",
            )
            .await
            .expect_err("not an address")
            .to_string();
        assert!(error.contains("not an e-mail address"), "{error}");
        assert_eq!(std::fs::read_dir(tmp.path()).expect("dir").count(), 1);
        assert!(Outbox::with(tmp.path(), "ingest\r\nBcc: x@example.org", None).is_err());
    }

    #[tokio::test]
    async fn no_recipients_is_an_error() {
        let tmp = tempfile::tempdir().expect("tmp");
        let outbox = Outbox::with(tmp.path(), "ingest@localhost", None).expect("outbox");
        let error = outbox
            .send(&[" ".into()], "s", "b")
            .await
            .expect_err("no recipients")
            .to_string();
        assert!(error.contains("no recipients"), "{error}");
    }

    #[tokio::test]
    async fn non_ascii_is_encoded_for_any_server() {
        let tmp = tempfile::tempdir().expect("tmp");
        let outbox =
            Outbox::with(tmp.path(), "Ingest Café <ingest@example.org>", None).expect("outbox");
        outbox
            .send(&["a@example.org".into()], "café", "crème brûlée\n")
            .await
            .expect("sent");
        let text = read_one(tmp.path());
        assert!(text.is_ascii(), "{text}");
        assert!(text.contains("\r\nSubject: =?utf-8?"), "{text}");
        assert!(
            text.contains("\r\nContent-Transfer-Encoding: quoted-printable\r\n")
                || text.contains("\r\nContent-Transfer-Encoding: base64\r\n"),
            "{text}"
        );
    }

    #[test]
    fn bodies_stay_readable_when_they_can() {
        let long = format!("http://example.org/{}\nnext", "x".repeat(200));
        let body = text_body(&long);
        assert_eq!(body.encoding(), ContentTransferEncoding::SevenBit);
        assert_eq!(body.as_ref(), long.replace('\n', "\r\n").as_bytes());
        assert_eq!(text_body("a\r\nb\n\rc\r").as_ref(), b"a\r\nb\r\n\r\nc\r\n");
        for encoded in ["x".repeat(1000), "é".into()] {
            assert_ne!(
                text_body(&encoded).encoding(),
                ContentTransferEncoding::SevenBit,
                "{encoded:?}"
            );
        }
    }

    #[test]
    fn smtp_urls_are_checked() {
        let plain = parse_smtp_url("smtp://mail.example.org:2525").expect("smtp");
        assert_eq!(
            plain,
            SmtpServer {
                security: Security::Plain,
                host: "mail.example.org".into(),
                port: 2525,
                credentials: None,
            }
        );
        assert_eq!(plain.address(), "mail.example.org:2525");
        assert_eq!(parse_smtp_url("smtp://mx").map(|s| s.port).ok(), Some(25));
        let tls = parse_smtp_url("smtps://user%40x:p%3Ass@mx").expect("smtps");
        assert_eq!((tls.security, tls.port), (Security::Tls, 465));
        assert_eq!(
            tls.credentials,
            Some(Credentials::new("user@x".into(), "p:ss".into()))
        );
        let starttls = parse_smtp_url("smtp+starttls://mx:2587").expect("starttls");
        assert_eq!(
            (starttls.security, starttls.port),
            (Security::StartTls, 2587)
        );
        let v6 = parse_smtp_url("smtp://[::1]:2525").expect("v6");
        assert_eq!(
            (v6.host.as_str(), v6.address()),
            ("::1", "[::1]:2525".into())
        );
        assert!(
            parse_smtp_url("http://mx").is_err_and(|e| e.to_string().contains("unknown scheme"))
        );
        assert!(parse_smtp_url("smtp://").is_err());
        // The password is not repeated in errors.
        assert!(
            parse_smtp_url("ftp://u:secret@mx").is_err_and(|e| !e.to_string().contains("secret"))
        );
        // Every scheme makes a transport, and the configuration shows no
        // password.
        for url in ["smtp://mx", "smtps://u:secret@mx", "smtp+starttls://mx:587"] {
            let outbox =
                Outbox::with("/nonexistent", "ingest@example.org", Some(url)).expect("transport");
            assert!(!format!("{outbox:?}").contains("secret"));
        }
    }

    /// A scripted SMTP server: answers each command and returns what the
    /// client sent. It advertises no STARTTLS; with `auth` it advertises
    /// AUTH PLAIN and accepts it.
    async fn fake_smtp(reject_rcpt: bool, auth: bool) -> (u16, tokio::task::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let task = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.expect("accept");
            let (read, mut write) = stream.into_split();
            let mut read = BufReader::new(read);
            let mut seen = String::new();
            write.write_all(b"220 fake ESMTP\r\n").await.expect("w");
            let mut in_data = false;
            loop {
                let mut line = String::new();
                if read.read_line(&mut line).await.expect("read") == 0 {
                    break;
                }
                seen.push_str(&line);
                let reply: &[u8] = if in_data {
                    if line == ".\r\n" {
                        in_data = false;
                        b"250 queued\r\n"
                    } else {
                        continue;
                    }
                } else if line.starts_with("EHLO") && auth {
                    b"250-fake\r\n250-8BITMIME\r\n250-AUTH PLAIN\r\n250 SIZE 1000000\r\n"
                } else if line.starts_with("EHLO") {
                    b"250-fake\r\n250-8BITMIME\r\n250 SIZE 1000000\r\n"
                } else if line.starts_with("AUTH PLAIN") && auth {
                    b"235 2.7.0 authenticated\r\n"
                } else if line.starts_with("RCPT") && reject_rcpt {
                    b"550 no such user\r\n"
                } else if line.starts_with("MAIL") || line.starts_with("RCPT") {
                    b"250 ok\r\n"
                } else if line.starts_with("DATA") {
                    in_data = true;
                    b"354 go ahead\r\n"
                } else if line.starts_with("QUIT") {
                    write.write_all(b"221 bye\r\n").await.expect("w");
                    break;
                } else {
                    b"500 what\r\n"
                };
                write.write_all(reply).await.expect("w");
            }
            seen
        });
        (port, task)
    }

    #[tokio::test]
    async fn smtp_delivers_a_dot_stuffed_body() {
        let tmp = tempfile::tempdir().expect("tmp");
        let (port, server) = fake_smtp(false, false).await;
        let outbox = Outbox::with(
            tmp.path(),
            "ingest@example.org",
            Some(&format!("smtp://127.0.0.1:{port}")),
        )
        .expect("outbox");
        let delivery = outbox
            .send(
                &["a@example.org".into(), "b@example.org".into()],
                "report",
                "first\n.hidden\n..two\n.\nlast",
            )
            .await
            .expect("sent");
        assert_eq!(delivery, Delivery::Smtp(format!("127.0.0.1:{port}")));
        let seen = server.await.expect("server");
        assert!(seen.starts_with("EHLO "), "{seen}");
        assert!(
            seen.contains("\r\nMAIL FROM:<ingest@example.org>\r\n"),
            "{seen}"
        );
        assert!(
            seen.contains("\r\nRCPT TO:<a@example.org>\r\nRCPT TO:<b@example.org>\r\nDATA\r\n"),
            "{seen}"
        );
        assert!(
            seen.contains("\r\n\r\nfirst\r\n..hidden\r\n...two\r\n..\r\nlast\r\n.\r\nQUIT\r\n"),
            "{seen}"
        );
        assert!(seen.contains("\r\nSubject: report\r\n"), "{seen}");
        assert!(!seen.contains("AUTH"), "{seen}");
        // Nothing went to the outbox.
        assert_eq!(std::fs::read_dir(tmp.path()).expect("dir").count(), 0);
    }

    #[tokio::test]
    async fn smtp_credentials_come_from_the_url() {
        let tmp = tempfile::tempdir().expect("tmp");
        let (port, server) = fake_smtp(false, true).await;
        let outbox = Outbox::with(
            tmp.path(),
            "ingest@example.org",
            Some(&format!("smtp://user:pa%20ss@127.0.0.1:{port}")),
        )
        .expect("outbox");
        outbox
            .send(&["a@example.org".into()], "report", "body")
            .await
            .expect("sent");
        let seen = server.await.expect("server");
        // PLAIN: base64 of "\0user\0pa ss".
        assert!(
            seen.contains("\r\nAUTH PLAIN AHVzZXIAcGEgc3M=\r\nMAIL FROM:"),
            "{seen}"
        );
    }

    #[tokio::test]
    async fn a_refused_recipient_leaves_the_message_in_the_outbox() {
        let tmp = tempfile::tempdir().expect("tmp");
        let (port, server) = fake_smtp(true, false).await;
        let outbox = Outbox::with(
            tmp.path(),
            "ingest@example.org",
            Some(&format!("smtp://127.0.0.1:{port}")),
        )
        .expect("outbox");
        let error = outbox
            .send(&["nobody@example.org".into()], "report", "body")
            .await
            .expect_err("refused")
            .to_string();
        assert!(
            error.contains(&format!(
                "SMTP server 127.0.0.1:{port}: refused: the server answered 550 no such user"
            )),
            "{error}"
        );
        assert!(error.contains("written to"), "{error}");
        let text = read_one(tmp.path());
        assert!(text.contains("\r\nTo: nobody@example.org\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\nbody"), "{text:?}");
        let seen = server.await.expect("server");
        assert!(seen.contains("RCPT TO:<nobody@example.org>\r\n"), "{seen}");
        assert!(!seen.contains("DATA"), "{seen}");
    }

    #[tokio::test]
    async fn an_unreachable_server_leaves_the_message_in_the_outbox() {
        let tmp = tempfile::tempdir().expect("tmp");
        // A port that was just free: nothing listens on it.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let outbox = Outbox::with(
            tmp.path(),
            "ingest@example.org",
            Some(&format!("smtp://127.0.0.1:{port}")),
        )
        .expect("outbox");
        let error = outbox
            .send(&["a@example.org".into()], "s", "b")
            .await
            .expect_err("unreachable")
            .to_string();
        assert!(
            error.contains(&format!("SMTP server 127.0.0.1:{port}: ")),
            "{error}"
        );
        assert!(error.to_lowercase().contains("connect"), "{error}");
        assert!(error.contains("written to"), "{error}");
        read_one(tmp.path());
    }
}
