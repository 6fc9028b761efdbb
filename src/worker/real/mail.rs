//! E-mail of batch reports: an outbox of RFC 5322 messages (one `.eml`
//! file each) and a minimal SMTP client.
//!
//! Without an SMTP server every message is written to the outbox, so that
//! nothing is silently dropped. With `--smtp-url smtp://HOST:PORT` the
//! message is sent over plain SMTP (EHLO/HELO, MAIL FROM, RCPT TO, DATA with
//! dot-stuffing, QUIT); when that fails the message is written to the outbox
//! as well and the error is returned.
//!
//! The SMTP client is deliberately small (no TLS, no AUTH, no pipelining):
//! the `lettre` crate would replace it once it is a dependency.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::RealConfig;

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
    from: String,
    smtp: Option<SmtpServer>,
}

/// A plain SMTP server, `smtp://HOST:PORT`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SmtpServer {
    host: String,
    port: u16,
}

/// How long one SMTP exchange (connect, or a command and its reply) may take.
const SMTP_TIMEOUT: Duration = Duration::from_secs(30);

impl Outbox {
    /// The outbox of `config`: `--outbox`, else `<work_dir>/outbox`; SMTP
    /// when `--smtp-url` is set; the sender is `--mail-from`.
    ///
    /// # Errors
    /// An SMTP URL that is not `smtp://HOST[:PORT]` (`smtps://` needs TLS,
    /// which this client does not have).
    pub fn new(config: &RealConfig) -> Result<Outbox, String> {
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
    ) -> Result<Outbox, String> {
        let smtp = smtp_url
            .filter(|u| !u.trim().is_empty())
            .map(parse_smtp_url)
            .transpose()?;
        Ok(Outbox {
            dir: dir.into(),
            from: clean_header(from),
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
    /// No recipients; the outbox cannot be written; the SMTP exchange failed
    /// (the message is then also in the outbox, and the error says where).
    pub async fn send(&self, to: &[String], subject: &str, body: &str) -> Result<Delivery, String> {
        let to: Vec<String> = to
            .iter()
            .map(|a| clean_address(a))
            .filter(|a| !a.is_empty())
            .collect();
        if to.is_empty() {
            return Err(format!("the message {subject:?} has no recipients"));
        }
        let message = render_message(&self.from, &to, subject, body);
        let Some(server) = &self.smtp else {
            let path = self.write(message).await?;
            tracing::info!(path = %path.display(), subject, "e-mail written to the outbox");
            return Ok(Delivery::Outbox(path));
        };
        let address = format!("{}:{}", server.host, server.port);
        match smtp_send(server, &self.from, &to, &message).await {
            Ok(()) => {
                tracing::info!(server = %address, subject, "e-mail sent");
                Ok(Delivery::Smtp(address))
            }
            Err(e) => {
                let error = format!("SMTP server {address}: {e}");
                match self.write(message).await {
                    Ok(path) => Err(format!(
                        "{error}; the message was written to {}",
                        path.display()
                    )),
                    Err(w) => Err(format!("{error}; and {w}")),
                }
            }
        }
    }

    /// Writes `message` atomically (a temporary file renamed into place)
    /// under a unique name.
    async fn write(&self, message: String) -> Result<PathBuf, String> {
        let dir = self.dir.clone();
        tokio::task::spawn_blocking(move || write_atomically(&dir, message.as_bytes()))
            .await
            .map_err(|e| format!("the outbox writer failed: {e}"))?
    }
}

/// Renders a plain-text UTF-8 message with CRLF line endings. Header values
/// have CR and LF removed, so a subject or address cannot add headers; a
/// non-ASCII subject is an RFC 2047 encoded word.
pub fn render_message(from: &str, to: &[String], subject: &str, body: &str) -> String {
    let domain = from
        .rsplit_once('@')
        .map(|(_, d)| clean_address(d))
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| "localhost".into());
    let to: Vec<String> = to.iter().map(|a| clean_header(a)).collect();
    let mut out = String::new();
    let mut header = |name: &str, value: &str| {
        out.push_str(name);
        out.push_str(": ");
        out.push_str(value);
        out.push_str("\r\n");
    };
    header("From", &clean_header(from));
    header("To", &to.join(", "));
    header("Subject", &encode_word(&clean_header(subject)));
    header("Date", &chrono::Utc::now().to_rfc2822());
    header(
        "Message-ID",
        &format!("<{}@{domain}>", uuid::Uuid::new_v4().simple()),
    );
    header("MIME-Version", "1.0");
    header("Content-Type", "text/plain; charset=utf-8");
    header("Content-Transfer-Encoding", "8bit");
    out.push_str("\r\n");
    out.push_str(&crlf(body));
    if !out.ends_with("\r\n") {
        out.push_str("\r\n");
    }
    out
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

/// An address for an SMTP command: no CR, LF, angle brackets or spaces.
fn clean_address(address: &str) -> String {
    address
        .chars()
        .filter(|c| !matches!(c, '\r' | '\n' | '<' | '>') && !c.is_whitespace())
        .collect()
}

/// Text with every line ending made CRLF.
fn crlf(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 32);
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push_str("\r\n");
        }
        out.push_str(line.strip_suffix('\r').unwrap_or(line));
    }
    out
}

/// Dot-stuffing (RFC 5321 §4.5.2): a line of the DATA that starts with a dot
/// gets another one, so it cannot end the message early.
fn dot_stuff(message: &str) -> String {
    let mut out = String::with_capacity(message.len() + 16);
    for (i, line) in message.split("\r\n").enumerate() {
        if i > 0 {
            out.push_str("\r\n");
        }
        if line.starts_with('.') {
            out.push('.');
        }
        out.push_str(line);
    }
    out
}

/// `=?utf-8?B?…?=` for a non-ASCII value; ASCII as is.
fn encode_word(value: &str) -> String {
    if value.is_ascii() {
        return value.to_string();
    }
    format!("=?utf-8?B?{}?=", base64(value.as_bytes()))
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn parse_smtp_url(url: &str) -> Result<SmtpServer, String> {
    let parsed =
        reqwest::Url::parse(url.trim()).map_err(|e| format!("invalid SMTP URL {url:?}: {e}"))?;
    match parsed.scheme() {
        "smtp" => {}
        "smtps" => {
            return Err(format!(
                "SMTP URL {url:?}: smtps:// (TLS) is not supported by the built-in SMTP client; use smtp://HOST:PORT"
            ))
        }
        other => {
            return Err(format!(
                "SMTP URL {url:?}: unknown scheme {other:?}; expected smtp://HOST:PORT"
            ))
        }
    }
    let host = parsed
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| format!("SMTP URL {url:?} has no host"))?;
    // An IPv6 literal comes back bracketed, which is what `host:port` needs.
    Ok(SmtpServer {
        host: host.to_string(),
        port: parsed.port().unwrap_or(25),
    })
}

fn write_atomically(dir: &Path, bytes: &[u8]) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir)
        .map_err(|e| format!("cannot create the outbox {}: {e}", dir.display()))?;
    let name = format!(
        "{}-{}.eml",
        chrono::Utc::now().format("%Y%m%dT%H%M%S%.6fZ"),
        uuid::Uuid::new_v4().simple()
    );
    let path = dir.join(&name);
    let tmp = dir.join(format!(".{name}.tmp"));
    let written = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, &path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!("cannot write the e-mail {}: {e}", path.display()));
    }
    Ok(path)
}

/// One SMTP session over a plain TCP connection.
async fn smtp_send(
    server: &SmtpServer,
    from: &str,
    to: &[String],
    message: &str,
) -> Result<(), String> {
    let address = format!("{}:{}", server.host.trim_matches(['[', ']']), server.port);
    let stream = tokio::time::timeout(SMTP_TIMEOUT, TcpStream::connect(&address))
        .await
        .map_err(|_| "connection timed out".to_string())?
        .map_err(|e| format!("cannot connect: {e}"))?;
    let (read, write) = stream.into_split();
    let mut s = Session {
        read: BufReader::new(read),
        write,
    };
    s.expect(None, &[220]).await?;
    let helo = hostname();
    let ehlo = s.command(&format!("EHLO {helo}")).await?;
    let eight_bit = match ehlo.code {
        250 => ehlo.text.to_ascii_uppercase().contains("8BITMIME"),
        _ => {
            s.command_expect(&format!("HELO {helo}"), &[250]).await?;
            false
        }
    };
    let body_param = if eight_bit && !message.is_ascii() {
        " BODY=8BITMIME"
    } else {
        ""
    };
    s.command_expect(
        &format!("MAIL FROM:<{}>{body_param}", clean_address(from)),
        &[250],
    )
    .await?;
    for rcpt in to {
        s.command_expect(&format!("RCPT TO:<{}>", clean_address(rcpt)), &[250, 251])
            .await?;
    }
    s.command_expect("DATA", &[354]).await?;
    let mut data = dot_stuff(message);
    if !data.ends_with("\r\n") {
        data.push_str("\r\n");
    }
    data.push_str(".\r\n");
    s.send_raw(&data).await?;
    s.expect(Some("the message"), &[250]).await?;
    // The message is accepted; a failed QUIT does not undo that.
    if let Err(e) = s.command_expect("QUIT", &[221]).await {
        tracing::debug!(error = %e, "SMTP QUIT failed after the message was accepted");
    }
    Ok(())
}

fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .map(|h| clean_address(&h))
        .filter(|h| !h.is_empty() && h.is_ascii())
        .unwrap_or_else(|| "localhost".into())
}

struct Session {
    read: BufReader<tokio::net::tcp::OwnedReadHalf>,
    write: tokio::net::tcp::OwnedWriteHalf,
}

/// An SMTP reply: its code and the text of all its lines.
struct Reply {
    code: u16,
    text: String,
}

impl Session {
    async fn send_raw(&mut self, text: &str) -> Result<(), String> {
        tokio::time::timeout(SMTP_TIMEOUT, self.write.write_all(text.as_bytes()))
            .await
            .map_err(|_| "timed out writing".to_string())?
            .map_err(|e| format!("cannot write: {e}"))
    }

    async fn command(&mut self, line: &str) -> Result<Reply, String> {
        self.send_raw(&format!("{line}\r\n")).await?;
        self.reply()
            .await
            .map_err(|e| format!("{}: {e}", verb(line)))
    }

    async fn command_expect(&mut self, line: &str, codes: &[u16]) -> Result<Reply, String> {
        let reply = self.command(line).await?;
        check(verb(line), reply, codes)
    }

    async fn expect(&mut self, what: Option<&str>, codes: &[u16]) -> Result<Reply, String> {
        let what = what.unwrap_or("the greeting");
        let reply = self.reply().await.map_err(|e| format!("{what}: {e}"))?;
        check(what, reply, codes)
    }

    /// Reads a reply, every `NNN-` line up to the `NNN ` one.
    async fn reply(&mut self) -> Result<Reply, String> {
        let mut text = String::new();
        loop {
            let mut line = String::new();
            let n = tokio::time::timeout(SMTP_TIMEOUT, self.read.read_line(&mut line))
                .await
                .map_err(|_| "no reply (timed out)".to_string())?
                .map_err(|e| format!("cannot read the reply: {e}"))?;
            if n == 0 {
                return Err("the server closed the connection".into());
            }
            let line = line.trim_end_matches(['\r', '\n']);
            let code = line
                .get(..3)
                .and_then(|c| c.parse::<u16>().ok())
                .ok_or_else(|| format!("not an SMTP reply: {line:?}"))?;
            text.push_str(line.get(4..).unwrap_or(""));
            text.push('\n');
            if line.as_bytes().get(3) != Some(&b'-') {
                return Ok(Reply { code, text });
            }
        }
    }
}

/// The command's verb, for messages (`MAIL FROM`, `RCPT TO`, `EHLO`).
fn verb(line: &str) -> &str {
    line.split([':', ' ']).next().unwrap_or(line)
}

fn check(what: &str, reply: Reply, codes: &[u16]) -> Result<Reply, String> {
    if codes.contains(&reply.code) {
        Ok(reply)
    } else {
        Err(format!(
            "{what} was answered {} {}",
            reply.code,
            reply.text.trim().replace('\n', " ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        assert!(text.starts_with("From: ingest@example.org\r\nTo: curator@example.org, b@example.org\r\nSubject: ingest batch bid1: 2 completed, 0 failed\r\nDate: "));
        for h in [
            "\r\nMessage-ID: <",
            "@example.org>\r\n",
            "\r\nMIME-Version: 1.0\r\n",
            "\r\nContent-Type: text/plain; charset=utf-8\r\n",
            "\r\n\r\nline one\r\nline two\r\n.dot\r\n",
        ] {
            assert!(text.contains(h), "{h:?} not in {text:?}");
        }
        // Every LF is part of a CRLF.
        assert_eq!(text.matches('\n').count(), text.matches("\r\n").count());
    }

    #[tokio::test]
    async fn header_injection_is_stripped() {
        let tmp = tempfile::tempdir().expect("tmp");
        let outbox = Outbox::with(tmp.path(), "ingest@example.org", None).expect("outbox");
        outbox
            .send(
                &["a@example.org\r\nBcc: victim@example.org".into()],
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
        assert!(headers.contains("To: a@example.orgBcc:victim@example.org\r\n"));
    }

    #[test]
    fn non_ascii_subjects_are_encoded_words() {
        assert_eq!(base64(b"Man"), "TWFu");
        assert_eq!(base64(b"Ma"), "TWE=");
        assert_eq!(base64(b"M"), "TQ==");
        assert_eq!(encode_word("café"), "=?utf-8?B?Y2Fmw6k=?=");
        assert_eq!(encode_word("plain"), "plain");
    }

    #[test]
    fn smtp_urls_are_checked() {
        assert_eq!(
            parse_smtp_url("smtp://mail.example.org:2525"),
            Ok(SmtpServer {
                host: "mail.example.org".into(),
                port: 2525
            })
        );
        assert_eq!(parse_smtp_url("smtp://mx").map(|s| s.port), Ok(25));
        assert!(parse_smtp_url("smtps://mx:465").is_err_and(|e| e.contains("TLS")));
        assert!(parse_smtp_url("http://mx").is_err());
    }

    /// A scripted SMTP server: answers each command and returns what the
    /// client sent.
    async fn fake_smtp(reject_rcpt: bool) -> (u16, tokio::task::JoinHandle<String>) {
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
                } else if line.starts_with("EHLO") {
                    b"250-fake\r\n250-8BITMIME\r\n250 SIZE 1000000\r\n"
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
        let (port, server) = fake_smtp(false).await;
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
        assert!(seen.contains("\r\nRCPT TO:<a@example.org>\r\nRCPT TO:<b@example.org>\r\nDATA\r\n"));
        assert!(
            seen.contains("\r\n\r\nfirst\r\n..hidden\r\n...two\r\n..\r\nlast\r\n.\r\nQUIT\r\n"),
            "{seen}"
        );
        assert!(seen.contains("\r\nSubject: report\r\n"));
        // Nothing went to the outbox.
        assert_eq!(std::fs::read_dir(tmp.path()).expect("dir").count(), 0);
    }

    #[tokio::test]
    async fn a_refused_recipient_leaves_the_message_in_the_outbox() {
        let tmp = tempfile::tempdir().expect("tmp");
        let (port, server) = fake_smtp(true).await;
        let outbox = Outbox::with(
            tmp.path(),
            "ingest@example.org",
            Some(&format!("smtp://127.0.0.1:{port}")),
        )
        .expect("outbox");
        let error = outbox
            .send(&["nobody@example.org".into()], "report", "body")
            .await
            .expect_err("refused");
        assert!(
            error.contains("RCPT was answered 550 no such user"),
            "{error}"
        );
        assert!(error.contains("written to"), "{error}");
        assert!(read_one(tmp.path()).contains("\r\n\r\nbody\r\n"));
        drop(server);
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
            .expect_err("unreachable");
        assert!(error.contains("cannot connect"), "{error}");
        read_one(tmp.path());
    }
}
