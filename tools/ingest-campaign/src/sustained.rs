//! `sustained`: the highest submission rate each setup holds, rather than
//! how fast it answers one burst.
//!
//! A burst measures how fast an engine answers, but an engine that
//! answers faster than its projector writes ZooKeeper leaves work behind
//! that grows for as long as the rate lasts: workers find nothing of it
//! until the projector catches up. The rate a queue can take for good is
//! the highest one at which both the answers and the projection keep up.
//! Each probe submits open-loop at a fixed rate (submissions are due at
//! fixed times, whatever the engine answers) for a fixed time, and the
//! rate is held when, over the probe's second half, the 99th percentile
//! of the time from a submission's due time to its answer (a wait for one
//! of `--max-in-flight` connections included) is at most [`MAX_P99`], the
//! projector was at most [`MAX_BEHIND`] worth of the rate's events behind,
//! and no submission was refused. The search raises the
//! rate by half while it is held (and halves it while it is not), then
//! bisects between the highest rate held and the lowest not held. Every
//! probe runs on new ZooKeeper servers and engines, warmed up first.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use tokio::sync::Semaphore;

use super::{
    burst, converged, ensemble, events_behind, http, leader, projected, standalone, status,
    submission, Cpu, Ctx, Engine, DEPOSITOR,
};

/// A rate is held only if the submissions of a probe's second half were
/// answered within this (99th percentile, from their due time).
const MAX_P99: Duration = Duration::from_secs(1);

/// A rate is held only if the projector was never further behind, in the
/// probe's second half, than this long's worth of the rate's events.
const MAX_BEHIND: Duration = Duration::from_secs(1);

/// A submission still unsent this long after its due time (every one of
/// `--max-in-flight` connections busy) ends its probe: the rate is far
/// from held, and going on would take many times the probe's length.
const GIVE_UP: Duration = Duration::from_secs(5);

/// How often the projector's position is sampled during a probe.
const SAMPLE_EVERY: Duration = Duration::from_millis(200);

/// Due submissions are sent in rounds this far apart.
const TICK: Duration = Duration::from_millis(5);

/// The most probes of one search before the bisection (the rate moves by
/// half or doubles each time, so this spans far more than any rate here).
const MAX_SEARCH_PROBES: usize = 24;

#[derive(Debug, Args)]
pub(crate) struct SustainedArgs {
    /// Seconds each probe submits at its rate.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=600))]
    seconds: u64,
    /// The first rate tried, in batches per second.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    start_rate: u64,
    /// No rate above this is tried (batches per second).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_rate: u64,
    /// Bisections between the highest rate held and the lowest not held,
    /// each halving the interval.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(0..=12))]
    steps: u32,
    /// The most submissions unanswered at once (connections): one due
    /// while this many are unanswered waits for one, and the wait counts
    /// in its time to an answer. The tool and the engines each need this
    /// many file descriptors (`ulimit -n`).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=8000))]
    max_in_flight: u64,
    /// Judge a rate by its answers alone: the projector may fall behind
    /// (what an engine that answers faster than it projects does for as
    /// long as the rate lasts).
    #[arg(long)]
    answers_only: bool,
    /// Batches submitted (64 in flight) before each probe, so caches and
    /// the ZooKeeper servers' JIT are warm; they also give the events per
    /// batch.
    #[arg(long, default_value_t = 4000)]
    warm_up: usize,
}

/// What one probe saw.
#[derive(Debug, Clone)]
struct Probe {
    rate: f64,
    /// Whether the setup held the rate.
    held: bool,
    /// Why not, when not held.
    why: String,
    /// The 99th percentile of due-to-answer times over the second half.
    p99: Duration,
    /// The projector's most events behind over the second half.
    behind: u64,
    /// Submissions sent (all that were due, unless the probe gave up).
    sent: u64,
    /// Records per tail write of a replicated leader over the probe (its
    /// group commit), from its `GET /replication` counters.
    per_write: Option<f64>,
    /// CPU (engines, ZooKeeper servers, this tool) per batch submitted,
    /// from the probe's start until the projector held all of it, in
    /// milliseconds; and the cores that kept busy.
    cpu_ms: f64,
    cores: f64,
}

/// One setup's search.
struct Search {
    held: Option<Probe>,
    not_held: Option<Probe>,
    probes: usize,
}

/// A setup the probes run against: where to submit and which engine
/// projects.
struct Target<'a> {
    bases: &'a str,
    projector: &'a str,
    events_per_batch: f64,
    next: &'a AtomicU64,
}

/// Submits at `rate` batches/s for `seconds`, open-loop, and judges the
/// result.
async fn probe(target: &Target<'_>, rate: f64, args: &SustainedArgs) -> Result<Probe> {
    let client = ingest_client::Client::new(target.bases, DEPOSITOR)?;
    let http = http();
    let window = Duration::from_secs(args.seconds);
    let half = window / 2;
    let total = (rate * args.seconds as f64).round().max(1.0) as u64;
    let slots = Arc::new(Semaphore::new(args.max_in_flight as usize));
    let refused = Arc::new(AtomicU64::new(0));
    let mut starved = false;
    let mut answers = tokio::task::JoinSet::new();
    // The projector's position, sampled until the window ends.
    let sampler = {
        let (http, base) = (http.clone(), target.projector.to_string());
        tokio::spawn(async move {
            let t0 = Instant::now();
            let mut most = 0u64;
            while t0.elapsed() < window {
                tokio::time::sleep(SAMPLE_EVERY).await;
                if t0.elapsed() >= half {
                    if let Some(b) = events_behind(&http, &base).await {
                        most = most.max(b);
                    }
                }
            }
            most
        })
    };
    let t0 = Instant::now();
    let mut sent = 0u64;
    'send: while sent < total {
        let now = t0.elapsed();
        let due_by_now = ((now.as_secs_f64() * rate) as u64 + 1).min(total);
        while sent < due_by_now {
            let due = Duration::from_secs_f64(sent as f64 / rate);
            // With every slot taken the submission waits for one, and the
            // wait counts in its time from due to answer; one that could
            // not be sent within [`GIVE_UP`] ends the probe.
            let slot = match Arc::clone(&slots).try_acquire_owned() {
                Ok(slot) => slot,
                Err(_) => match tokio::time::timeout_at(
                    (Instant::now() + GIVE_UP.saturating_sub(t0.elapsed().saturating_sub(due)))
                        .into(),
                    Arc::clone(&slots).acquire_owned(),
                )
                .await
                {
                    Ok(Ok(slot)) => slot,
                    _ => {
                        starved = true;
                        break 'send;
                    }
                },
            };
            let (client, refused) = (client.clone(), Arc::clone(&refused));
            let body = submission(target.next.fetch_add(1, Ordering::Relaxed));
            answers.spawn(async move {
                let outcome = client.submit(&body).await;
                drop(slot);
                if outcome.is_err() {
                    refused.fetch_add(1, Ordering::Relaxed);
                }
                (due, t0.elapsed())
            });
            sent += 1;
        }
        tokio::time::sleep(TICK).await;
    }
    let mut late: Vec<Duration> = Vec::new();
    let answered_within = Instant::now() + Duration::from_secs(120);
    while let Some(r) = tokio::time::timeout_at(answered_within.into(), answers.join_next())
        .await
        .context("submissions still unanswered 120 s after the probe")?
    {
        let (due, answered) = r.context("a submission task failed")?;
        if due >= half {
            late.push(answered.saturating_sub(due));
        }
    }
    let behind = sampler.await.unwrap_or(u64::MAX);
    late.sort();
    let p99 = late
        .get((late.len() * 99 / 100).min(late.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default();
    let refused = refused.load(Ordering::Relaxed);
    let behind_bound = behind_bound(rate, target.events_per_batch, args);
    let why = verdict(
        starved,
        refused,
        p99,
        behind,
        behind_bound,
        args.max_in_flight,
    );
    // Wait for the projector to hold the whole probe: the CPU figure
    // covers that work, and the replicas converge after it.
    projected(
        &http,
        target.projector,
        "the projector after a probe",
        Duration::from_secs(300),
    )
    .await?;
    Ok(Probe {
        rate,
        held: why.is_empty(),
        why,
        p99,
        behind,
        sent,
        per_write: None,
        cpu_ms: 0.0,
        cores: 0.0,
    })
}

/// The most events the projector may be behind at `rate` (none counts
/// with `--answers-only`).
fn behind_bound(rate: f64, events_per_batch: f64, args: &SustainedArgs) -> u64 {
    if args.answers_only {
        u64::MAX
    } else {
        (rate * events_per_batch * MAX_BEHIND.as_secs_f64()).ceil() as u64
    }
}

/// Why a probe did not hold its rate; empty when it did.
fn verdict(
    starved: bool,
    refused: u64,
    p99: Duration,
    behind: u64,
    behind_bound: u64,
    max_in_flight: u64,
) -> String {
    if starved {
        format!(
            "a submission waited {} s for one of {max_in_flight} connections",
            GIVE_UP.as_secs()
        )
    } else if refused > 0 {
        format!("{refused} submissions refused or unanswered")
    } else if p99 > MAX_P99 {
        format!("answers p99 {} ms", p99.as_millis())
    } else if behind > behind_bound {
        format!("projector {behind} events behind (bound {behind_bound})")
    } else {
        String::new()
    }
}

/// Finds the highest rate `probe` says is held: up by half while held
/// (down by half while not), then `--steps` bisections.
async fn search<F, Fut>(name: &str, args: &SustainedArgs, mut probe: F) -> Result<Search>
where
    F: FnMut(f64) -> Fut,
    Fut: std::future::Future<Output = Result<Probe>>,
{
    let mut s = Search {
        held: None,
        not_held: None,
        probes: 0,
    };
    let max = args.max_rate as f64;
    let mut rate = (args.start_rate as f64).min(max);
    let record = |p: Probe, s: &mut Search| {
        s.probes += 1;
        if p.held {
            eprintln!(
                "campaign: {name}: {:.0} batches/s held (p99 {} ms, projector at most {} events behind, CPU {:.2} ms per batch, {:.2} cores)",
                p.rate,
                p.p99.as_millis(),
                p.behind,
                p.cpu_ms,
                p.cores,
            );
        } else {
            eprintln!(
                "campaign: {name}: {:.0} batches/s not held: {} (CPU {:.2} ms per batch, {:.2} cores)",
                p.rate, p.why, p.cpu_ms, p.cores
            );
        }
        if p.held {
            s.held = Some(p);
        } else {
            s.not_held = Some(p);
        }
    };
    for _ in 0..MAX_SEARCH_PROBES {
        let p = probe(rate).await?;
        let held = p.held;
        record(p, &mut s);
        match (held, &s.held, &s.not_held) {
            (_, Some(_), Some(_)) => break,
            (true, _, None) if rate >= max => break,
            (true, _, None) => rate = (rate * 1.5).min(max),
            (false, None, _) if rate <= 1.0 => break,
            (false, None, _) => rate = (rate / 2.0).max(1.0),
            _ => break,
        }
    }
    for _ in 0..args.steps {
        let (Some(lo), Some(hi)) = (&s.held, &s.not_held) else {
            break;
        };
        let mid = (lo.rate + hi.rate) / 2.0;
        if hi.rate - lo.rate < 2.0 {
            break;
        }
        let p = probe(mid).await?;
        record(p, &mut s);
    }
    Ok(s)
}

/// Warms `bases` up and returns the events per batch it measured.
async fn warm_up(
    bases: &str,
    status_of: &str,
    args: &SustainedArgs,
    next: &AtomicU64,
) -> Result<f64> {
    let http = http();
    let applied = |s: Option<serde_json::Value>| s.and_then(|s| s["applied"].as_u64()).unwrap_or(0);
    let before = applied(status(&http, status_of).await);
    let n = args.warm_up.max(1);
    burst(bases, n, 64).await?;
    next.fetch_add(n as u64, Ordering::Relaxed);
    projected(
        &http,
        status_of,
        "the projector after the warm-up",
        Duration::from_secs(120),
    )
    .await?;
    let after = applied(status(&http, status_of).await);
    Ok((after.saturating_sub(before) as f64 / n as f64).max(1.0))
}

/// The three setups a probe runs against.
#[derive(Debug, Clone, Copy)]
enum Setup {
    /// One engine on a standalone ZooKeeper.
    Standalone,
    /// One engine on an ensemble of three.
    Ensemble,
    /// The leader of three engines on an ensemble of three.
    Replicated,
}

impl Setup {
    fn name(self) -> &'static str {
        match self {
            Setup::Standalone => "single",
            Setup::Ensemble => "single-ensemble",
            Setup::Replicated => "replicated",
        }
    }
}

/// One probe on a new setup of its own: new ZooKeeper servers and
/// engines, warmed up, probed at `rate`, stopped and removed. Every probe
/// starts from the same state: on one setup probed again and again, the
/// tree of every earlier probe stayed in ZooKeeper (no worker takes the
/// batches), its servers' heap filled, and a probe measured their
/// collector instead of the rate.
async fn fresh_probe(
    ctx: &Ctx,
    setup: Setup,
    k: usize,
    rate: f64,
    args: &SustainedArgs,
) -> Result<Probe> {
    let work = ctx.work.join(format!("{}-{k}", setup.name()));
    std::fs::create_dir_all(&work).with_context(|| format!("cannot create {}", work.display()))?;
    let pctx = Ctx {
        ingest: ctx.ingest.clone(),
        zk_tool: ctx.zk_tool.clone(),
        work: work.clone(),
        session_timeout: ctx.session_timeout,
    };
    let p = probe_on(&pctx, setup, rate, args).await?;
    // Only a probe that went through is removed (a failed one is kept
    // with the rest of the work directory).
    let _ = std::fs::remove_dir_all(&work);
    Ok(p)
}

async fn probe_on(ctx: &Ctx, setup: Setup, rate: f64, args: &SustainedArgs) -> Result<Probe> {
    let http = http();
    // Named as `throughput` names them, so `tools/campaign` stops them.
    let zk_dir = match setup {
        Setup::Standalone => ctx.work.join("zk-single"),
        _ => ctx.work.join("zk"),
    }
    .to_string_lossy()
    .into_owned();
    let (_zk, hosts) = match setup {
        Setup::Standalone => standalone(ctx, &zk_dir)?,
        Setup::Ensemble | Setup::Replicated => ensemble(ctx, &zk_dir)?,
    };
    let replicas = match setup {
        Setup::Replicated => 3,
        _ => 1,
    };
    let mut engines = Vec::new();
    for i in 1..=replicas {
        engines.push(Engine::start(ctx, &format!("e{i}"), &hosts, replicas).await?);
    }
    let l = if replicas > 1 {
        leader(&http, &engines).await?
    } else {
        0
    };
    let bases = engines
        .iter()
        .map(|e| e.base.clone())
        .collect::<Vec<_>>()
        .join(",");
    let next = AtomicU64::new(0);
    let outcome = async {
        let epb = warm_up(&bases, &engines[l].base, args, &next).await?;
        let target = Target {
            bases: &bases,
            projector: &engines[l].base,
            events_per_batch: epb,
            next: &next,
        };
        let refs: Vec<&Engine> = engines.iter().collect();
        let counters = || async {
            let s = status(&http, &engines[l].base).await;
            let n = |k: &str| s.as_ref().and_then(|s| s[k].as_u64()).unwrap_or(0);
            (n("records_replicated"), n("tail_writes"))
        };
        let before = counters().await;
        let (cpu0, t0) = (Cpu::read(&refs, &zk_dir), Instant::now());
        let mut p = probe(&target, rate, args).await?;
        let cpu = Cpu::read(&refs, &zk_dir).since(cpu0);
        p.cpu_ms = 1000.0 * cpu.total() / p.sent.max(1) as f64;
        p.cores = cpu.total() / t0.elapsed().as_secs_f64().max(1e-9);
        if replicas > 1 {
            converged(&http, &engines, Duration::from_secs(60)).await?;
            // The leader's counters are refreshed every upkeep (500 ms).
            tokio::time::sleep(Duration::from_secs(1)).await;
            let after = counters().await;
            let writes = after.1.saturating_sub(before.1);
            p.per_write =
                (writes > 0).then(|| after.0.saturating_sub(before.0) as f64 / writes as f64);
        }
        Ok(p)
    }
    .await;
    for e in &mut engines {
        e.kill().await;
    }
    outcome
}

/// Prints one setup's row of the table.
fn row(name: &str, s: &Search, args: &SustainedArgs) -> String {
    let held = s
        .held
        .as_ref()
        .map_or("none".to_string(), |p| format!("{:.0}", p.rate));
    let not_held = s.not_held.as_ref().map_or_else(
        || format!("none up to {} (--max-rate)", args.max_rate),
        |p| format!("{:.0} ({})", p.rate, p.why),
    );
    let (p99, behind, cpu, per_write) = match &s.held {
        Some(p) => (
            p.p99.as_millis().to_string(),
            p.behind.to_string(),
            format!("{:.2} / {:.2}", p.cpu_ms, p.cores),
            p.per_write.map_or("-".to_string(), |w| format!("{w:.1}")),
        ),
        None => Default::default(),
    };
    let dash = |c: String| if c.is_empty() { "-".to_string() } else { c };
    format!(
        "| {name} | {held} | {not_held} | {} | {} | {} | {} | {} |",
        dash(p99),
        dash(behind),
        dash(cpu),
        dash(per_write),
        s.probes
    )
}

pub(crate) async fn sustained(ctx: &Ctx, args: SustainedArgs) -> Result<bool> {
    let mut searches = Vec::new();
    for setup in [Setup::Standalone, Setup::Ensemble, Setup::Replicated] {
        let k = AtomicU64::new(0);
        let s = search(setup.name(), &args, |rate| {
            let k = k.fetch_add(1, Ordering::Relaxed) as usize + 1;
            let args = &args;
            async move { fresh_probe(ctx, setup, k, rate, args).await }
        })
        .await?;
        searches.push(s);
    }
    let [standalone, on_ensemble, replicated] = <[Search; 3]>::try_from(searches)
        .map_err(|_| anyhow::anyhow!("three searches expected"))?;
    let projector = if args.answers_only {
        "the projector not considered (--answers-only)".to_string()
    } else {
        format!(
            "the projector was at most {} s of the rate's events behind",
            MAX_BEHIND.as_secs()
        )
    };
    println!(
        "Sustained: the highest rate each setup held for {} s, each probe on new ZooKeeper servers and engines (submissions due at fixed times; held when, over the second half, answers came within {} ms of their due time at the 99th percentile, {projector}, and none was refused; at most {} unanswered at once, a wait for one of them counting in the time):",
        args.seconds,
        MAX_P99.as_millis(),
        args.max_in_flight,
    );
    println!();
    println!("| run | highest rate held (batches/s) | lowest rate not held (why) | p99 ms at the rate held | projector events behind at most | CPU ms per batch / cores busy at the rate held | records per ZooKeeper write (replicated) | probes |");
    println!("|---|---|---|---|---|---|---|---|");
    println!("{}", row("single (standalone)", &standalone, &args));
    println!("{}", row("single (ensemble of 3)", &on_ensemble, &args));
    println!("{}", row("replicated (3 + 3)", &replicated, &args));
    println!();
    let rate = |s: &Search| s.held.as_ref().map_or(0.0, |p| p.rate);
    let bounded = |s: &Search| {
        if s.not_held.is_some() {
            ""
        } else {
            " (at least: --max-rate held)"
        }
    };
    println!("| replicated / single (standalone) | replicated / single (ensemble of 3) |");
    println!("|---|---|");
    let ratio = |single: &Search| {
        let r = rate(single);
        if r > 0.0 {
            format!("{:.2}{}", rate(&replicated) / r, bounded(single))
        } else {
            "-".to_string()
        }
    };
    println!("| {} | {} |", ratio(&standalone), ratio(&on_ensemble));
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: SustainedArgs,
    }

    fn args(extra: &[&str]) -> SustainedArgs {
        Cli::parse_from(std::iter::once("sustained").chain(extra.iter().copied())).args
    }

    /// Runs the search against a setup that holds every rate up to
    /// `capacity`; returns the highest held, the lowest not held and the
    /// rates probed.
    fn against(capacity: f64, extra: &[&str]) -> (Option<f64>, Option<f64>, Vec<f64>) {
        let args = args(extra);
        let probed = std::sync::Mutex::new(Vec::new());
        let s = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(search("test", &args, |rate| {
                probed.lock().unwrap().push(rate);
                let held = rate <= capacity;
                async move {
                    Ok(Probe {
                        rate,
                        held,
                        why: if held { String::new() } else { "over".into() },
                        p99: Duration::ZERO,
                        behind: 0,
                        sent: 0,
                        per_write: None,
                        cpu_ms: 0.0,
                        cores: 0.0,
                    })
                }
            }))
            .unwrap();
        assert_eq!(s.probes, probed.lock().unwrap().len());
        (
            s.held.map(|p| p.rate),
            s.not_held.map(|p| p.rate),
            probed.into_inner().unwrap(),
        )
    }

    #[test]
    fn the_search_rises_until_a_rate_is_not_held_then_bisects() {
        let (held, not_held, probed) = against(3000.0, &["--start-rate", "1000", "--steps", "4"]);
        // 1000, 1500, 2250 held, 3375 not; then 2812.5, 3093.75 (not),
        // 2953.125, 3023.4375 (not).
        assert_eq!(&probed[..4], &[1000.0, 1500.0, 2250.0, 3375.0]);
        assert_eq!(probed.len(), 8, "{probed:?}");
        let (held, not_held) = (held.unwrap(), not_held.unwrap());
        assert!(held <= 3000.0 && not_held > 3000.0, "{held} {not_held}");
        assert!(
            not_held - held <= (3375.0 - 2250.0) / 16.0 + 1e-9,
            "{held} {not_held}"
        );
    }

    #[test]
    fn the_search_falls_while_the_first_rate_is_not_held() {
        let (held, not_held, probed) = against(300.0, &["--start-rate", "1000", "--steps", "0"]);
        assert_eq!(probed, vec![1000.0, 500.0, 250.0]);
        assert_eq!((held, not_held), (Some(250.0), Some(500.0)));
    }

    #[test]
    fn the_search_stops_at_the_highest_rate_it_may_try() {
        let (held, not_held, probed) =
            against(1e9, &["--start-rate", "1000", "--max-rate", "2000"]);
        assert_eq!(probed, vec![1000.0, 1500.0, 2000.0]);
        assert_eq!((held, not_held), (Some(2000.0), None));
        // Nothing held even at one batch a second: the search ends there.
        let (held, not_held, probed) = against(0.5, &["--start-rate", "4"]);
        assert_eq!(probed, vec![4.0, 2.0, 1.0]);
        assert_eq!((held, not_held), (None, Some(1.0)));
    }

    #[test]
    fn the_projector_may_be_a_second_of_the_rate_behind_unless_only_answers_count() {
        assert_eq!(behind_bound(1000.0, 2.5, &args(&[])), 2500);
        assert_eq!(
            behind_bound(1000.0, 2.5, &args(&["--answers-only"])),
            u64::MAX
        );
    }

    #[test]
    fn a_probe_is_held_only_when_every_bound_is_kept() {
        let ok = Duration::from_millis(200);
        assert_eq!(verdict(false, 0, ok, 10, 10, 8), "");
        assert!(verdict(true, 0, ok, 0, 10, 8).contains("one of 8 connections"));
        assert!(verdict(false, 3, ok, 0, 10, 8).starts_with("3 submissions refused"));
        assert!(
            verdict(false, 0, MAX_P99 + Duration::from_millis(1), 0, 10, 8).contains("p99 1001 ms")
        );
        assert!(verdict(false, 0, ok, 11, 10, 8).contains("11 events behind (bound 10)"));
    }
}
