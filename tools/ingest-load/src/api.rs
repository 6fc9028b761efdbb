//! The server's API, through the typed client.

use anyhow::{Context, Result};
use ingest_client::Client;
use ingest_events::Bid;
use ingest_protocol::history::HistoryRow;
use ingest_protocol::report::BatchView;
use ingest_protocol::submission::SubmissionInput;
use ingest_protocol::view::StatusView;

use crate::procs::*;

/// The API of one server, through the typed client: the admin token for
/// reading, the depositor token for submitting.
pub(crate) struct Api {
    pub(crate) admin: Client,
    pub(crate) depositor: Client,
}

impl Api {
    pub(crate) fn new(base: &str, tokens: &Tokens) -> Result<Api> {
        Ok(Api {
            admin: Client::new(base, &tokens.admin)?,
            depositor: Client::new(base, &tokens.depositor)?,
        })
    }

    pub(crate) async fn status(&self) -> Result<StatusView> {
        Ok(self.admin.status().await?)
    }

    pub(crate) async fn history(&self, bid: &str) -> Result<Vec<HistoryRow>> {
        let bid: Bid = bid.parse().map_err(anyhow::Error::msg)?;
        Ok(self.admin.batch_history(bid).await?.events)
    }

    pub(crate) async fn batch(&self, bid: &str) -> Result<BatchView> {
        let bid: Bid = bid.parse().map_err(anyhow::Error::msg)?;
        Ok(self.admin.batch(bid).await?)
    }

    pub(crate) async fn metrics(&self) -> Result<String> {
        Ok(self.admin.get(&ingest_protocol::endpoint::Metrics).await?)
    }

    pub(crate) async fn submit(&self, batch: usize, jobs: usize) -> Result<String> {
        let manifest: Vec<String> = (0..jobs)
            .map(|i| format!("https://example.org/load/{batch}/{i}.txt loc{batch}-{i}"))
            .collect();
        let body = SubmissionInput {
            submitter: Some("load".into()),
            profile: Some("load".into()),
            payload_type: Some("object-manifest".into()),
            payload_url: Some(format!("https://example.org/load/{batch}.checkm")),
            manifest,
            ..SubmissionInput::default()
        };
        self.submit_body(batch, &body).await
    }

    /// Submits batch `n`; its bid.
    pub(crate) async fn submit_body(&self, n: usize, body: &SubmissionInput) -> Result<String> {
        let submitted = self
            .depositor
            .submit(body)
            .await
            .with_context(|| format!("POST /batches (batch {n})"))?;
        Ok(submitted.bid)
    }
}
