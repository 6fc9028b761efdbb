//! What a listing page costs as the state grows (issue 25, finding 13).
//!
//! A listing page used to walk every batch or job of the state to count
//! `matched`, so paging through N items cost O(N²/limit). Now the first
//! page counts once, the cursor carries the count, and a later page starts
//! at its cursor in the state's (priority, id) index of jobs (batches are
//! kept by id). The figure: a later page's cost at 10,000 and at 100,000
//! jobs (flat), against the first page, which still walks everything once
//! (the old cost of every page).
//!
//! The states are made in memory from one batch the log builder folds
//! through the whole lifecycle, copied under new ids: a listing reads the
//! state only, never the log.
//!
//! ```text
//! cargo bench --bench listing -- --noplot
//! ```

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion};
use ingest_engine::listing::{batches_walked, jobs_walked};
use ingest_events::ids::{Bid, Jid};
use ingest_events::log::{Log, LogConfig};
use ingest_events::State;
use ingest_protocol::listing::{BatchQuery, Filters, JobQuery};

mod support;
use support::log_builder;

/// Jobs per batch in the made states.
const PER_BATCH: u64 = 10;
/// A page, as the CLI and the UI ask for.
const LIMIT: usize = 100;

fn sizes() -> Vec<u64> {
    if std::env::args().any(|a| a == "--bench") {
        vec![10_000, 100_000]
    } else {
        vec![2_000]
    }
}

/// A state of `jobs` jobs in batches of [`PER_BATCH`], copies of one batch
/// folded through the lifecycle, with priorities spread over 0..10.
fn state_of(jobs: u64) -> State {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::open(&dir.path().join("log"), &LogConfig::default()).expect("log");
    let one = log_builder::build(log, PER_BATCH, PER_BATCH);
    let batch = one.batches.values().next().expect("a batch").clone();
    let job = one.jobs.values().next().expect("a job").clone();
    let mut state = State::new();
    for n in 0..jobs.div_ceil(PER_BATCH) {
        let bid = Bid(n + 1);
        let mut b = batch.clone();
        b.bid = bid;
        b.jobs.clear();
        for k in 0..PER_BATCH {
            let jid = Jid(n * PER_BATCH + k + 1);
            let mut j = job.clone();
            j.jid = jid;
            j.bid = bid;
            j.priority = (jid.0 % 10) as u8;
            b.jobs.push(jid);
            state.jobs.insert(jid, j);
        }
        state.batches.insert(bid, b);
    }
    state.reindex();
    state
}

fn job_query(cursor: Option<String>) -> JobQuery {
    JobQuery {
        filters: Filters {
            limit: Some(LIMIT),
            cursor,
            ..Filters::default()
        },
        ..JobQuery::default()
    }
}

fn batch_query(cursor: Option<String>) -> BatchQuery {
    BatchQuery {
        filters: Filters {
            limit: Some(LIMIT),
            cursor,
            ..Filters::default()
        },
        ..BatchQuery::default()
    }
}

/// The cursor of the page that ends half-way through the listing.
fn middle_job_cursor(state: &State) -> String {
    let mut cursor = None;
    for _ in 0..state.jobs.len() / LIMIT / 2 {
        let (page, _) = jobs_walked(state, &job_query(cursor)).expect("page");
        cursor = page.next_cursor;
    }
    cursor.expect("a middle page")
}

fn middle_batch_cursor(state: &State) -> String {
    let mut cursor = None;
    for _ in 0..state.batches.len() / LIMIT / 2 {
        let (page, _) = batches_walked(state, &batch_query(cursor)).expect("page");
        cursor = page.next_cursor;
    }
    cursor.expect("a middle page")
}

fn listing(c: &mut Criterion) {
    let mut g = c.benchmark_group("listing");
    for jobs in sizes() {
        let state = state_of(jobs);
        let middle = middle_job_cursor(&state);
        g.bench_function(BenchmarkId::new("jobs_first_page", jobs), |b| {
            b.iter(|| black_box(jobs_walked(&state, &job_query(None)).expect("page")))
        });
        g.bench_function(BenchmarkId::new("jobs_later_page", jobs), |b| {
            b.iter(|| {
                black_box(jobs_walked(&state, &job_query(Some(middle.clone()))).expect("page"))
            })
        });
        let middle = middle_batch_cursor(&state);
        g.bench_function(
            BenchmarkId::new("batches_later_page", jobs / PER_BATCH),
            |b| {
                b.iter(|| {
                    black_box(
                        batches_walked(&state, &batch_query(Some(middle.clone()))).expect("page"),
                    )
                })
            },
        );
        // Every page of the listing, one after another: linear in pages.
        g.bench_function(BenchmarkId::new("jobs_every_page", jobs), |b| {
            b.iter(|| {
                let mut cursor = None;
                let mut pages = 0;
                loop {
                    let (page, _) = jobs_walked(&state, &job_query(cursor)).expect("page");
                    pages += 1;
                    cursor = page.next_cursor;
                    if cursor.is_none() {
                        break black_box(pages);
                    }
                }
            })
        });
    }
    g.finish();
}

fn main() {
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    listing(&mut c);
    c.final_summary();
}
