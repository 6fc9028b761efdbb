//! The access daemons' real work (issue 24): a request's object version is
//! assembled from the storage targets ([`ingest_steps::assemble`]: read
//! through the OCFL inventory, every byte checked against its digest while
//! it streams, the next target tried after a failure) into a container in
//! the delivery area, under a name that carries its expiry and a fresh
//! 128-bit secret ([`ingest_protocol::delivery`]). The request's outcome
//! names the URL `ingest serve` answers it at, its size, SHA-256, ready
//! time and expiry.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use ingest_protocol::access::{AccessContent, AccessDelivery};
use ingest_protocol::delivery;
use ingest_protocol::node::AccessTokenNode;
use ingest_steps::assemble::{
    assemble_from_any, AssembleError, Container, Content, Observer, Progress, Request,
};
use ingest_steps::ocfl::OcflTarget;

/// How long a container is served when no TTL is configured: a week.
pub const DEFAULT_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// Why a request could not be assembled (its message is the request's).
#[derive(Debug, thiserror::Error)]
pub enum AssemblyError {
    /// The token names a format this assembler does not write.
    #[error("unknown container format {0:?} (zip, tar or targz)")]
    Format(String),
    /// The token names a content other than producer or full.
    #[error("unknown content {0:?} (producer or full)")]
    Content(String),
    /// Every target failed; the earlier failures are named before the last.
    #[error("{}{last}", earlier.iter().map(|e| format!("{e}; then ")).collect::<String>())]
    Targets {
        /// The failures before the last, one per target tried.
        earlier: Vec<AssembleError>,
        /// The last target's failure.
        last: Box<AssembleError>,
    },
    /// The delivery area could not be written.
    #[error("the delivery area {}: {source}", path.display())]
    Delivery {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// No randomness for the delivery's secret.
    #[error("cannot draw a delivery secret: {0}")]
    Random(String),
}

/// What a finished assembly reports: where the container is, and which
/// targets failed before the one that gave it.
#[derive(Debug)]
pub struct Finished {
    /// The delivery to record.
    pub delivery: AccessDelivery,
    /// Targets that failed first (a changed byte names the file), as the
    /// outcome's message says.
    pub failed_over: Vec<String>,
}

/// The assembler of one worker process.
pub struct Assembler {
    targets: Vec<Arc<OcflTarget>>,
    delivery_dir: PathBuf,
    base_url: String,
    ttl: Duration,
    /// Tests only (`--assembly-pause-ms`): each assembly waits this long
    /// once its first file is packed, so a test sees it in progress.
    pause: Duration,
}

impl std::fmt::Debug for Assembler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Assembler")
            .field(
                "targets",
                &self.targets.iter().map(|t| t.name()).collect::<Vec<_>>(),
            )
            .field("delivery_dir", &self.delivery_dir)
            .field("ttl", &self.ttl)
            .finish()
    }
}

impl Assembler {
    /// An assembler reading `targets` (in order) and writing into
    /// `delivery_dir`, naming URLs under `base_url` (the server's content
    /// URL), each served for `ttl` (0: [`DEFAULT_TTL`]).
    ///
    /// # Errors
    /// The delivery area cannot be created.
    pub fn new(
        targets: Vec<Arc<OcflTarget>>,
        delivery_dir: PathBuf,
        base_url: &str,
        ttl: Duration,
    ) -> std::io::Result<Assembler> {
        std::fs::create_dir_all(&delivery_dir)?;
        Ok(Assembler {
            targets,
            delivery_dir,
            base_url: base_url.trim_end_matches('/').to_string(),
            ttl: if ttl.is_zero() { DEFAULT_TTL } else { ttl },
            pause: Duration::ZERO,
        })
    }

    /// Tests only: each assembly waits `pause` once its first file is
    /// packed (`ingest worker --assembly-pause-ms`, hidden).
    pub fn set_pause(&mut self, pause: Duration) {
        self.pause = pause;
    }

    /// The delivery area.
    pub fn delivery_dir(&self) -> &Path {
        &self.delivery_dir
    }

    /// Assembles what `token` asks for (blocking: call it off the async
    /// runtime), telling `observe` how far it got as it goes.
    ///
    /// # Errors
    /// [`AssemblyError`]: a bad format or content, every target failing
    /// (each named), or the delivery area.
    pub fn assemble(
        &self,
        token: &AccessTokenNode,
        observe: Option<Observer<'_>>,
    ) -> Result<Finished, AssemblyError> {
        let container = Container::parse(&token.format)
            .ok_or_else(|| AssemblyError::Format(ingest_protocol::cut(&token.format, 32).into()))?;
        let content = match token.content.as_str() {
            "" => AccessContent::Producer,
            c => c
                .parse::<AccessContent>()
                .map_err(|_| AssemblyError::Content(ingest_protocol::cut(c, 32).into()))?,
        };
        let content = match content {
            AccessContent::Producer => Content::Producer,
            AccessContent::Full => Content::Full,
            AccessContent::Object => Content::Object,
        };
        let mut secret = [0u8; 16];
        getrandom::getrandom(&mut secret).map_err(|e| AssemblyError::Random(e.to_string()))?;
        let expires =
            Utc::now() + chrono::Duration::from_std(self.ttl).unwrap_or(chrono::Duration::days(7));
        let name = delivery::name(expires.timestamp(), &secret, container.extension());
        let dest = self.delivery_dir.join(&name);
        // Built under a hidden name and renamed when whole, so the URL never
        // serves a partial container.
        let building = self.delivery_dir.join(format!(".building-{name}"));
        let version = (token.version > 0).then(|| u32::try_from(token.version).unwrap_or(u32::MAX));
        let request = Request {
            ark: &token.ark,
            version,
            content,
            container,
            bag: token.bag,
        };
        let paused = std::sync::atomic::AtomicBool::new(self.pause.is_zero());
        let tell = |p: &Progress| {
            if let Some(observe) = observe {
                observe(p);
            }
            if p.files > 0 && !paused.swap(true, std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(self.pause);
            }
        };
        let (result, earlier) = assemble_from_any(
            self.targets.iter().map(|t| t.as_ref()),
            &request,
            &building,
            Some(&tell),
        );
        let (done, container) = match result {
            Ok(delivered) => delivered,
            Err(last) => {
                return Err(AssemblyError::Targets {
                    earlier,
                    last: Box::new(last),
                })
            }
        };
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| AssemblyError::Delivery { path, source }
        };
        // Hashed as it was written (a zip, whose writer seeks back, read
        // once more): no second read of a tar.
        let (size, sha256) = (container.size, container.sha256);
        std::fs::rename(&building, &dest).map_err(io(&dest))?;
        Ok(Finished {
            delivery: AccessDelivery {
                url: format!("{}{}/{name}", self.base_url, delivery::DELIVERY_PATH),
                size,
                sha256,
                target: done.target,
                version: done.version,
                ready: Utc::now(),
                expires,
            },
            failed_over: earlier.iter().map(|e| e.to_string()).collect(),
        })
    }
}

/// Removes the containers in `dir` whose expiry (in their name) is before
/// `now_unix`, and building files left by a crash older than a day; the
/// bytes freed. Names that are not deliveries are left alone.
pub fn sweep_expired(dir: &Path, now_unix: i64) -> (usize, u64) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (0, 0);
    };
    let (mut removed, mut freed) = (0, 0);
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Ok(meta) = entry.path().symlink_metadata() else {
            continue;
        };
        let stale_build = name.starts_with(".building-")
            && meta
                .modified()
                .ok()
                .and_then(|m| m.elapsed().ok())
                .is_some_and(|age| age > Duration::from_secs(24 * 3600));
        let expired = delivery::expiry(name).is_some_and(|e| e < now_unix);
        if (expired || stale_build) && meta.is_file() {
            let path = entry.path();
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    removed += 1;
                    freed += meta.len();
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "an expired delivery could not be removed")
                }
            }
        }
    }
    (removed, freed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_expired_deliveries_are_swept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let expired = delivery::name(100, &[1; 16], "zip");
        let live = delivery::name(300, &[2; 16], "tar");
        for name in [&expired, &live, &"notes.txt".to_string()] {
            std::fs::write(dir.path().join(name), b"12345").expect("write");
        }
        assert_eq!(sweep_expired(dir.path(), 200), (1, 5));
        assert!(!dir.path().join(&expired).exists());
        assert!(dir.path().join(&live).exists());
        assert!(
            dir.path().join("notes.txt").exists(),
            "a foreign file stays"
        );
    }
}
