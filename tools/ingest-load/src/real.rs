//! The real mode: generated files served on loopback, fetched by curl as
//! the baseline and ingested by the real steps.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use axum::body::Bytes;
use chrono::{DateTime, Utc};
use ingest_protocol::submission::SubmissionInput;
use serde_json::json;
use tokio::process::Command;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::api::*;
use crate::history::*;
use crate::procs::*;
use crate::simulate::*;
use crate::*;

/// The ZooKeeper-free part of a round's corpus: what curl fetches and what
/// the batches submit.
pub(crate) struct Corpus {
    pub(crate) files_per_object: usize,
    /// Every file's URL, per object.
    pub(crate) urls: Vec<Vec<String>>,
    /// Each object's checkm manifest URL.
    pub(crate) manifests: Vec<String>,
    /// All files' bytes together.
    pub(crate) bytes: u64,
    pub(crate) files: usize,
}

/// The files the local HTTP server serves, by path under `/files/`.
pub(crate) type Depot = Arc<std::sync::RwLock<BTreeMap<String, Bytes>>>;

pub(crate) async fn depot_get(
    axum::extract::State(depot): axum::extract::State<Depot>,
    axum::extract::Path(path): axum::extract::Path<String>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let found = match depot.read() {
        Ok(files) => files.get(&path).cloned(),
        Err(_) => return axum::http::StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    };
    match found {
        Some(body) => (
            [(axum::http::header::CONTENT_TYPE, "application/octet-stream")],
            body,
        )
            .into_response(),
        None => axum::http::StatusCode::NOT_FOUND.into_response(),
    }
}

/// Serves `depot` on `http://127.0.0.1:PORT/files/PATH` (GET and HEAD) in
/// this process; gives the base URL. The server lives until the runtime ends.
pub(crate) async fn serve_depot(depot: Depot) -> Result<String> {
    let app = axum::Router::new()
        .route("/files/{*path}", axum::routing::get(depot_get))
        .with_state(depot);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("cannot bind the file server to 127.0.0.1")?;
    let addr = listener.local_addr().context("the file server's address")?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            eprintln!("ingest-load: the file server stopped: {e}");
        }
    });
    Ok(format!("http://{addr}"))
}

/// `len` pseudo-random bytes, the same for the same seed (fastrand's
/// seeded generator: fast, deterministic, and not compressible, so no layer
/// can shortcut them).
pub(crate) fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    fastrand::Rng::with_seed(seed).fill(&mut out);
    out
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    use ingest_steps::digest::{Algorithm, MultiHasher};
    let mut h = MultiHasher::new(&[Algorithm::Sha256]);
    h.update(bytes);
    h.finish()
        .into_iter()
        .next()
        .map(|(_, hex)| hex)
        .unwrap_or_default()
}

/// The sizes of an object's `files` files, `object_bytes` in all (the
/// first files take the remainder).
pub(crate) fn file_sizes(object_bytes: u64, files: usize) -> Vec<u64> {
    let n = files as u64;
    (0..n)
        .map(|i| object_bytes / n + u64::from(i < object_bytes % n))
        .collect()
}

/// A checkm 0.7 object manifest (Merritt's mrt-ingest-manifest profile):
/// one line per file with its URL, sha256, size and name.
pub(crate) fn object_manifest(lines: &[(String, String, u64, String)]) -> String {
    let mut m = String::from(
        "#%checkm_0.7\n\
         #%profile | http://uc3.cdlib.org/registry/ingest/manifest/mrt-ingest-manifest\n\
         #%prefix | nfo: | http://www.semanticdesktop.org/ontologies/2007/03/22/nfo#\n\
         #%prefix | mrt: | http://merritt.cdlib.org/terms#\n\
         #%fields | nfo:fileUrl | nfo:hashAlgorithm | nfo:hashValue | nfo:fileSize | nfo:fileLastModified | nfo:fileName | mrt:mimeType\n",
    );
    for (url, sha, size, name) in lines {
        let _ = writeln!(
            m,
            "{url} | sha256 | {sha} | {size} | | {name} | application/octet-stream"
        );
    }
    m.push_str("#%eof\n");
    m
}

/// Generates the round's files and manifests into `depot` (replacing the
/// previous round's) and describes them.
pub(crate) fn build_corpus(args: &Args, depot: &Depot, base: &str, f: usize) -> Result<Corpus> {
    let mut files = BTreeMap::new();
    let mut urls = Vec::with_capacity(args.objects);
    let mut manifests = Vec::with_capacity(args.objects);
    let mut bytes = 0u64;
    let sizes = file_sizes(args.object_bytes, f);
    for o in 0..args.objects {
        let mut lines = Vec::with_capacity(f);
        let mut object_urls = Vec::with_capacity(f);
        for (i, &size) in sizes.iter().enumerate() {
            let seed = args.seed
                ^ (f as u64).wrapping_mul(0x1000_0000_01b3)
                ^ (o as u64).wrapping_mul(0x9e37_79b9)
                ^ ((i as u64) << 1);
            let body = random_bytes(seed, usize::try_from(size).context("a file too large")?);
            let name = format!("f{i:04}.bin");
            let path = format!("r{f}/o{o:04}/{name}");
            let url = format!("{base}/files/{path}");
            lines.push((url.clone(), sha256_hex(&body), size, name));
            object_urls.push(url);
            files.insert(path, Bytes::from(body));
            bytes += size;
        }
        let path = format!("r{f}/o{o:04}.checkm");
        manifests.push(format!("{base}/files/{path}"));
        files.insert(path, Bytes::from(object_manifest(&lines)));
        urls.push(object_urls);
    }
    *depot
        .write()
        .map_err(|_| anyhow!("the file server's lock is poisoned"))? = files;
    Ok(Corpus {
        files_per_object: f,
        files: args.objects * f,
        urls,
        manifests,
        bytes,
    })
}

/// The curl program's version (`curl X.Y.Z ...`) and whether it has
/// `--parallel` (7.66.0 and later).
pub(crate) async fn curl_version(curl: &Path) -> Result<(String, bool)> {
    let out = Command::new(curl)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .await
        .with_context(|| {
            format!(
                "cannot run {} (install curl: apt-get install curl)",
                curl.display()
            )
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text
        .split_whitespace()
        .nth(1)
        .context("curl --version printed no version")?
        .to_string();
    let parts: Vec<u32> = version.split('.').map(|p| p.parse().unwrap_or(0)).collect();
    let at_least = |a: u32, b: u32| (parts[0], *parts.get(1).unwrap_or(&0)) >= (a, b);
    Ok((version.clone(), !parts.is_empty() && at_least(7, 66)))
}

/// One curl run over every object.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct CurlRun {
    pub(crate) seconds: f64,
    /// User + system CPU seconds of the curl processes.
    pub(crate) cpu_seconds_curl: f64,
    /// Of this process, which serves the files.
    pub(crate) cpu_seconds_file_server: f64,
}

/// Fetches every object's files with curl, one curl process per object
/// (`--parallel --parallel-max K` when curl has it), `tasks` processes at
/// once, to /dev/null, or with `files_in` into files of that directory
/// (created first, removed after the timing); checks that every file came
/// back whole (200, size).
pub(crate) async fn curl_run(
    args: &Args,
    corpus: &Corpus,
    parallel: bool,
    files_in: Option<&Path>,
) -> Result<CurlRun> {
    if let Some(dir) = files_in {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let gate = Arc::new(Semaphore::new(args.tasks as usize));
    let cpu_children = children_cpu_seconds();
    let cpu_self = cpu_seconds(std::process::id()).unwrap_or(0.0);
    let started = Instant::now();
    let mut set = JoinSet::new();
    for (o, urls) in corpus.urls.iter().enumerate() {
        let mut cmd = Command::new(&args.curl);
        cmd.args(["-s", "-S", "--fail", "--max-time", "300"])
            .args(["-w", "%{http_code} %{size_download}\\n"]);
        if parallel {
            cmd.args([
                "--parallel",
                "--parallel-max",
                &args.transfers_per_job.to_string(),
            ]);
        }
        for (i, url) in urls.iter().enumerate() {
            match files_in {
                Some(dir) => cmd.arg("-o").arg(dir.join(format!("{o}-{i}"))).arg(url),
                None => cmd.args(["-o", "/dev/null", url]),
            };
        }
        cmd.stdin(Stdio::null()).kill_on_drop(true);
        let gate = Arc::clone(&gate);
        set.spawn(async move {
            let _permit = gate.acquire().await.context("the curl gate closed")?;
            let out = cmd.output().await.context("cannot run curl")?;
            if !out.status.success() {
                bail!(
                    "curl for object {o} failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            let mut files = 0usize;
            let mut bytes = 0u64;
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let (code, size) = line.split_once(' ').unwrap_or((line, "0"));
                if code != "200" {
                    bail!("curl for object {o}: a transfer answered {code}");
                }
                files += 1;
                bytes += size.trim().parse::<u64>().unwrap_or(0);
            }
            Ok((files, bytes))
        });
    }
    let (mut files, mut bytes) = (0usize, 0u64);
    while let Some(joined) = set.join_next().await {
        let (f, b) = joined.context("a curl task failed")??;
        files += f;
        bytes += b;
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu_seconds_curl = children_cpu_seconds() - cpu_children;
    let cpu_seconds_file_server = cpu_seconds(std::process::id()).unwrap_or(0.0) - cpu_self;
    if let Some(dir) = files_in {
        std::fs::remove_dir_all(dir).with_context(|| format!("cannot remove {}", dir.display()))?;
    }
    if (files, bytes) != (corpus.files, corpus.bytes) {
        bail!(
            "curl fetched {files} files, {bytes} bytes, not {} files, {} bytes",
            corpus.files,
            corpus.bytes
        );
    }
    Ok(CurlRun {
        seconds,
        cpu_seconds_curl,
        cpu_seconds_file_server,
    })
}

/// What the floor pipeline measured.
#[derive(Debug, Clone)]
pub(crate) struct FloorRun {
    pub(crate) seconds: f64,
    /// Of this process: the pipeline and the file server.
    pub(crate) cpu_seconds: f64,
}

/// The least any ingest must do with the corpus, with nothing else: every
/// file fetched once over HTTP (reqwest, as the worker), hashed with
/// SHA-256 and SHA-512 as its chunks arrive (`ingest_steps`' hasher, as
/// the worker) and written into a file of `dir` on the way; `tasks`
/// objects at once, each object's files one after another. No
/// coordination, no event, no ZooKeeper, no OCFL.
pub(crate) async fn floor_run(args: &Args, corpus: &Corpus, dir: &Path) -> Result<FloorRun> {
    use ingest_steps::digest::{Algorithm, HashingWriter};
    use std::io::Write as _;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let client = reqwest::Client::new();
    let gate = Arc::new(Semaphore::new(args.tasks as usize));
    let cpu_before = cpu_seconds(std::process::id()).unwrap_or(0.0);
    let started = Instant::now();
    let mut set = JoinSet::new();
    for (o, urls) in corpus.urls.iter().enumerate() {
        let (client, gate, urls) = (client.clone(), Arc::clone(&gate), urls.clone());
        let dir = dir.to_path_buf();
        set.spawn(async move {
            let _permit = gate.acquire().await.context("the floor gate closed")?;
            let mut bytes = 0u64;
            for (i, url) in urls.iter().enumerate() {
                let mut resp = client.get(url).send().await?.error_for_status()?;
                let path = dir.join(format!("{o}-{i}"));
                let file = std::fs::File::create(&path)
                    .with_context(|| format!("cannot create {}", path.display()))?;
                let mut writer = HashingWriter::new(file, &[Algorithm::Sha256, Algorithm::Sha512]);
                while let Some(chunk) = resp.chunk().await? {
                    writer.write_all(&chunk)?;
                }
                let (_, size, digests) = writer.finish();
                ensure!(digests.len() == 2, "two digests of {url}");
                bytes += size;
            }
            anyhow::Ok(bytes)
        });
    }
    let mut bytes = 0u64;
    while let Some(joined) = set.join_next().await {
        bytes += joined.context("a floor task failed")??;
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu_seconds = cpu_seconds(std::process::id()).unwrap_or(0.0) - cpu_before;
    std::fs::remove_dir_all(dir).with_context(|| format!("cannot remove {}", dir.display()))?;
    ensure!(
        bytes == corpus.bytes,
        "the floor pipeline fetched {bytes} bytes, not {}",
        corpus.bytes
    );
    Ok(FloorRun {
        seconds,
        cpu_seconds,
    })
}

/// What one real round measured.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct RealRound {
    pub(crate) files_per_object: usize,
    pub(crate) objects: usize,
    pub(crate) files: usize,
    pub(crate) bytes: u64,
    /// The median curl run (by wall time) and every run's seconds.
    pub(crate) curl_seconds: f64,
    pub(crate) curl_runs_seconds: Vec<f64>,
    pub(crate) curl_objects_per_s: f64,
    pub(crate) curl_mb_per_s: f64,
    pub(crate) curl_cpu_seconds: f64,
    pub(crate) curl_file_server_cpu_seconds: f64,
    /// From the first BatchSubmitted to the last job's -> Completed (server clock).
    pub(crate) ingest_seconds: f64,
    pub(crate) ingest_objects_per_s: f64,
    pub(crate) ingest_mb_per_s: f64,
    /// Ingest objects/s over curl objects/s (the same bytes, so also MB/s).
    pub(crate) ratio: f64,
    /// curl writing every file into the round's directory (the file system
    /// ingest's working storage is on), the median of as many runs: what
    /// storing each byte once costs on top of the transfer.
    pub(crate) curl_files_seconds: f64,
    pub(crate) curl_files_objects_per_s: f64,
    pub(crate) curl_files_cpu_seconds: f64,
    /// Ingest objects/s over those of curl writing files.
    pub(crate) ratio_to_curl_files: f64,
    /// The floor pipeline ([`floor_run`], the median of `--curl-runs`
    /// runs): every byte fetched, hashed with SHA-256 and SHA-512 and
    /// written once, and nothing else.
    pub(crate) floor_seconds: f64,
    pub(crate) floor_objects_per_s: f64,
    /// Of the load driver: the pipeline and the file server.
    pub(crate) floor_cpu_seconds: f64,
    /// Ingest objects/s over the floor's.
    pub(crate) ratio_to_floor: f64,
    /// From the first `-> Downloading` to the last `Downloading ->`.
    pub(crate) download_span_seconds: f64,
    pub(crate) download_mb_per_s: f64,
    /// All bytes over the sum of each job's time in Downloading: one job's
    /// download rate, without the gaps between jobs.
    pub(crate) download_job_mb_per_s: f64,
    /// Mean time a job spent in each state, ms (from entering it to
    /// leaving it: the wait for a task, the step, the report).
    pub(crate) state_mean_ms: BTreeMap<String, f64>,
    /// Mean time from BatchSubmitted to the job's creation (expansion of
    /// the object manifest by batch_pending), ms.
    pub(crate) expansion_mean_ms: f64,
    /// Mean Pending -> Completed, ms.
    pub(crate) walk_mean_ms: f64,
    /// How long the submissions took (client clock).
    pub(crate) submit_seconds: f64,
    /// Events in the log at the end, and step retries among them.
    pub(crate) events: u64,
    pub(crate) retries: usize,
    pub(crate) cpu_seconds_serve: f64,
    pub(crate) cpu_seconds_worker: f64,
    pub(crate) cpu_seconds_zookeeper: Option<f64>,
    /// Requests ZooKeeper received during the ingest (`mntr`).
    pub(crate) zookeeper_requests: Option<u64>,
    /// Of this process (the file server) during the ingest.
    pub(crate) cpu_seconds_file_server: f64,
    pub(crate) refused_reports: usize,
    pub(crate) warn_lines: usize,
    pub(crate) error_lines: usize,
    pub(crate) log_samples: Vec<String>,
}

/// Real mode: a round per files-per-object count F. Each round builds
/// `--objects` objects of F files (`--object-bytes` each, random bytes)
/// served by this process on loopback with one checkm object manifest per
/// object; fetches them with curl `--curl-runs` times (the median run is the
/// baseline); then starts a fresh `ingest serve` and ONE `ingest worker
/// --steps real` (every job daemon with `--tasks` tasks, batch_pending and
/// batch_reporting, an OCFL storage target, a signing key, working storage
/// in the round's directory, `--provisioning-threshold 100`), submits one
/// `object-manifest` batch per object, waits for everything to be
/// Completed and measures from the log's timestamps.
pub(crate) async fn run_real(args: Args) -> Result<()> {
    ensure!(
        !args.files.is_empty() && !args.files.contains(&0),
        "--files must list files-per-object counts of at least 1, e.g. 1,10,100"
    );
    ensure!(args.objects > 0, "--objects must be at least 1");
    ensure!(args.tasks > 0, "--tasks must be at least 1");
    ensure!(
        args.transfers_per_job > 0,
        "--transfers-per-job must be at least 1"
    );
    ensure!(args.curl_runs > 0, "--curl-runs must be at least 1");
    let most = args.files.iter().copied().max().unwrap_or(1) as u64;
    ensure!(
        args.object_bytes >= most,
        "--object-bytes {} is less than one byte per file for {most} files",
        args.object_bytes
    );
    let (ingest, work) = binary_and_work_dir(&args)?;
    let (curl_version, parallel) = curl_version(&args.curl).await?;
    let tokens = Arc::new(Tokens::new());
    let depot: Depot = Arc::default();
    let base = serve_depot(Arc::clone(&depot)).await?;
    eprintln!(
        "ingest-load: real steps, {} objects of {} bytes per round, files per object {:?}; one worker, {} tasks per job daemon, {} transfers per job; curl {curl_version}{}; files served from {base}; logs in {}",
        args.objects,
        args.object_bytes,
        args.files,
        args.tasks,
        args.transfers_per_job,
        if parallel { " --parallel" } else { " (no --parallel: sequential)" },
        work.display()
    );

    if args.warmup_objects > 0 {
        let f = args.files[0];
        let mut warm = args.clone();
        warm.objects = args.warmup_objects;
        warm.curl_runs = 1;
        let round = real_round(
            &warm, &ingest, &work, "warmup", &tokens, &depot, &base, f, parallel,
        )
        .await
        .with_context(|| {
            format!(
                "the warm-up round failed (logs in {})",
                work.join("warmup").display()
            )
        })?;
        eprintln!(
            "warm-up round, not counted ({} objects of {f} file(s)): ingest {:.1} MB/s",
            warm.objects, round.ingest_mb_per_s
        );
    }
    let mut rounds = Vec::new();
    for (i, &f) in args.files.iter().enumerate() {
        let name = format!("round{}-{f}f", i + 1);
        let round = real_round(
            &args, &ingest, &work, &name, &tokens, &depot, &base, f, parallel,
        )
        .await
        .with_context(|| {
            format!(
                "the {f}-files-per-object round failed (logs in {})",
                work.join(&name).display()
            )
        })?;
        eprintln!(
            "round {f} file(s)/object: curl {:.1} objects/s, {:.1} MB/s; ingest {:.2} objects/s, {:.1} MB/s (ratio {:.3}); download step {:.1} MB/s; curl writing the files {:.1} objects/s, {:.2} CPU s (ingest ratio {:.3})",
            round.curl_objects_per_s,
            round.curl_mb_per_s,
            round.ingest_objects_per_s,
            round.ingest_mb_per_s,
            round.ratio,
            round.download_mb_per_s,
            round.curl_files_objects_per_s,
            round.curl_files_cpu_seconds,
            round.ratio_to_curl_files
        );
        rounds.push(round);
    }
    if let Ok(mut files) = depot.write() {
        files.clear();
    }
    print!("{}", real_table(&rounds));
    print!("{}", real_notes(&rounds));

    if let Some(path) = &args.json {
        let doc = json!({
            "mode": "real",
            "date": Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            "objects": args.objects,
            "object_bytes": args.object_bytes,
            "workers": 1,
            "tasks_per_job_daemon": args.tasks,
            "transfers_per_job": args.transfers_per_job,
            "curl_version": curl_version,
            "curl_parallel": parallel,
            "curl_runs": args.curl_runs,
            "mb": "10^6 bytes",
            "rounds": rounds,
        });
        let text = serde_json::to_string_pretty(&doc).context("cannot encode the results")?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("ingest-load: results written to {}", path.display());
    }
    Ok(())
}

/// The run of median wall time (`seconds` gives a run's).
fn median_run<R: Clone>(runs: &[R], seconds: impl Fn(&R) -> f64) -> R {
    let mut order: Vec<usize> = (0..runs.len()).collect();
    order.sort_by(|&a, &b| seconds(&runs[a]).total_cmp(&seconds(&runs[b])));
    runs[order[order.len() / 2]].clone()
}

#[allow(clippy::too_many_arguments)]
pub(crate) async fn real_round(
    args: &Args,
    ingest: &Path,
    work: &Path,
    name: &str,
    tokens: &Arc<Tokens>,
    depot: &Depot,
    base: &str,
    f: usize,
    parallel: bool,
) -> Result<RealRound> {
    let dir = work.join(name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("cannot clear {}", dir.display()))?;
    }
    let storage = dir.join("work");
    let ocfl = dir.join("ocfl");
    let outbox = dir.join("outbox");
    for d in [&storage, &ocfl, &outbox] {
        std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
    }
    let corpus = build_corpus(args, depot, base, f)?;

    // The baseline: curl, the median of --curl-runs runs.
    let mut runs = Vec::with_capacity(args.curl_runs);
    for _ in 0..args.curl_runs {
        runs.push(curl_run(args, &corpus, parallel, None).await?);
    }
    let median = median_run(&runs, |r| r.seconds);
    // The same, writing the files where ingest's working storage is.
    let mut file_runs = Vec::with_capacity(args.curl_runs);
    for _ in 0..args.curl_runs {
        file_runs.push(curl_run(args, &corpus, parallel, Some(&dir.join("curl-files"))).await?);
    }
    let to_files = median_run(&file_runs, |r| r.seconds);
    // And the floor: the byte work alone, in this process.
    let mut floor_runs = Vec::with_capacity(args.curl_runs);
    for _ in 0..args.curl_runs {
        floor_runs.push(floor_run(args, &corpus, &dir.join("floor-files")).await?);
    }
    let floor = median_run(&floor_runs, |r| r.seconds);

    // The signing key of the storage manifests.
    let key = dir.join("signing-key.pem");
    let out = Command::new(ingest)
        .args(["keys", "generate"])
        .arg(&key)
        .stdin(Stdio::null())
        .output()
        .await
        .context("cannot run ingest keys generate")?;
    if !out.status.success() {
        bail!(
            "ingest keys generate failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }

    let pids = work.join("pids");
    let root = format!("/load-{name}-{}", std::process::id());
    let (server, engine) = start_server(args, ingest, &dir, &pids, &root, tokens).await?;
    let mut procs = RoundProcs {
        server,
        workers: Vec::new(),
    };
    let daemons: Vec<String> = job_daemons()
        .map(|d| match (d.as_str(), args.pending_tasks) {
            // --pending-tasks sets the daemon that starts jobs apart.
            ("job_pending", Some(n)) => format!("{d}={n}"),
            _ => format!("{d}={}", args.tasks),
        })
        .chain(
            BATCH_DAEMONS
                .iter()
                .map(|d| format!("{d}={}", args.batch_tasks())),
        )
        .collect();
    let mut cmd = Command::new(ingest);
    cmd.args([
        "worker",
        "--engine",
        &engine,
        "--zk",
        &args.zk,
        "--zk-root",
        &root,
        "--steps",
        "real",
    ])
    .args(["--daemons", &daemons.join(",")])
    .args(["--name", "load-real"])
    // The file server listens on 127.0.0.1 (refused by default).
    .args(["--allow-network", "127.0.0.0/8"])
    // The disk's fill level must not hold jobs back in Provisioning.
    .args(["--provisioning-threshold", "100", "--working-storage"])
    .arg(&storage)
    .arg("--storage-target")
    .arg(format!("primary={}", ocfl.display()))
    .arg("--signing-key")
    .arg(&key)
    .arg("--outbox")
    .arg(&outbox)
    .args(["--transfers-per-job", &args.transfers_per_job.to_string()])
    .args([
        "--transfers",
        &(args.transfers_per_job * args.tasks as usize).to_string(),
    ])
    .args(["--max-object-files", &f.max(1000).to_string()]);
    clean_env(&mut cmd, tokens);
    let mut worker = Proc::spawn("worker", cmd, &dir, &pids)?;
    let started = worker
        .await_line("ingest worker started", Duration::from_secs(30))
        .await;
    procs.workers.push(worker);
    started?;

    let api = Arc::new(Api::new(&engine, tokens)?);
    let result = ingest_objects(args, &api, &mut procs, &corpus).await;
    procs.stop().await;
    let mut round = result?;
    let scan = scan(&procs);
    round.refused_reports = scan.refused;
    round.warn_lines = scan.warn;
    round.error_lines = scan.error;
    round.log_samples = scan.samples;

    round.curl_seconds = median.seconds;
    round.curl_runs_seconds = runs.iter().map(|r| r.seconds).collect();
    round.curl_cpu_seconds = median.cpu_seconds_curl;
    round.curl_file_server_cpu_seconds = median.cpu_seconds_file_server;
    let per_s = |n: f64, s: f64| if s > 0.0 { n / s } else { 0.0 };
    let mb = corpus.bytes as f64 / 1e6;
    round.curl_objects_per_s = per_s(corpus.urls.len() as f64, median.seconds);
    round.curl_mb_per_s = per_s(mb, median.seconds);
    round.ratio = per_s(round.ingest_objects_per_s, round.curl_objects_per_s);
    round.curl_files_seconds = to_files.seconds;
    round.curl_files_cpu_seconds = to_files.cpu_seconds_curl;
    round.curl_files_objects_per_s = per_s(corpus.urls.len() as f64, to_files.seconds);
    round.ratio_to_curl_files = per_s(round.ingest_objects_per_s, round.curl_files_objects_per_s);
    round.floor_seconds = floor.seconds;
    round.floor_cpu_seconds = floor.cpu_seconds;
    round.floor_objects_per_s = per_s(corpus.urls.len() as f64, floor.seconds);
    round.ratio_to_floor = per_s(round.ingest_objects_per_s, round.floor_objects_per_s);

    if !args.keep {
        for d in [&storage, &ocfl] {
            if let Err(e) = std::fs::remove_dir_all(d) {
                eprintln!("ingest-load: cannot remove {}: {e}", d.display());
            }
        }
    }
    Ok(round)
}

/// Submits one object-manifest batch per object, waits, measures.
pub(crate) async fn ingest_objects(
    args: &Args,
    api: &Arc<Api>,
    procs: &mut RoundProcs,
    corpus: &Corpus,
) -> Result<RealRound> {
    let total = corpus.manifests.len();
    let cpu_before = procs.cpu(args.zk_pid);
    let zk_before = zk_packets_received(&args.zk).await;
    let self_before = cpu_seconds(std::process::id()).unwrap_or(0.0);
    let started = Instant::now();
    let gate = Arc::new(Semaphore::new(SUBMIT_CONCURRENCY));
    let mut set = JoinSet::new();
    for (o, url) in corpus.manifests.iter().enumerate() {
        let api = Arc::clone(api);
        let gate = Arc::clone(&gate);
        let body = SubmissionInput {
            submitter: Some("load".into()),
            profile: Some("load".into()),
            payload_type: Some("object-manifest".into()),
            payload_url: Some(url.clone()),
            erc_who: Some("ingest-load".into()),
            erc_what: Some(format!(
                "load object {o} of {} files",
                corpus.files_per_object
            )),
            erc_when: Some("2026".into()),
            erc_where: Some(format!("load-{}f-{o}", corpus.files_per_object)),
            ..SubmissionInput::default()
        };
        set.spawn(async move {
            let _permit = gate.acquire().await.context("the submission gate closed")?;
            api.submit_body(o, &body).await.map(|bid| (o, bid))
        });
    }
    let mut bids = vec![String::new(); total];
    while let Some(joined) = set.join_next().await {
        let (o, bid) = joined.context("a submission task failed")??;
        bids[o] = bid;
    }
    let submit_seconds = started.elapsed().as_secs_f64();

    let deadline = started + Duration::from_secs(args.timeout);
    let label = format!("{} file(s)/object", corpus.files_per_object);
    let status = match wait_all(args, api, procs, &bids, total, &label, "", deadline).await {
        Ok((status, _)) => status,
        Err(e) => return Err(e.context(failed_jobs(api, &bids).await)),
    };
    let cpu_after = procs.cpu(args.zk_pid);
    let zk_after = zk_packets_received(&args.zk).await;
    let self_after = cpu_seconds(std::process::id()).unwrap_or(0.0);

    let mut first_submitted: Option<DateTime<Utc>> = None;
    let mut last_completed: Option<DateTime<Utc>> = None;
    let mut download_span: Option<(DateTime<Utc>, DateTime<Utc>)> = None;
    let mut in_state: BTreeMap<String, f64> = BTreeMap::new();
    let (mut expansion, mut walk, mut retries) = (0.0, 0.0, 0usize);
    let mut downloaded = 0u64;
    for bid in &bids {
        let history = api.history(bid).await?;
        let (submitted, jobs) = traces(bid, &history)?;
        first_submitted = Some(first_submitted.map_or(submitted, |t| t.min(submitted)));
        if jobs.len() != 1 {
            bail!("batch {bid} has {} jobs, not one", jobs.len());
        }
        for (jid, job) in &jobs {
            let (Some(created), Some(done)) = (job.created, job.completed) else {
                bail!("job {jid} of batch {bid} has no Completed event in its history");
            };
            last_completed = Some(last_completed.map_or(done, |t| t.max(done)));
            expansion += ms(created - submitted);
            retries += job.retries;
            downloaded += job.downloaded.unwrap_or(0);
            if let Some(left) = job.left.get("Pending") {
                walk += ms(done - *left);
            }
            for state in job_states() {
                let entered = match state {
                    "Pending" => Some(created),
                    _ => job.entered.get(state).copied(),
                };
                if let (Some(a), Some(b)) = (entered, job.left.get(state)) {
                    *in_state.entry(state.to_string()).or_default() += ms(*b - a);
                }
            }
            if let (Some(a), Some(b)) =
                (job.entered.get("Downloading"), job.left.get("Downloading"))
            {
                download_span = Some(match download_span {
                    None => (*a, *b),
                    Some((x, y)) => (x.min(*a), y.max(*b)),
                });
            }
        }
    }
    if downloaded != corpus.bytes {
        bail!(
            "the Downloading steps reported {downloaded} bytes in all, not the {} served",
            corpus.bytes
        );
    }
    let (Some(first), Some(last)) = (first_submitted, last_completed) else {
        bail!("no submission or completion times were found");
    };
    let secs = |d: chrono::TimeDelta| d.num_microseconds().unwrap_or(0) as f64 / 1e6;
    let seconds = secs(last - first);
    let download_seconds = download_span.map_or(0.0, |(a, b)| secs(b - a));
    let per_s = |n: f64, s: f64| if s > 0.0 { n / s } else { 0.0 };
    let mb = corpus.bytes as f64 / 1e6;
    let n = total as f64;
    Ok(RealRound {
        files_per_object: corpus.files_per_object,
        objects: total,
        files: corpus.files,
        bytes: corpus.bytes,
        curl_seconds: 0.0,
        curl_runs_seconds: Vec::new(),
        curl_objects_per_s: 0.0,
        curl_mb_per_s: 0.0,
        curl_cpu_seconds: 0.0,
        curl_file_server_cpu_seconds: 0.0,
        ingest_seconds: seconds,
        ingest_objects_per_s: per_s(n, seconds),
        ingest_mb_per_s: per_s(mb, seconds),
        ratio: 0.0,
        curl_files_seconds: 0.0,
        curl_files_objects_per_s: 0.0,
        curl_files_cpu_seconds: 0.0,
        ratio_to_curl_files: 0.0,
        floor_seconds: 0.0,
        floor_objects_per_s: 0.0,
        floor_cpu_seconds: 0.0,
        ratio_to_floor: 0.0,
        download_span_seconds: download_seconds,
        download_mb_per_s: per_s(mb, download_seconds),
        download_job_mb_per_s: per_s(
            mb,
            in_state.get("Downloading").copied().unwrap_or(0.0) / 1000.0,
        ),
        state_mean_ms: in_state.into_iter().map(|(k, v)| (k, v / n)).collect(),
        expansion_mean_ms: expansion / n,
        walk_mean_ms: walk / n,
        submit_seconds,
        events: status.head_position,
        retries,
        cpu_seconds_serve: cpu_after.serve - cpu_before.serve,
        cpu_seconds_worker: cpu_after.workers - cpu_before.workers,
        cpu_seconds_zookeeper: cpu_after
            .zookeeper
            .zip(cpu_before.zookeeper)
            .map(|(a, b)| a - b),
        zookeeper_requests: zk_after.zip(zk_before).map(|(a, b)| a.saturating_sub(b)),
        cpu_seconds_file_server: self_after - self_before,
        refused_reports: 0,
        warn_lines: 0,
        error_lines: 0,
        log_samples: Vec::new(),
    })
}

/// The messages of failed jobs (their `-> Failed` events), for errors.
pub(crate) async fn failed_jobs(api: &Api, bids: &[String]) -> String {
    let mut s = String::new();
    let mut shown = 0;
    for bid in bids {
        let Ok(history) = api.history(bid).await else {
            continue;
        };
        for row in &history {
            let failed = row.detail.contains("-> Failed") || row.event == "JobStepRetried";
            if failed && shown < 10 {
                shown += 1;
                let _ = writeln!(
                    s,
                    "  {} {}: {}",
                    row.stream,
                    row.event,
                    truncate(&row.detail, 300)
                );
            }
        }
    }
    match s.is_empty() {
        true => "no job failed or retried".to_string(),
        false => format!("failures and retries:\n{s}"),
    }
}

pub(crate) fn real_table(rounds: &[RealRound]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| files/object | objects | MB | curl objects/s | curl MB/s | ingest objects/s | ingest MB/s | ingest/curl ratio | download-step MB/s | curl to files objects/s | ingest/curl-to-files | floor objects/s | ingest/floor |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rounds {
        let _ = writeln!(
            s,
            "| {} | {} | {:.1} | {:.1} | {:.0} | {:.2} | {:.1} | {:.3} | {:.1} | {:.1} | {:.3} | {:.1} | {:.3} |",
            r.files_per_object,
            r.objects,
            r.bytes as f64 / 1e6,
            r.curl_objects_per_s,
            r.curl_mb_per_s,
            r.ingest_objects_per_s,
            r.ingest_mb_per_s,
            r.ratio,
            r.download_mb_per_s,
            r.curl_files_objects_per_s,
            r.ratio_to_curl_files,
            r.floor_objects_per_s,
            r.ratio_to_floor
        );
    }
    s
}

pub(crate) fn real_notes(rounds: &[RealRound]) -> String {
    let mut s = String::new();
    for r in rounds {
        let states: Vec<String> = job_states()
            .map(|st| {
                format!(
                    "{st} {:.0}",
                    r.state_mean_ms.get(st).copied().unwrap_or(0.0)
                )
            })
            .collect();
        let _ = writeln!(
            s,
            "{} file(s)/object: {} files, {} bytes; ingest {:.2} s (submissions {:.2} s), curl median {:.3} s of {:?}; download steps span {:.2} s, {:.1} MB/s per job in Downloading",
            r.files_per_object,
            r.files,
            r.bytes,
            r.ingest_seconds,
            r.submit_seconds,
            r.curl_seconds,
            r.curl_runs_seconds
                .iter()
                .map(|x| (x * 1000.0).round() / 1000.0)
                .collect::<Vec<_>>(),
            r.download_span_seconds,
            r.download_job_mb_per_s
        );
        let _ = writeln!(
            s,
            "    mean ms per job: expansion {:.0}; {}; Pending -> Completed {:.0}",
            r.expansion_mean_ms,
            states.join(", "),
            r.walk_mean_ms
        );
        let _ = writeln!(
            s,
            "    CPU seconds: ingest: serve {:.1}, worker {:.1}, zookeeper {}, file server {:.1}; curl: curl {:.2}, file server {:.2}; ZooKeeper requests per object {}; {} events ({:.1} per object), {} step retries, {} refused reports, {} WARN, {} ERROR log lines",
            r.cpu_seconds_serve,
            r.cpu_seconds_worker,
            r.cpu_seconds_zookeeper
                .map_or_else(|| "?".to_string(), |z| format!("{z:.1}")),
            r.cpu_seconds_file_server,
            r.curl_cpu_seconds,
            r.curl_file_server_cpu_seconds,
            r.zookeeper_requests.map_or_else(
                || "?".to_string(),
                |n| format!("{:.0}", n as f64 / r.objects as f64)
            ),
            r.events,
            r.events as f64 / r.objects as f64,
            r.retries,
            r.refused_reports,
            r.warn_lines,
            r.error_lines
        );
        let ingest_cpu = r.cpu_seconds_serve
            + r.cpu_seconds_worker
            + r.cpu_seconds_zookeeper.unwrap_or(0.0)
            + r.cpu_seconds_file_server;
        let _ = writeln!(
            s,
            "    floor (every byte fetched, hashed with SHA-256 and SHA-512 and written once, nothing else): {:.1} objects/s, {:.3} s, {:.2} CPU s with its file server; ingest {:.2} CPU s with its file server; ingest/floor {:.3}, floor/curl {:.3}",
            r.floor_objects_per_s,
            r.floor_seconds,
            r.floor_cpu_seconds,
            ingest_cpu,
            r.ratio_to_floor,
            if r.curl_objects_per_s > 0.0 { r.floor_objects_per_s / r.curl_objects_per_s } else { 0.0 }
        );
        for l in &r.log_samples {
            let _ = writeln!(s, "    e.g. {l}");
        }
    }
    s
}
