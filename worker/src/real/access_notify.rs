//! Telling the requester that an access request ended (issue 24): the
//! profile of the object's collection is notified exactly as for a batch's
//! report ([`super::notify::Teller`]): its callback URL gets an
//! [`AccessCallback`] (with retries), its addresses an e-mail. A request
//! whose container is ready names the URL, size, SHA-256 and expiry; a
//! failed one says why.
//!
//! The object's collection comes from the server's inventory (`GET
//! /objects/{ark}`, the latest version's); an object in no profile's
//! collection notifies nobody. A notification that fails is logged and
//! leaves the request as it is: the container is ready either way, and the
//! request's view names it.

use std::sync::Arc;

use ingest_protocol::callback::AccessCallback;
use ingest_protocol::endpoint::GetObject;

use super::fetch::Fetcher;
use super::notify::{Mail, Teller};
use super::RealConfig;
use crate::step::{AccessEnded, AccessNotice, AccessNoticeError, BatchFuture};

/// The most bytes of a failure's reason in an e-mail's subject (the body
/// and the callback have it whole).
const SUBJECT_MESSAGE_BYTES: usize = 160;

/// The access daemons' notifier.
pub struct AccessNotifier {
    config: Arc<RealConfig>,
    teller: Teller,
}

impl std::fmt::Debug for AccessNotifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessNotifier")
            .field("teller", &self.teller)
            .finish_non_exhaustive()
    }
}

impl AccessNotifier {
    /// Callbacks through `fetcher`, mail through the outbox and SMTP server
    /// of `config`.
    ///
    /// # Errors
    /// A bad mail setting (see [`super::mail::Outbox::new`]).
    pub fn new(fetcher: Arc<Fetcher>, config: Arc<RealConfig>) -> anyhow::Result<AccessNotifier> {
        let teller = Teller::new(fetcher, &config).map_err(anyhow::Error::msg)?;
        Ok(AccessNotifier { config, teller })
    }

    /// Tells the profile of the object's collection how the request
    /// ended; what was done, for the log.
    ///
    /// # Errors
    /// The collection could not be read, or a callback or e-mail failed
    /// (each named).
    async fn tell(
        &self,
        engine: &ingest_client::Client,
        ended: AccessEnded<'_>,
    ) -> Result<String, AccessNoticeError> {
        let ark = &ended.token.ark;
        if !plain_ark(ark) {
            return Err(AccessNoticeError::NotAnArk(
                ingest_protocol::cut(ark, 128).into_owned(),
            ));
        }
        let object = engine.get(&GetObject(ark.clone())).await?;
        let Some(collection) = object.versions.last().map(|v| v.collection.clone()) else {
            return Ok("notified nobody (the object has no version)".into());
        };
        let Some(profile) = self.config.profiles.get(&collection) else {
            return Ok(format!(
                "notified nobody (no profile for the collection {collection:?})"
            ));
        };
        let body = callback_body(&ended, &collection);
        let (subject, text) = mail_text(&ended);
        let mail = Mail {
            what: "the access e-mail",
            subject: &subject,
            text: &text,
        };
        match self.teller.tell(&profile.notification, &body, mail).await {
            Some(errors) => Err(AccessNoticeError::Delivery(errors)),
            None => Ok(format!("notified the profile {collection:?}")),
        }
    }
}

/// Whether `ark` can go into a URL path as it is: `ark:/` and characters
/// that need no escaping.
fn plain_ark(ark: &str) -> bool {
    ark.starts_with("ark:/")
        && ark.len() <= 256
        && ark
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ":/._-~+=".contains(c))
}

/// The callback's body.
pub fn callback_body(ended: &AccessEnded<'_>, profile: &str) -> AccessCallback {
    let d = ended.delivery;
    AccessCallback {
        qid: ended.qid.to_string(),
        token: ended.token.token.clone(),
        status: if d.is_some() { "Completed" } else { "Failed" }.into(),
        ark: ended.token.ark.clone(),
        version: d.map_or(ended.token.version, |d| u64::from(d.version)),
        profile: profile.to_string(),
        url: d.map(|d| d.url.clone()),
        size: d.map(|d| d.size),
        sha256: d.map(|d| d.sha256.clone()),
        expires: d.map(|d| d.expires.to_rfc3339()),
        message: ended.message.to_string(),
    }
}

/// The e-mail: subject `ingest access QID ready: ARK` or `ingest access
/// QID failed: REASON` (cut, on one line); the body names the URL, size,
/// digest and expiry, or the whole reason.
pub fn mail_text(ended: &AccessEnded<'_>) -> (String, String) {
    let AccessEnded {
        qid,
        token,
        delivery,
        message,
    } = *ended;
    let ark = ingest_protocol::cut(&token.ark, 256);
    match delivery {
        Some(d) => (
            format!("ingest access {qid} ready: {ark} v{}", d.version),
            format!(
                "The {} container of {ark} version {} is ready.\n\n\
                 URL: {}\nSize: {} bytes\nSHA-256: {}\nAvailable until: {}\n\n{message}\n",
                token.format,
                d.version,
                d.url,
                d.size,
                d.sha256,
                d.expires.to_rfc3339(),
            ),
        ),
        None => {
            let line: String = message
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            (
                format!(
                    "ingest access {qid} failed: {}",
                    ingest_protocol::cut(&line, SUBJECT_MESSAGE_BYTES)
                ),
                format!("The access request {qid} for {ark} failed:\n\n{message}\n"),
            )
        }
    }
}

impl AccessNotice for AccessNotifier {
    fn notify<'a>(
        &'a self,
        engine: &'a ingest_client::Client,
        ended: AccessEnded<'a>,
    ) -> BatchFuture<'a, Result<String, AccessNoticeError>> {
        Box::pin(self.tell(engine, ended))
    }
}

#[cfg(test)]
mod tests {
    use ingest_protocol::node::AccessTokenNode;

    use super::*;

    #[test]
    fn only_plain_arks_are_looked_up() {
        assert!(plain_ark("ark:/99999/fk4abc"));
        for odd in ["ark:/1/a?b", "ark:/1/a#b", "ark:/1/a b", "x", "ark:/1/%2e"] {
            assert!(!plain_ark(odd), "{odd}");
        }
    }

    #[test]
    fn a_failure_subject_is_one_cut_line() {
        let token = AccessTokenNode {
            ark: "ark:/1/2".into(),
            ..AccessTokenNode::default()
        };
        let long = format!("line one\nline two {}", "x".repeat(1000));
        let (subject, body) = mail_text(&AccessEnded {
            qid: "qid0000000001",
            token: &token,
            delivery: None,
            message: &long,
        });
        assert!(subject.starts_with("ingest access qid0000000001 failed: line one line two"));
        assert!(!subject.contains('\n'));
        assert!(subject.len() < 250, "{subject}");
        assert!(body.contains(&long));
    }
}
