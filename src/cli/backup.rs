//! `ingest backup` and `ingest restore`: glue over
//! [`ingest_engine::backup`].

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use ingest_engine::backup::{self, Until};

use super::exit;

/// `ingest backup`.
#[derive(Debug, Clone, Args)]
pub struct BackupArgs {
    /// The file to write (it appears only once whole; an existing file is refused).
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
}

/// `ingest restore`.
#[derive(Debug, Clone, Args)]
pub struct RestoreArgs {
    /// The backup to restore.
    #[arg(long, value_name = "FILE")]
    pub from: PathBuf,
    /// Restore up to this position (the last whole command at or before it).
    #[arg(long, value_name = "POSITION", conflicts_with = "at")]
    pub to_position: Option<u64>,
    /// Restore up to this time (RFC 3339, e.g. 2026-11-24T08:00:00Z): the last whole command at or before it.
    #[arg(long, value_name = "TIME")]
    pub at: Option<String>,
}

/// Takes a backup from the engine at `engine`, or from `data_dir`.
///
/// # Errors
/// The source cannot be read, the copy does not verify, the file cannot be
/// written.
pub fn backup(args: &BackupArgs, engine: Option<&str>, data_dir: &Path) -> Result<i32> {
    if args.out.exists() {
        return Err(exit::Usage(format!(
            "{} already exists: choose a new file for the backup",
            args.out.display()
        ))
        .into());
    }
    let started = std::time::Instant::now();
    let trailer = match engine {
        Some(base) => from_server(base, &args.out)?,
        None => from_data_dir(data_dir, &args.out)?,
    };
    eprintln!(
        "backup written: {} ({} records, head {}, Merkle root {}, {} bytes of records) in {:.1} s",
        args.out.display(),
        trailer.position,
        trailer.head_hash,
        trailer.merkle_root,
        trailer.bytes,
        started.elapsed().as_secs_f64()
    );
    println!("{}", serde_json::to_string_pretty(&trailer)?);
    Ok(0)
}

fn from_data_dir(data_dir: &Path, out: &Path) -> Result<backup::Trailer> {
    let log_dir = ingest_engine::engine::log_dir(data_dir);
    if !log_dir.exists() {
        return Err(exit::Usage(format!("there is no log in {}", data_dir.display())).into());
    }
    let log = match ingest_events::log::Log::open(&log_dir, &Default::default()) {
        Ok(log) => log,
        Err(e @ ingest_events::LogError::Locked { .. }) => {
            return Err(anyhow::Error::new(e).context(
                "a running server holds the data directory: take the backup through it with --engine URL (nothing needs to stop)",
            ))
        }
        Err(e) => return Err(e.into()),
    };
    let head = log.durable_position();
    let frames = log.read_frames(1, head, 1024 * 1024);
    let reader = FramesReader {
        frames: Box::new(frames.map(|f| f.map(|(_, b)| b).map_err(std::io::Error::other))),
        current: std::io::Cursor::new(Vec::new()),
    };
    let expected = if head == 0 {
        None
    } else {
        Some((head, hex::encode(log.read_one(head)?.envelope.hash)))
    };
    Ok(backup::write(
        out,
        reader,
        expected,
        &data_dir.display().to_string(),
    )?)
}

fn from_server(base: &str, out: &Path) -> Result<backup::Trailer> {
    let token = super::backend::token_from(ingest_config::TokenRole::Admin)?
        .context("set INGEST_ADMIN_TOKEN (or INGEST_ADMIN_TOKEN_FILE): a backup reads the whole log, an admin action")?;
    // Any engine of a group can serve it: take the first given.
    let base = base
        .split(',')
        .next()
        .unwrap_or(base)
        .trim()
        .trim_end_matches('/')
        .to_string();
    let url = format!("{base}/replication/frames?from=1");
    let (tx, rx) = std::sync::mpsc::sync_channel::<std::io::Result<Vec<u8>>>(16);
    let (meta_tx, meta_rx) = std::sync::mpsc::channel::<Result<Option<(u64, String)>, NoFrames>>();
    let fetch = std::thread::spawn(move || {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(r) => r,
            Err(e) => {
                let _ = meta_tx.send(Err(NoFrames::Runtime(e)));
                return;
            }
        };
        runtime.block_on(async move {
            let response = match reqwest::Client::new()
                .get(&url)
                .bearer_auth(token)
                .send()
                .await
            {
                Ok(r) => r,
                Err(e) => {
                    let _ = meta_tx.send(Err(NoFrames::Unreachable { url, source: e }));
                    return;
                }
            };
            if !response.status().is_success() {
                let status = response.status();
                let text = response.text().await.unwrap_or_default();
                let _ = meta_tx.send(Err(NoFrames::Answered {
                    url,
                    status,
                    text: ingest_protocol::cut(text.trim(), 500).into_owned(),
                }));
                return;
            }
            let header = |name: &str| {
                response
                    .headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)
            };
            let to = header("ingest-to").and_then(|v| v.parse::<u64>().ok());
            let expected = match (to, header("ingest-to-hash")) {
                (Some(0), _) | (None, _) => None,
                (Some(p), Some(h)) => Some((p, h)),
                (Some(_), None) => None,
            };
            let _ = meta_tx.send(Ok(expected));
            let mut response = response;
            loop {
                match response.chunk().await {
                    Ok(Some(c)) => {
                        if tx.send(Ok(c.to_vec())).is_err() {
                            return;
                        }
                    }
                    Ok(None) => return,
                    Err(e) => {
                        let _ = tx.send(Err(std::io::Error::other(e.to_string())));
                        return;
                    }
                }
            }
        });
    });
    let expected = meta_rx
        .recv()
        .map_err(|_| anyhow::anyhow!("the download stopped"))?
        .map_err(|e| exit::Unreachable(e.to_string()))?;
    let reader = FramesReader {
        frames: Box::new(rx.into_iter()),
        current: std::io::Cursor::new(Vec::new()),
    };
    let written = backup::write(out, reader, expected, &base);
    let _ = fetch.join();
    Ok(written?)
}

/// Why a server's frames could not be had.
#[derive(Debug, thiserror::Error)]
enum NoFrames {
    #[error("{0}")]
    Runtime(#[source] std::io::Error),
    #[error("cannot reach {url}: {source}")]
    Unreachable { url: String, source: reqwest::Error },
    #[error("{url} answered {status}: {text}")]
    Answered {
        url: String,
        status: reqwest::StatusCode,
        text: String,
    },
}

/// A reader over a sequence of byte chunks.
struct FramesReader<'a> {
    frames: Box<dyn Iterator<Item = std::io::Result<Vec<u8>>> + Send + 'a>,
    current: std::io::Cursor<Vec<u8>>,
}

impl Read for FramesReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let n = self.current.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            match self.frames.next() {
                Some(Ok(next)) => self.current = std::io::Cursor::new(next),
                Some(Err(e)) => return Err(e),
                None => return Ok(0),
            }
        }
    }
}

/// Restores a backup into `data_dir`.
///
/// # Errors
/// The backup is refused or the data directory is not empty.
pub fn restore(args: &RestoreArgs, data_dir: &Path) -> Result<i32> {
    let until = match (&args.to_position, &args.at) {
        (Some(p), _) => Until::Position(*p),
        (None, Some(t)) => Until::Time(
            chrono::DateTime::parse_from_rfc3339(t)
                .map_err(|e| {
                    exit::Usage(format!(
                        "--at {}: {e} (RFC 3339, e.g. 2026-11-24T08:00:00Z)",
                        ingest_protocol::cut(t, 100)
                    ))
                })?
                .with_timezone(&chrono::Utc),
        ),
        (None, None) => Until::End,
    };
    let started = std::time::Instant::now();
    match backup::restore(&args.from, data_dir, until) {
        Ok(r) => {
            eprintln!(
                "restored {} of the backup's {} records into {} (head {}); {} records verified in {:.1} s",
                r.position,
                r.backup.position,
                data_dir.display(),
                r.head_hash,
                r.verified,
                started.elapsed().as_secs_f64()
            );
            println!("{}", serde_json::to_string_pretty(&r)?);
            Ok(0)
        }
        Err(e @ (backup::BackupError::Invalid(_) | backup::BackupError::NotEmpty(_))) => {
            Err(super::backend::Refused(e.to_string()).into())
        }
        Err(e) => Err(e.into()),
    }
}
