//! The simulated mode: N batches of M jobs through 1, 2 and 4 worker
//! processes, with zero-duration steps.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use chrono::{DateTime, Utc};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use ingest_protocol::view::StatusView;
use serde_json::json;
use tokio::process::Command;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::api::*;
use crate::history::*;
use crate::procs::*;
use crate::*;

/// What one round measured.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Round {
    pub(crate) workers: usize,
    pub(crate) tasks: u32,
    pub(crate) batches: usize,
    pub(crate) jobs_per_batch: usize,
    pub(crate) jobs: usize,
    /// From the first BatchSubmitted to the last -> Completed (server clock).
    pub(crate) seconds: f64,
    pub(crate) jobs_per_s: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) max_ms: f64,
    /// From leaving Pending to Completed: the walk itself, without the
    /// wait in the Pending queue behind the rest of the burst.
    pub(crate) walk_p50_ms: f64,
    pub(crate) walk_p99_ms: f64,
    /// How long the submissions took (client clock).
    pub(crate) submit_seconds: f64,
    /// From the first submission to seeing everything Completed (client clock).
    pub(crate) wall_seconds: f64,
    /// Events in the log at the end.
    pub(crate) events: u64,
    pub(crate) max_projector_events_behind: f64,
    pub(crate) max_projector_seconds_behind: f64,
    /// CPU seconds used from the first submission until everything was
    /// Completed, by the server, all workers together and ZooKeeper.
    pub(crate) cpu_seconds_serve: f64,
    pub(crate) cpu_seconds_workers: f64,
    pub(crate) cpu_seconds_zookeeper: Option<f64>,
    /// Requests ZooKeeper received over the same span (`mntr`'s
    /// zk_packets_received; every client of the server counts).
    pub(crate) zookeeper_requests: Option<u64>,
    /// Worker reports the API refused (409), from the worker logs.
    pub(crate) refused_reports: usize,
    /// WARN and ERROR lines in the server's and workers' logs.
    pub(crate) warn_lines: usize,
    pub(crate) error_lines: usize,
    /// A few distinct WARN/ERROR messages, for the report.
    pub(crate) log_samples: Vec<String>,
    /// Jobs/s against the baseline round of the same run.
    pub(crate) ratio: f64,
    /// Finished batches in the tree before the round (--prefill-batches).
    pub(crate) prefilled_batches: usize,
    /// From a batch's last job reaching Completed to the batch's
    /// BatchCompleted event (the log's timestamps), over the round's batches.
    pub(crate) report_p50_ms: f64,
    pub(crate) report_p99_ms: f64,
    pub(crate) report_max_ms: f64,
}

pub(crate) async fn run(args: Args) -> Result<()> {
    if args.batches == 0 || args.jobs == 0 {
        bail!("--batches and --jobs must be at least 1");
    }
    if args.workers.is_empty() || args.workers.contains(&0) {
        bail!("--workers must list worker counts of at least 1, e.g. 1,2,4");
    }
    if args.tasks == 0 {
        bail!("--tasks must be at least 1");
    }
    let (ingest, work) = binary_and_work_dir(&args)?;
    let tokens = Arc::new(Tokens::new());
    eprintln!(
        "ingest-load: {} batches x {} jobs, workers {:?}, {} tasks per job daemon, {} per batch daemon, steps of {} ms, {} finished batches first; logs in {}",
        args.batches,
        args.jobs,
        args.workers,
        args.tasks,
        args.batch_tasks(),
        args.step_ms,
        args.prefill_batches,
        work.display()
    );

    let mut rounds = Vec::new();
    for (i, &w) in args.workers.iter().enumerate() {
        let name = format!("round{}-{w}w", i + 1);
        let round = run_round(&args, &ingest, &work, &name, &tokens, w)
            .await
            .with_context(|| format!("the {w}-worker round failed (logs in {})", work.display()))?;
        eprintln!(
            "round {w} worker(s): {} jobs in {:.2} s = {:.1} jobs/s, p50 {:.0} ms, p99 {:.0} ms",
            round.jobs, round.seconds, round.jobs_per_s, round.p50_ms, round.p99_ms
        );
        rounds.push(round);
    }

    // The baseline: the 1-worker rounds (else the first round's count),
    // their mean when the list repeats it (`--workers 1,4,4,1`: a round
    // run later finds ZooKeeper holding every earlier round's nodes, and
    // that order alone moved a ratio by 10-20 %).
    let groups = by_workers(rounds.iter().map(|r| (r.workers, r.jobs_per_s)));
    let base_workers = if rounds.iter().any(|r| r.workers == 1) {
        1
    } else {
        rounds[0].workers
    };
    let base_group = groups.iter().find(|g| g.workers == base_workers);
    let base = base_group.map_or(0.0, |g| g.mean);
    let base_label = match base_group {
        Some(g) if g.rounds > 1 => format!("the mean of {} {}-worker rounds", g.rounds, g.workers),
        _ if base_workers == 1 => "1 worker".to_string(),
        _ => format!("{base_workers} workers"),
    };
    for r in &mut rounds {
        r.ratio = if base > 0.0 { r.jobs_per_s / base } else { 0.0 };
    }
    print!("{}", table(&rounds, &base_label));
    if groups.iter().any(|g| g.rounds > 1) {
        for g in &groups {
            println!(
                "{} worker(s): mean {:.1} jobs/s over {} round(s) ({:.1}-{:.1}), ratio {:.2}",
                g.workers,
                g.mean,
                g.rounds,
                g.min,
                g.max,
                if base > 0.0 { g.mean / base } else { 0.0 }
            );
        }
    }
    print!("{}", notes(&rounds));

    if let Some(path) = &args.json {
        let doc = json!({
            "date": Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            "batches": args.batches,
            "jobs_per_batch": args.jobs,
            "tasks_per_job_daemon": args.tasks,
            "step_ms": args.step_ms,
            "batch_tasks": args.batch_tasks(),
            "prefill_batches": args.prefill_batches,
            "baseline": base_label,
            "rounds": rounds,
        });
        let text = serde_json::to_string_pretty(&doc).context("cannot encode the results")?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("ingest-load: results written to {}", path.display());
    }
    Ok(())
}

/// The rounds of one worker count.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Group {
    pub(crate) workers: usize,
    pub(crate) rounds: usize,
    /// Jobs/s: the mean, the least and the most.
    pub(crate) mean: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
}

/// Rounds as (workers, jobs/s) grouped by worker count, in the order each
/// count first ran.
pub(crate) fn by_workers(rounds: impl IntoIterator<Item = (usize, f64)>) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for (workers, jobs_per_s) in rounds {
        match groups.iter_mut().find(|g| g.workers == workers) {
            Some(g) => {
                g.mean = (g.mean * g.rounds as f64 + jobs_per_s) / (g.rounds + 1) as f64;
                g.rounds += 1;
                g.min = g.min.min(jobs_per_s);
                g.max = g.max.max(jobs_per_s);
            }
            None => groups.push(Group {
                workers,
                rounds: 1,
                mean: jobs_per_s,
                min: jobs_per_s,
                max: jobs_per_s,
            }),
        }
    }
    groups
}

pub(crate) fn table(rounds: &[Round], base_label: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| workers | jobs | seconds | jobs/s | p50 ms | p99 ms | ratio vs {base_label} |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    for r in rounds {
        let _ = writeln!(
            s,
            "| {} | {} | {:.2} | {:.1} | {:.0} | {:.0} | {:.2} |",
            r.workers, r.jobs, r.seconds, r.jobs_per_s, r.p50_ms, r.p99_ms, r.ratio
        );
    }
    s
}

pub(crate) fn notes(rounds: &[Round]) -> String {
    let unknown = || "?".to_string();
    let mut s = String::new();
    for r in rounds {
        let _ = writeln!(
            s,
            "{} worker(s): Pending -> Completed p50 {:.0} ms, p99 {:.0} ms; {} events ({:.1} per job); ZooKeeper requests per job {}; projector at most {:.0} events / {:.2} s behind",
            r.workers,
            r.walk_p50_ms,
            r.walk_p99_ms,
            r.events,
            r.events as f64 / r.jobs as f64,
            r.zookeeper_requests
                .map_or_else(unknown, |n| format!("{:.0}", n as f64 / r.jobs as f64)),
            r.max_projector_events_behind,
            r.max_projector_seconds_behind,
        );
        let _ = writeln!(
            s,
            "    CPU seconds over {:.1} s: serve {:.1}, workers {:.1}, zookeeper {}; submissions took {:.2} s; {} refused reports; {} WARN, {} ERROR log lines",
            r.wall_seconds,
            r.cpu_seconds_serve,
            r.cpu_seconds_workers,
            r.cpu_seconds_zookeeper
                .map_or_else(unknown, |z| format!("{z:.1}")),
            r.submit_seconds,
            r.refused_reports,
            r.warn_lines,
            r.error_lines
        );
        let _ = writeln!(
            s,
            "    batch reporting (last job Completed -> batch Completed) p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms, with {} finished batches in the tree before the round",
            r.report_p50_ms, r.report_p99_ms, r.report_max_ms, r.prefilled_batches
        );
        for l in &r.log_samples {
            let _ = writeln!(s, "    e.g. {l}");
        }
    }
    s
}

pub(crate) async fn run_round(
    args: &Args,
    ingest: &Path,
    work: &Path,
    name: &str,
    tokens: &Arc<Tokens>,
    workers: usize,
) -> Result<Round> {
    let dir = work.join(name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("cannot clear {}", dir.display()))?;
    }
    let storage = dir.join("work");
    std::fs::create_dir_all(&storage)
        .with_context(|| format!("cannot create {}", storage.display()))?;
    let pids = work.join("pids");
    let root = format!("/load-{name}-{}", std::process::id());

    let (server, base) = start_server(args, ingest, &dir, &pids, &root, tokens).await?;

    let mut procs = RoundProcs {
        server,
        workers: Vec::new(),
    };
    let daemons: Vec<String> = job_daemons()
        .map(|d| format!("{d}={}", args.tasks))
        .chain(
            BATCH_DAEMONS
                .iter()
                .map(|d| format!("{d}={}", args.batch_tasks())),
        )
        .collect();
    for i in 1..=workers {
        let name = format!("worker-{i}");
        let mut cmd = Command::new(ingest);
        cmd.args([
            "worker",
            "--engine",
            &base,
            "--zk",
            &args.zk,
            "--zk-root",
            &root,
        ])
        .args(["--daemons", &daemons.join(",")])
        .args(["--step-ms", &args.step_ms.to_string()])
        .args(["--name", &format!("load-{i}")])
        // The disk's fill level must not hold jobs back in Provisioning.
        .args(["--provisioning-threshold", "100", "--working-storage"])
        .arg(&storage);
        clean_env(&mut cmd, tokens);
        let mut p = Proc::spawn(&name, cmd, &dir, &pids)?;
        p.await_line("ingest worker started", Duration::from_secs(30))
            .await?;
        procs.workers.push(p);
    }

    let api = Arc::new(Api::new(&base, tokens)?);
    let result = drive(args, &api, &mut procs, workers).await;
    procs.stop().await;
    let mut round = result?;
    scan_logs(&procs, &mut round);
    Ok(round)
}

/// Submits, waits, measures.
pub(crate) async fn drive(
    args: &Args,
    api: &Arc<Api>,
    procs: &mut RoundProcs,
    workers: usize,
) -> Result<Round> {
    let total = args.batches * args.jobs;
    let prefilled = prefill(args, api, procs, workers).await?;
    let cpu_before = procs.cpu(args.zk_pid);
    let zk_before = zk_packets_received(&args.zk).await;
    let started = Instant::now();

    let bids = submit_all(api, 0..args.batches, args.jobs).await?;
    let submit_seconds = started.elapsed().as_secs_f64();

    // Wait for every job and batch to be Completed (the prefilled ones are
    // already).
    let deadline = started + Duration::from_secs(args.timeout);
    let everything: Vec<String> = prefilled.iter().chain(&bids).cloned().collect();
    let (status, mut max_behind) = wait_all(
        args,
        api,
        procs,
        &everything,
        total + prefilled.len(),
        &format!("{workers} worker(s)"),
        ", which zero-duration simulated steps never do",
        deadline,
    )
    .await?;
    let wall_seconds = started.elapsed().as_secs_f64();
    let cpu_after = procs.cpu(args.zk_pid);
    let zk_after = zk_packets_received(&args.zk).await;
    if let Ok(text) = api.metrics().await {
        max_behind.0 = max_behind
            .0
            .max(metric(&text, "ingest_projector_events_behind"));
        max_behind.1 = max_behind
            .1
            .max(metric(&text, "ingest_projector_seconds_behind"));
    }

    // Measure from the log's own timestamps.
    let mut first_submitted: Option<DateTime<Utc>> = None;
    let mut last_completed: Option<DateTime<Utc>> = None;
    let mut walks = Vec::with_capacity(total);
    let mut latencies = Vec::with_capacity(total);
    let mut reporting = Vec::with_capacity(bids.len());
    for bid in &bids {
        let history = api.history(bid).await?;
        let (submitted, jobs) = timings(bid, &history)?;
        let last_job = jobs.values().filter_map(|j| j.completed).max();
        if let (Some(last), Some(done)) = (last_job, batch_completed(bid, &history)?) {
            reporting.push(ms(done - last));
        }
        let completed: Vec<(Option<DateTime<Utc>>, DateTime<Utc>)> = jobs
            .values()
            .filter_map(|j| j.completed.map(|c| (j.started, c)))
            .collect();
        if completed.len() != args.jobs {
            bail!(
                "batch {bid}: {} of its {} jobs have a Completed event in its history",
                completed.len(),
                args.jobs
            );
        }
        first_submitted = Some(first_submitted.map_or(submitted, |t| t.min(submitted)));
        for (started, at) in completed {
            last_completed = Some(last_completed.map_or(at, |t| t.max(at)));
            if let Some(started) = started {
                walks.push(ms(at - started));
            }
            latencies.push(ms(at - submitted));
        }
    }
    let (Some(first), Some(last)) = (first_submitted, last_completed) else {
        bail!("no submission or completion times were found");
    };
    let seconds = (last - first).num_microseconds().unwrap_or(0) as f64 / 1e6;
    latencies.sort_by(f64::total_cmp);
    walks.sort_by(f64::total_cmp);
    reporting.sort_by(f64::total_cmp);
    Ok(Round {
        workers,
        tasks: args.tasks,
        batches: args.batches,
        jobs_per_batch: args.jobs,
        jobs: total,
        seconds,
        jobs_per_s: if seconds > 0.0 {
            total as f64 / seconds
        } else {
            0.0
        },
        p50_ms: nearest_rank(&latencies, 50.0),
        p99_ms: nearest_rank(&latencies, 99.0),
        max_ms: latencies.last().copied().unwrap_or(0.0),
        walk_p50_ms: nearest_rank(&walks, 50.0),
        walk_p99_ms: nearest_rank(&walks, 99.0),
        submit_seconds,
        wall_seconds,
        events: status.head_position,
        max_projector_events_behind: max_behind.0,
        max_projector_seconds_behind: max_behind.1,
        cpu_seconds_serve: cpu_after.serve - cpu_before.serve,
        cpu_seconds_workers: cpu_after.workers - cpu_before.workers,
        zookeeper_requests: zk_after.zip(zk_before).map(|(a, b)| a.saturating_sub(b)),
        cpu_seconds_zookeeper: cpu_after
            .zookeeper
            .zip(cpu_before.zookeeper)
            .map(|(a, b)| a - b),
        refused_reports: 0,
        warn_lines: 0,
        error_lines: 0,
        log_samples: Vec::new(),
        ratio: 0.0,
        prefilled_batches: prefilled.len(),
        report_p50_ms: nearest_rank(&reporting, 50.0),
        report_p99_ms: nearest_rank(&reporting, 99.0),
        report_max_ms: reporting.last().copied().unwrap_or(0.0),
    })
}

/// Submits the batches numbered `numbers` of `jobs` jobs each, up to
/// SUBMIT_CONCURRENCY at once; their bids in that order.
async fn submit_all(
    api: &Arc<Api>,
    numbers: std::ops::Range<usize>,
    jobs: usize,
) -> Result<Vec<String>> {
    let first = numbers.start;
    let gate = Arc::new(Semaphore::new(SUBMIT_CONCURRENCY));
    let mut set = JoinSet::new();
    for b in numbers.clone() {
        let api = Arc::clone(api);
        let gate = Arc::clone(&gate);
        set.spawn(async move {
            let _permit = gate.acquire().await.context("the submission gate closed")?;
            api.submit(b, jobs).await.map(|bid| (b, bid))
        });
    }
    let mut bids = vec![String::new(); numbers.len()];
    while let Some(joined) = set.join_next().await {
        let (b, bid) = joined.context("a submission task failed")??;
        bids[b - first] = bid;
    }
    Ok(bids)
}

/// `--prefill-batches N`: N batches of one job through the normal path
/// (submission, acquisition, every step, reporting), waited for until
/// Completed before the round is measured; their bids.
async fn prefill(
    args: &Args,
    api: &Arc<Api>,
    procs: &mut RoundProcs,
    workers: usize,
) -> Result<Vec<String>> {
    let n = args.prefill_batches;
    if n == 0 {
        return Ok(Vec::new());
    }
    let started = Instant::now();
    // Numbered after the measured batches, so local ids never repeat.
    let bids = submit_all(api, args.batches..args.batches + n, 1).await?;
    wait_all(
        args,
        api,
        procs,
        &bids,
        n,
        &format!("{workers} worker(s), prefill"),
        ", which zero-duration simulated steps never do",
        started + Duration::from_secs(args.timeout),
    )
    .await?;
    eprintln!(
        "prefill: {n} finished batches in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(bids)
}

/// Polls `GET /status` until `jobs` jobs and every batch of `bids` are
/// Completed. Fails when a job Failed (`failed_note` completes that
/// message), a process exited, nothing moved for `--stall` seconds or
/// `deadline` passed; each message names what is stuck and the last
/// warnings. Gives the last status and the projector's largest lag seen
/// (events, seconds).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn wait_all(
    args: &Args,
    api: &Api,
    procs: &mut RoundProcs,
    bids: &[String],
    total: usize,
    label: &str,
    failed_note: &str,
    deadline: Instant,
) -> Result<(StatusView, (f64, f64))> {
    let batches = bids.len();
    let bar = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template(&format!(
            "{label} [{{elapsed_precise}}] {{bar:30}} {{pos}}/{{len}} jobs Completed {{msg}}"
        ))
        .context("the progress bar template")?,
    );
    let mut last_progress = (0u64, 0u64, Instant::now());
    let mut max_behind = (0f64, 0f64);
    let mut polls = 0u64;
    let status = loop {
        procs.check_alive()?;
        let status = api.status().await?;
        polls += 1;
        if polls % 5 == 1 {
            if let Ok(text) = api.metrics().await {
                max_behind.0 = max_behind
                    .0
                    .max(metric(&text, "ingest_projector_events_behind"));
                max_behind.1 = max_behind
                    .1
                    .max(metric(&text, "ingest_projector_seconds_behind"));
            }
        }
        let count =
            |by: &BTreeMap<String, usize>, state: &str| by.get(state).copied().unwrap_or(0) as u64;
        let done = count(&status.jobs_by_state, "Completed");
        let failed = count(&status.jobs_by_state, "Failed");
        let batches_done = count(&status.batches_by_state, "Completed");
        let head = status.head_position;
        bar.set_position(done);
        bar.set_message(format!("{batches_done}/{batches} batches, {head} events"));
        if failed > 0 {
            bar.abandon();
            bail!(
                "{failed} job(s) Failed{failed_note}\n{}{}",
                stuck(api, bids, &status).await,
                last_warnings(procs)
            );
        }
        if done as usize >= total && batches_done as usize >= batches {
            bar.finish_and_clear();
            break status;
        }
        if (done, head) != (last_progress.0, last_progress.1) {
            last_progress = (done, head, Instant::now());
        } else if last_progress.2.elapsed() > Duration::from_secs(args.stall) {
            bar.abandon();
            bail!(
                "nothing moved for {} s ({done}/{total} jobs Completed, {batches_done}/{batches} batches)\n{}{}",
                args.stall,
                stuck(api, bids, &status).await,
                last_warnings(procs)
            );
        }
        if Instant::now() > deadline {
            bar.abandon();
            bail!(
                "not done within --timeout {} s ({done}/{total} jobs Completed, {batches_done}/{batches} batches)\n{}{}",
                args.timeout,
                stuck(api, bids, &status).await,
                last_warnings(procs)
            );
        }
        tokio::time::sleep(POLL).await;
    };
    Ok((status, max_behind))
}

/// What is not Completed: counts by state and a few jobs with their state.
pub(crate) async fn stuck(api: &Api, bids: &[String], status: &StatusView) -> String {
    let mut s = format!(
        "jobs by state: {:?}\nbatches by state: {:?}\n",
        status.jobs_by_state, status.batches_by_state
    );
    let mut shown = 0;
    for bid in bids {
        if shown >= 10 {
            break;
        }
        let Ok(batch) = api.batch(bid).await else {
            let _ = writeln!(s, "  {bid}: cannot read the batch");
            continue;
        };
        if batch.status == "Completed" {
            continue;
        }
        let _ = writeln!(s, "  {bid}: {}", batch.status);
        for job in &batch.jobs {
            if job.status == "Completed" || shown >= 10 {
                continue;
            }
            shown += 1;
            let _ = writeln!(
                s,
                "    {} {} since {}",
                job.jid, job.status, job.in_state_since
            );
        }
    }
    s
}

/// Counts refused reports and WARN/ERROR lines in the round's logs.
pub(crate) fn scan_logs(procs: &RoundProcs, round: &mut Round) {
    let scan = scan(procs);
    round.refused_reports = scan.refused;
    round.warn_lines = scan.warn;
    round.error_lines = scan.error;
    round.log_samples = scan.samples;
}
