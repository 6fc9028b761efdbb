//! Where a CLI command runs: on the data directory ([`Local`], which opens
//! the engine) or through a running server ([`Remote`], `--engine URL`).
//!
//! Each command is written once against [`Backend`] and prints the same
//! protocol types either way, so `ingest show`, `history`, `status` and
//! `verify` give the same shape locally and through a server.

use anyhow::{Context, Result};
use ingest_client::{Client, ClientError};
use ingest_engine::{Engine, EngineError};
use ingest_events::command::Command;
use ingest_events::{Actor, Bid, Jid};
use ingest_projections::Views;
use ingest_protocol::api::{AdminBody, Submitted, Verified};
use ingest_protocol::history::{HistoryQuery, HistoryRow};
use ingest_protocol::listing::{BatchPage, BatchQuery, JobPage, JobQuery};
use ingest_protocol::report::BatchView;
use ingest_protocol::submission::SubmissionInput;
use ingest_protocol::view::{JobView, StatusView};

/// An action refused by the engine or the server: printed as `refused: …`
/// and exit code 1, with nothing appended.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// What an admin action does, independent of where it runs.
#[derive(Debug, Clone)]
pub struct AdminAction {
    /// The engine command (local) …
    pub command: Command,
    /// … and the API endpoint that carries it (remote).
    pub route: ingest_protocol::endpoint::AdminAction,
    /// The reason recorded.
    pub reason: String,
}

/// The operations every command is written against.
pub trait Backend {
    /// Submits a batch.
    fn submit(&mut self, input: SubmissionInput, actor: Option<Actor>) -> Result<Submitted>;
    /// A batch's reporting view.
    fn batch(&mut self, bid: Bid) -> Result<BatchView>;
    /// A job.
    fn job(&mut self, jid: Jid) -> Result<JobView>;
    /// A batch's history with its jobs'.
    fn batch_history(&mut self, bid: Bid) -> Result<Vec<HistoryRow>>;
    /// A job's history.
    fn job_history(&mut self, jid: Jid) -> Result<Vec<HistoryRow>>;
    /// The events a history query asks for, and whether more matched than its limit.
    fn history(&mut self, query: &HistoryQuery) -> Result<(Vec<HistoryRow>, bool)>;
    /// Queue-wide figures.
    fn status(&mut self) -> Result<StatusView>;
    /// The hash chain and stream index, checked.
    fn verify(&mut self) -> Result<Verified>;
    /// An admin action; the rows it appended.
    fn admin(&mut self, action: AdminAction) -> Result<Vec<HistoryRow>>;
    /// One page of batches by filters.
    fn list_batches(&mut self, query: &BatchQuery) -> Result<BatchPage>;
    /// One page of jobs by filters.
    fn list_jobs(&mut self, query: &JobQuery) -> Result<JobPage>;
}

/// The engine on the data directory.
pub struct Local {
    /// The opened engine.
    pub engine: Engine,
    /// Who acts.
    pub actor: Actor,
}

impl Local {
    /// Runs one command as `actor`; a refusal is [`Refused`].
    pub fn execute(&mut self, actor: &Actor, command: &Command) -> Result<Vec<HistoryRow>> {
        match self.engine.execute(actor, command) {
            Ok(outcome) => Ok(outcome.records.iter().map(HistoryRow::from).collect()),
            Err(EngineError::Rejected(r)) => Err(Refused(r.to_string()).into()),
            Err(e) => Err(e.into()),
        }
    }
}

impl Backend for Local {
    fn submit(&mut self, input: SubmissionInput, actor: Option<Actor>) -> Result<Submitted> {
        let uuid = match input.uuid.as_deref() {
            Some(u) => uuid::Uuid::parse_str(u.trim()).map_err(|e| {
                super::exit::Usage(format!(
                    "uuid {:?} is not a uuid ({e})",
                    ingest_protocol::cut(u, 64)
                ))
            })?,
            None => uuid::Uuid::new_v4(),
        };
        let submission = input.build().context("invalid submission")?;
        let actor = actor.unwrap_or_else(|| Actor::depositor(submission.submitter.clone()));
        self.execute(&actor, &Command::SubmitBatch { uuid, submission })?;
        let bid = self
            .engine
            .state()
            .uuids
            .get(&uuid)
            .copied()
            .context("the submission appended no batch")?;
        Ok(Submitted {
            bid: bid.to_string(),
            uuid: uuid.to_string(),
            status: "Pending".into(),
        })
    }

    fn batch(&mut self, bid: Bid) -> Result<BatchView> {
        // The same fold the server keeps: the reporting views of the log.
        let mut views = Views::new();
        for record in self.engine.log().read_from(1) {
            views
                .apply(&record.context("reading the event log")?)
                .context("folding the reporting views")?;
        }
        views
            .batch(bid)
            .ok_or_else(|| Refused(format!("batch {bid} does not exist")).into())
    }

    fn job(&mut self, jid: Jid) -> Result<JobView> {
        self.engine
            .state()
            .jobs
            .get(&jid)
            .map(JobView::from)
            .ok_or_else(|| Refused(format!("job {jid} does not exist")).into())
    }

    fn batch_history(&mut self, bid: Bid) -> Result<Vec<HistoryRow>> {
        if !self.engine.state().batches.contains_key(&bid) {
            return Err(Refused(format!("batch {bid} does not exist")).into());
        }
        ingest_engine::history::batch_history(self.engine.log(), self.engine.state(), bid)
    }

    fn job_history(&mut self, jid: Jid) -> Result<Vec<HistoryRow>> {
        if !self.engine.state().jobs.contains_key(&jid) {
            return Err(Refused(format!("job {jid} does not exist")).into());
        }
        ingest_engine::history::job_history(self.engine.log(), self.engine.state(), jid)
    }

    fn history(&mut self, query: &HistoryQuery) -> Result<(Vec<HistoryRow>, bool)> {
        use ingest_engine::history::Scope;
        let state = self.engine.state();
        let scope = match (query.batch, query.job) {
            (Some(bid), _) => Scope::Batch(
                bid,
                state
                    .batches
                    .get(&bid)
                    .ok_or_else(|| Refused(format!("batch {bid} does not exist")))?
                    .jobs
                    .clone(),
            ),
            (None, Some(jid)) => {
                if !state.jobs.contains_key(&jid) {
                    return Err(Refused(format!("job {jid} does not exist")).into());
                }
                Scope::Job(jid)
            }
            (None, None) => Scope::Log,
        };
        ingest_engine::history::query(self.engine.log(), &scope, query)
    }

    fn status(&mut self) -> Result<StatusView> {
        Ok(self.engine.status_view())
    }

    fn verify(&mut self) -> Result<Verified> {
        let log = self.engine.log();
        let (head, _) = log.head();
        // A progress bar on a terminal (hidden otherwise); the INFO lines
        // stay for logs.
        let bar = indicatif::ProgressBar::new(head);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "verifying {bar:40} {pos}/{len} events, {per_sec}, {eta} left",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        let full = ingest_engine::audit::verify(log, self.engine.data_dir(), None, |p| {
            if p % 4096 == 0 {
                bar.set_position(p);
            }
            if p % 100_000 == 0 {
                tracing::info!(position = p, head, "verifying");
            }
        })?;
        bar.finish_and_clear();
        Ok(verified(full))
    }

    fn admin(&mut self, action: AdminAction) -> Result<Vec<HistoryRow>> {
        let actor = self.actor.clone();
        self.execute(&actor, &action.command)
    }

    fn list_batches(&mut self, query: &BatchQuery) -> Result<BatchPage> {
        ingest_engine::listing::batches(self.engine.state(), query).map_err(refused_query)
    }

    fn list_jobs(&mut self, query: &JobQuery) -> Result<JobPage> {
        ingest_engine::listing::jobs(self.engine.state(), query).map_err(refused_query)
    }
}

/// A refused query (a server's 400 says the same) reads as the CLI's own
/// refusal.
fn refused_query(e: ingest_protocol::listing::QueryError) -> anyhow::Error {
    Refused(e.to_string()).into()
}

/// A full verification report in the protocol's shape.
pub(super) fn verified(full: ingest_engine::audit::FullReport) -> Verified {
    ingest_engine::verified::view(&full)
}

/// A running server, through its HTTP API.
pub struct Remote {
    client_admin: Option<Client>,
    client_reader: Option<Client>,
    runtime: tokio::runtime::Runtime,
    base: String,
    /// The admin's name recorded with actions (`admin:NAME`).
    pub admin_name: String,
}

/// Reads a token from `var` or the file `file_var` names.
pub(super) fn token_from(role: ingest_config::TokenRole) -> Result<Option<String>> {
    // The server's own reader: `_FILE` wins over the value, with the same
    // checks (the CLI read the value first, and unchecked).
    Ok(ingest_config::token_from_env(role)?.map(|s| s.expose().to_string()))
}

impl Remote {
    /// A backend for the server at `base`, with the tokens of the
    /// environment (`INGEST_ADMIN_TOKEN`, else `INGEST_DEPOSITOR_TOKEN` for
    /// reading and submitting, or their `_FILE` forms).
    ///
    /// # Errors
    /// A base that is not a URL, an unreadable token file, no runtime.
    pub fn new(base: &str, admin_name: String) -> Result<Remote> {
        let admin = token_from(ingest_config::TokenRole::Admin)?;
        let depositor = token_from(ingest_config::TokenRole::Depositor)?;
        let timeout = std::time::Duration::from_secs(300);
        let client = |t: &String| Client::with_timeout(base, t, timeout);
        let client_admin = admin.as_ref().map(client).transpose()?;
        let client_reader = match &admin {
            Some(_) => client_admin.clone(),
            None => depositor.as_ref().map(client).transpose()?,
        };
        // A bad URL is reported even without tokens.
        Client::new(base, "")?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start a runtime")?;
        Ok(Remote {
            client_admin,
            client_reader,
            runtime,
            base: base.trim_end_matches('/').to_string(),
            admin_name,
        })
    }

    fn admin_client(&self) -> Result<&Client> {
        self.client_admin.as_ref().context(
            "set INGEST_ADMIN_TOKEN or INGEST_ADMIN_TOKEN_FILE: this command is an admin action on the server",
        )
    }

    fn reader(&self) -> Result<&Client> {
        self.client_reader.as_ref().context(
            "set INGEST_ADMIN_TOKEN (or INGEST_DEPOSITOR_TOKEN, or their _FILE forms) to talk to the server",
        )
    }

    /// Runs `call` on the runtime and turns the client's errors into the
    /// CLI's: 4xx is a [`Refused`] (exit 1), 401 says which token to set.
    pub fn run<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, ClientError>>,
    ) -> Result<T> {
        match self.runtime.block_on(call) {
            Ok(v) => Ok(v),
            Err(ClientError::Status {
                status: 401, code, ..
            }) => Err(super::exit::Unreachable(format!(
                "the server at {} refused the token (401 {code}): set INGEST_ADMIN_TOKEN to its admin token",
                self.base
            ))
            .into()),
            Err(ClientError::Status {
                status,
                code,
                message,
                ..
            }) if (400..500).contains(&status) => {
                Err(Refused(format!("{message} ({status} {code})")).into())
            }
            Err(e @ ClientError::Transport { .. }) => {
                Err(anyhow::Error::new(e).context("cannot reach the server"))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The admin client, for commands outside [`Backend`].
    ///
    /// # Errors
    /// No admin token.
    pub fn admin_api(&self) -> Result<&Client> {
        self.admin_client()
    }

    /// The reading client, for commands outside [`Backend`].
    ///
    /// # Errors
    /// No token.
    pub fn reader_api(&self) -> Result<&Client> {
        self.reader()
    }
}

impl Backend for Remote {
    fn submit(&mut self, input: SubmissionInput, _actor: Option<Actor>) -> Result<Submitted> {
        let client = self.reader()?;
        self.run(client.submit(&input))
    }

    fn batch(&mut self, bid: Bid) -> Result<BatchView> {
        let client = self.reader()?;
        self.run(client.batch(bid))
    }

    fn job(&mut self, jid: Jid) -> Result<JobView> {
        let client = self.reader()?;
        self.run(client.job(jid))
    }

    fn batch_history(&mut self, bid: Bid) -> Result<Vec<HistoryRow>> {
        let client = self.reader()?;
        Ok(self.run(client.batch_history(bid))?.events)
    }

    fn job_history(&mut self, jid: Jid) -> Result<Vec<HistoryRow>> {
        let client = self.reader()?;
        Ok(self.run(client.job_history(jid))?.events)
    }

    fn history(&mut self, query: &HistoryQuery) -> Result<(Vec<HistoryRow>, bool)> {
        let client = self.reader()?;
        let h = self.run(client.history(query))?;
        Ok((h.events, h.truncated))
    }

    fn status(&mut self) -> Result<StatusView> {
        let client = self.admin_client()?;
        self.run(client.status())
    }

    fn verify(&mut self) -> Result<Verified> {
        let client = self.admin_client()?;
        self.run(client.verify())
    }

    fn admin(&mut self, action: AdminAction) -> Result<Vec<HistoryRow>> {
        let client = self.admin_client()?;
        let body = AdminBody {
            actor: Some(self.admin_name.clone()),
            reason: action.reason,
        };
        Ok(self.run(client.admin(&action.route, &body))?.events)
    }

    fn list_batches(&mut self, query: &BatchQuery) -> Result<BatchPage> {
        let client = self.reader()?;
        self.run(client.list_batches(query))
    }

    fn list_jobs(&mut self, query: &JobQuery) -> Result<JobPage> {
        let client = self.reader()?;
        self.run(client.list_jobs(query))
    }
}
