//! `ingest audit`: evidence an auditor can take away. `export` and `prove`
//! read the data directory; `verify` needs nothing but the file (and,
//! optionally, the engine's public key).

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use ingest_engine::audit::{self, ExportError, Verified};
use ingest_engine::Engine;
use ingest_protocol::history::{table, HistoryRow};

use super::args::AuditAction;
use super::output::write_stdout;

/// `audit export` and `audit prove` on the data directory.
pub(super) fn run(engine: &mut Engine, action: AuditAction) -> Result<i32> {
    match action {
        AuditAction::Export {
            batch,
            out,
            checkpoint_key,
        } => {
            let mut bundle = audit::export_batch(engine.log(), engine.state(), batch);
            let unsigned = matches!(bundle, Err(ExportError::Refused(_)))
                && engine.state().batches.contains_key(&batch);
            if let (true, Some(key)) = (unsigned, &checkpoint_key) {
                // No signed head covers the batch yet: sign one now.
                engine
                    .use_checkpoint_key(key)
                    .with_context(|| format!("cannot use the key {}", key.display()))?;
                if let Some(outcome) = engine.checkpoint_now()? {
                    if let Some(last) = outcome.records.last() {
                        engine.wait_durable(last.envelope.position)?;
                        eprintln!(
                            "signed a new checkpoint at position {}",
                            last.envelope.position
                        );
                    }
                }
                bundle = audit::export_batch(engine.log(), engine.state(), batch);
            }
            let bundle = match bundle {
                Ok(b) => b,
                Err(ExportError::Refused(why)) => {
                    eprintln!("refused: {why}");
                    return Ok(1);
                }
                Err(e) => return Err(e.into()),
            };
            write_out(out.as_deref(), &serde_json::to_string_pretty(&bundle)?)?;
            eprintln!(
                "{} events of {batch} with inclusion proofs against the signed head at position {} (tree size {})",
                bundle.events.len(),
                bundle.head.checkpoint_position,
                bundle.head.tree_size
            );
            Ok(0)
        }
        AuditAction::Prove { from, to, out } => match audit::prove(engine.log(), from, to) {
            Ok(file) => {
                write_out(out.as_deref(), &serde_json::to_string_pretty(&file)?)?;
                eprintln!(
                    "consistency proof from tree size {} to {} ({} nodes)",
                    file.from.tree_size,
                    file.to.tree_size,
                    file.proof.len()
                );
                Ok(0)
            }
            Err(ExportError::Refused(why)) => {
                eprintln!("refused: {why}");
                Ok(1)
            }
            Err(e) => Err(e.into()),
        },
        AuditAction::Verify { file, key } => verify(&file, key.as_deref()),
    }
}

/// `audit export` and `audit prove` through a running server (`GET
/// /audit/bundle`, `GET /audit/proof`): the same files, while it runs.
pub(super) fn remote(remote: &super::backend::Remote, action: AuditAction) -> Result<i32> {
    let client = remote.admin_api()?;
    let (text, out) = match action {
        AuditAction::Export {
            checkpoint_key: Some(_),
            ..
        } => anyhow::bail!(super::exit::Usage(
            "--checkpoint-key signs with a data directory's engine; a server signs its checkpoints with its own key (`ingest serve --checkpoint-key`, every --checkpoint-every-events)".into()
        )),
        AuditAction::Export { batch, out, .. } => {
            (remote.run(client.audit_bundle(&batch.to_string()))?, out)
        }
        AuditAction::Prove { from, to, out } => (remote.run(client.audit_proof(from, to))?, out),
        AuditAction::Verify { file, key } => return verify(&file, key.as_deref()),
    };
    write_out(out.as_deref(), text.trim_end())?;
    // Say what was written, read back as `audit verify` reads it.
    match audit::verify_file(text.as_bytes(), None) {
        Ok(Verified::Bundle { batch, head, events, .. }) => eprintln!(
            "{} events of {batch} with inclusion proofs against the signed head at position {} (tree size {})",
            events.len(),
            head.checkpoint_position,
            head.tree_size
        ),
        Ok(Verified::Consistency { from, to, .. }) => eprintln!(
            "consistency proof from tree size {} to {}",
            from.tree_size, to.tree_size
        ),
        Err(failures) => {
            eprintln!(
                "warning: the server's file does not verify ({} problem(s)); run `ingest audit verify` on it",
                failures.len()
            );
            return Ok(1);
        }
    }
    Ok(0)
}

fn write_out(out: Option<&Path>, text: &str) -> Result<()> {
    match out {
        Some(path) => std::fs::write(path, format!("{text}\n"))
            .with_context(|| format!("cannot write {}", path.display())),
        None => {
            write_stdout(&format!("{text}\n"));
            Ok(())
        }
    }
}

/// Reads at most `limit` bytes of `path`; a longer file is refused.
fn read_bounded(path: &PathBuf, limit: u64) -> Result<Vec<u8>> {
    let f = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut bytes = Vec::new();
    f.take(limit + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read {}", path.display()))?;
    if bytes.len() as u64 > limit {
        anyhow::bail!(super::exit::Usage(format!(
            "{} is larger than {limit} bytes; not an audit file",
            path.display()
        )));
    }
    Ok(bytes)
}

/// `audit verify FILE [--key PUB]`: exit 0 when it holds, 1 with every
/// failure named.
pub(super) fn verify(file: &Path, key: Option<&Path>) -> Result<i32> {
    let pinned = match key {
        Some(path) => {
            let pem = read_bounded(&path.to_path_buf(), 64 * 1024)?;
            let pem = String::from_utf8_lossy(&pem);
            // `ingest keys show` prints a `# fingerprint` line before the PEM.
            let pem = pem.find("-----BEGIN").map_or(&*pem, |at| &pem[at..]);
            Some(
                ingest_steps::signing::public_key_from_pem(pem)
                    .with_context(|| format!("--key {}", path.display()))?,
            )
        }
        None => None,
    };
    let text = read_bounded(&file.to_path_buf(), audit::MAX_AUDIT_FILE_BYTES)?;
    match audit::verify_file(&text, pinned) {
        Ok(Verified::Bundle {
            batch,
            head,
            events,
            fingerprint,
        }) => {
            let rows: Vec<HistoryRow> = events.iter().map(HistoryRow::from).collect();
            write_stdout(&table(&rows));
            println!(
                "ok: {} events of {batch} are in the log whose tree head (size {}, root {}) key {fingerprint} signed{}",
                events.len(),
                head.tree_size,
                head.root,
                if pinned.is_some() { " (the given key)" } else { "" }
            );
            Ok(0)
        }
        Ok(Verified::Consistency {
            from,
            to,
            fingerprint,
        }) => {
            println!(
                "ok: the log of tree size {} (root {}) is a prefix of the log of tree size {} (root {}); both heads signed by {fingerprint}{}",
                from.tree_size,
                from.root,
                to.tree_size,
                to.root,
                if pinned.is_some() { " (the given key)" } else { "" }
            );
            Ok(0)
        }
        Err(failures) => {
            for f in &failures {
                println!("{f}");
            }
            println!("FAILED: {} problem(s)", failures.len());
            Ok(1)
        }
    }
}
