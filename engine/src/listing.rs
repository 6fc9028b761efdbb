//! Listing batches and jobs from the engine's state: what `GET /batches`,
//! `GET /jobs`, `ingest batches` and `ingest jobs` answer.
//!
//! Both walk the folded [`State`] (never ZooKeeper), filter it, and give one
//! page in the queues' order: batches by id, jobs by priority then id. The
//! query's cursor is the sort key of the last item of the previous page
//! (see [`ingest_protocol::listing`]).

use std::collections::BTreeMap;
use std::ops::{Bound, RangeBounds};

use ingest_events::state::{Batch, Job};
use ingest_events::{Jid, JobState, State};
use ingest_protocol::cut_middle;
use ingest_protocol::listing::{
    batch_cursor, job_cursor, BatchPage, BatchQuery, BatchSummary, JobPage, JobQuery, JobSummary,
    QueryError, LISTED_MESSAGE_BYTES,
};

/// Whether a job counts as having failures: in Failed now, or requeued out
/// of Failed before.
pub fn job_has_failures(j: &Job) -> bool {
    j.status == JobState::Failed || j.retry_count > 0
}

fn failed_jobs(state: &State, b: &Batch) -> usize {
    b.jobs
        .iter()
        .filter_map(|j| state.jobs.get(j))
        .filter(|j| j.status == JobState::Failed)
        .count()
}

fn batch_matches(state: &State, q: &BatchQuery, b: &Batch) -> bool {
    let f = &q.filters;
    (q.states.is_empty() || q.states.contains(&b.status))
        && f.collection
            .as_ref()
            .is_none_or(|c| *c == b.submission.profile_name)
        && f.within
            .as_ref()
            .is_none_or(|w| w.contains(&b.submission.profile_name))
        && f.submitter
            .as_ref()
            .is_none_or(|s| *s == b.submission.submitter)
        && f.times_match(b.created, b.last_modified)
        && f.has_failures.is_none_or(|want| {
            let has = b.status == ingest_events::BatchState::Failed || failed_jobs(state, b) > 0;
            has == want
        })
}

fn job_matches(state: &State, q: &JobQuery, j: &Job) -> bool {
    let f = &q.filters;
    (q.states.is_empty() || q.states.contains(&j.status))
        && q.batch.is_none_or(|b| b == j.bid)
        && f.collection
            .as_ref()
            .is_none_or(|c| *c == j.configuration.profile_name)
        && f.within
            .as_ref()
            .is_none_or(|w| w.contains(&j.configuration.profile_name))
        && f.submitter.as_ref().is_none_or(|s| {
            state
                .batches
                .get(&j.bid)
                .is_some_and(|b| b.submission.submitter == *s)
        })
        && f.times_match(j.created, j.last_modified)
        && f.has_failures
            .is_none_or(|want| job_has_failures(j) == want)
}

/// One batch as a listing shows it.
pub fn batch_summary(state: &State, b: &Batch) -> BatchSummary {
    let mut jobs_by_state: BTreeMap<String, usize> = BTreeMap::new();
    for j in b.jobs.iter().filter_map(|j| state.jobs.get(j)) {
        *jobs_by_state.entry(j.status.to_string()).or_default() += 1;
    }
    BatchSummary {
        bid: b.bid.to_string(),
        uuid: b.uuid.to_string(),
        status: b.status.to_string(),
        profile: b.submission.profile_name.clone(),
        submitter: b.submission.submitter.clone(),
        payload_type: b.submission.payload_type.to_string(),
        job_count: b.jobs.len(),
        failed_jobs: jobs_by_state
            .get(JobState::Failed.to_string().as_str())
            .copied()
            .unwrap_or(0),
        jobs_by_state,
        created: b.created,
        last_modified: b.last_modified,
        cleaned_up: b.cleaned_up,
        message: cut_middle(&b.message, LISTED_MESSAGE_BYTES).into_owned(),
    }
}

/// One job as a listing shows it.
pub fn job_summary(state: &State, j: &Job) -> JobSummary {
    JobSummary {
        jid: j.jid.to_string(),
        bid: j.bid.to_string(),
        status: j.status.to_string(),
        priority: j.priority,
        profile: j.configuration.profile_name.clone(),
        submitter: state
            .batches
            .get(&j.bid)
            .map(|b| b.submission.submitter.clone())
            .unwrap_or_default(),
        primary_id: j.identifiers.primary_id.clone(),
        local_ids: j.identifiers.local_ids.clone(),
        space_needed: j.space_needed,
        retry_count: j.retry_count,
        step_retries: j.step_retries,
        failed_in: j.failed_in.map(|s| s.to_string()),
        failure: j.failure.map(|k| k.name().to_string()),
        waiting: None,
        created: j.created,
        last_modified: j.last_modified,
        cleaned_up: j.cleaned_up,
        message: cut_middle(&j.message, LISTED_MESSAGE_BYTES).into_owned(),
    }
}

/// One page of the batches `q` asks for, by id.
///
/// # Errors
/// A cursor that is not a batch cursor.
pub fn batches(state: &State, q: &BatchQuery) -> Result<BatchPage, QueryError> {
    batches_walked(state, q).map(|(page, _)| page)
}

/// [`batches`], and how many batches of the state the page looked at (the
/// work a caller's budget is charged). The first page counts `matched`
/// over every batch; a page with a cursor starts after the cursor's batch
/// and stops one past its limit, and takes `matched` from the cursor.
///
/// # Errors
/// A cursor that is not a batch cursor.
pub fn batches_walked(state: &State, q: &BatchQuery) -> Result<(BatchPage, usize), QueryError> {
    let resume = q.after()?;
    let limit = q.filters.page_size();
    let mut walked = 0;
    let matched = match resume.and_then(|r| r.matched) {
        Some(m) => m,
        None => {
            walked += state.batches.len();
            state
                .batches
                .values()
                .filter(|b| batch_matches(state, q, b))
                .count()
        }
    };
    let from = resume.map_or(Bound::Unbounded, |r| Bound::Excluded(r.after));
    let mut page: Vec<&Batch> = Vec::new();
    let mut more = false;
    for (_, b) in state.batches.range((from, Bound::Unbounded)) {
        walked += 1;
        if !batch_matches(state, q, b) {
            continue;
        }
        if page.len() == limit {
            more = true;
            break;
        }
        page.push(b);
    }
    let page = BatchPage {
        matched,
        next_cursor: page
            .last()
            .filter(|_| more)
            .map(|b| batch_cursor(b.bid, matched)),
        batches: page.iter().map(|b| batch_summary(state, b)).collect(),
    };
    Ok((page, walked))
}

/// One page of the jobs `q` asks for, by priority then id.
///
/// # Errors
/// A cursor that is not a job cursor.
pub fn jobs(state: &State, q: &JobQuery) -> Result<JobPage, QueryError> {
    jobs_walked(state, q).map(|(page, _)| page)
}

/// [`jobs`], and how many jobs of the state the page looked at. Jobs are
/// walked in the state's (priority, id) index from the cursor on, so a
/// page costs its own length (plus the jobs the filters skip), never the
/// whole state; `matched` is counted on the first page only, as for
/// [`batches_walked`]. A batch's jobs are taken from the batch.
///
/// # Errors
/// A cursor that is not a job cursor.
pub fn jobs_walked(state: &State, q: &JobQuery) -> Result<(JobPage, usize), QueryError> {
    let resume = q.after()?;
    let limit = q.filters.page_size();
    let from = resume.map_or(Bound::Unbounded, |r| Bound::Excluded(r.after));
    let mut walked = 0;
    let mut keys: Vec<(u8, Jid)> = Vec::new();
    let counted = resume.and_then(|r| r.matched);
    let matched = match q.batch {
        // A batch's jobs are listed from the batch (at most a manifest's
        // worth), not from every job.
        Some(bid) => {
            let mut all: Vec<(u8, Jid)> = state
                .batches
                .get(&bid)
                .into_iter()
                .flat_map(|b| b.jobs.iter().filter_map(|j| state.jobs.get(j)))
                .filter(|j| job_matches(state, q, j))
                .map(|j| (j.priority, j.jid))
                .collect();
            walked += all.len();
            all.sort_unstable();
            let matched = all.len();
            keys.extend(
                all.into_iter()
                    .filter(|k| (from, Bound::Unbounded).contains(k))
                    .take(limit + 1),
            );
            counted.unwrap_or(matched)
        }
        None => {
            debug_assert_eq!(state.job_order.len(), state.jobs.len(), "job index");
            let matched = counted.unwrap_or_else(|| {
                walked += state.jobs.len();
                state
                    .jobs
                    .values()
                    .filter(|j| job_matches(state, q, j))
                    .count()
            });
            for key in state.job_order.range((from, Bound::Unbounded)) {
                walked += 1;
                let Some(j) = state.jobs.get(&key.1) else {
                    continue;
                };
                if job_matches(state, q, j) {
                    keys.push(*key);
                    if keys.len() > limit {
                        break;
                    }
                }
            }
            matched
        }
    };
    let more = keys.len() > limit;
    keys.truncate(limit);
    let page = JobPage {
        matched,
        next_cursor: keys
            .last()
            .filter(|_| more)
            .map(|(p, j)| job_cursor(*p, *j, matched)),
        jobs: keys
            .iter()
            .filter_map(|(_, j)| state.jobs.get(j))
            .map(|j| job_summary(state, j))
            .collect(),
    };
    Ok((page, walked))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Engine, EngineConfig};
    use ingest_events::command::{Command, Target};
    use ingest_events::event::Submission;
    use ingest_events::{Actor, Bid};
    use ingest_protocol::listing::Filters;

    fn submission(profile: &str, submitter: &str, lines: usize) -> Submission {
        let input = ingest_protocol::submission::SubmissionInput {
            submitter: Some(submitter.into()),
            profile: Some(profile.into()),
            payload_url: Some("https://example.org/m.checkm".into()),
            manifest: (0..lines).map(|i| format!("f{i}.checkm l{i}")).collect(),
            ..Default::default()
        };
        input.build().expect("submission")
    }

    /// Three batches: two of `demo` (alice), one of `other` (bob); every
    /// job acquired; jobs 2 and 4 failed, job 4 requeued; job 5 at priority 1.
    fn engine(dir: &std::path::Path) -> Engine {
        let mut e = Engine::open(EngineConfig::new(dir)).expect("open");
        let admin = Actor::admin("t");
        let subs = [
            ("demo", "alice", 2),
            ("other", "bob", 2),
            ("demo", "alice", 1),
        ];
        for (i, (p, s, n)) in subs.iter().enumerate() {
            submit_and_acquire(&mut e, i as u128 + 1, submission(p, s, *n));
        }
        for j in [2, 4] {
            let jid = Jid(j);
            e.execute(&admin, &Command::StartJob { jid })
                .expect("start");
            e.execute(
                &admin,
                &Command::SetJobStatus {
                    jid,
                    target: Target::Fail,
                    message: "x".repeat(1000),
                    priority: None,
                },
            )
            .expect("fail");
        }
        e.execute(
            &admin,
            &Command::RequeueJob {
                jid: Jid(4),
                reason: "fixed".into(),
            },
        )
        .expect("requeue");
        e.execute(&admin, &Command::StartJob { jid: Jid(5) })
            .expect("start");
        e.execute(
            &admin,
            &Command::RecordSpace {
                jid: Jid(5),
                space_needed: 10,
                priority: Some(1),
            },
        )
        .expect("space");
        e
    }

    fn submit_and_acquire(e: &mut Engine, n: u128, submission: Submission) {
        let admin = Actor::admin("t");
        let jobs = ingest_protocol::submission::expand_simple(&submission).expect("expand");
        e.execute(
            &admin,
            &Command::SubmitBatch {
                uuid: uuid::Uuid::from_u128(n),
                submission,
            },
        )
        .expect("submit");
        let bid = e.state().next_bid();
        let bid = Bid(bid.0 - 1);
        e.execute(&admin, &Command::AcquireBatch { bid, jobs })
            .expect("acquire");
    }

    fn jids(p: &JobPage) -> Vec<String> {
        p.jobs.iter().map(|j| j.jid.clone()).collect()
    }

    #[test]
    fn filters_select_and_jobs_come_in_queue_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = engine(dir.path());
        let s = e.state();
        let q = |pairs: &[(&str, &str)]| JobQuery::from_pairs(pairs.iter().copied()).expect("q");
        let all = jobs(s, &q(&[])).expect("list");
        assert_eq!(all.matched, 5);
        // Priority first, then id (the order of /jobs/states/<state>/PP-JID).
        assert_eq!(all.jobs[0].jid, "jid0000000005", "priority 1 runs first");
        let keys: Vec<_> = all
            .jobs
            .iter()
            .map(|j| (j.priority, j.jid.clone()))
            .collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
        let failed = jobs(s, &q(&[("state", "failed")])).expect("list");
        assert_eq!(jids(&failed), ["jid0000000002"]);
        assert!(failed.jobs[0].message.len() < 400, "messages are cut");
        let with = jobs(s, &q(&[("has_failures", "true")])).expect("list");
        assert_eq!(jids(&with), ["jid0000000002", "jid0000000004"]);
        let bob = jobs(s, &q(&[("submitter", "bob")])).expect("list");
        assert_eq!(jids(&bob), ["jid0000000003", "jid0000000004"]);
        let other = jobs(
            s,
            &q(&[("collection", "other"), ("batch", "bid0000000002")]),
        )
        .expect("list");
        assert_eq!(other.matched, 2);
        let none =
            jobs(s, &q(&[("collection", "demo"), ("batch", "bid0000000002")])).expect("list");
        assert_eq!(none.matched, 0);
        let later = jobs(s, &q(&[("created_since", "2999-01-01")])).expect("list");
        assert_eq!(later.matched, 0);
        let b = batches(
            s,
            &BatchQuery::from_pairs([("has_failures", "true")]).expect("q"),
        )
        .expect("list");
        assert_eq!(b.batches.len(), 1);
        assert_eq!(b.batches[0].bid, "bid0000000001");
        assert_eq!(b.batches[0].failed_jobs, 1);
    }

    #[test]
    fn pages_follow_each_other_and_stay_stable_under_appends() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut e = engine(dir.path());
        let q = |cursor: Option<String>| JobQuery {
            filters: Filters {
                limit: Some(2),
                cursor,
                ..Filters::default()
            },
            ..JobQuery::default()
        };
        let everything = jids(&jobs(e.state(), &JobQuery::default()).expect("all"));
        let p1 = jobs(e.state(), &q(None)).expect("p1");
        assert_eq!(p1.jobs.len(), 2);
        // A batch appended between pages does not shift what follows.
        submit_and_acquire(&mut e, 99, submission("demo", "carol", 1));
        let mut seen = jids(&p1);
        let mut cursor = p1.next_cursor;
        while let Some(c) = cursor {
            let p = jobs(e.state(), &q(Some(c))).expect("page");
            assert!(p.jobs.len() <= 2);
            seen.extend(jids(&p));
            cursor = p.next_cursor;
        }
        let unique: std::collections::BTreeSet<_> = seen.iter().collect();
        assert_eq!(unique.len(), seen.len(), "no job twice: {seen:?}");
        for j in &everything {
            assert!(seen.contains(j), "{j} skipped: {seen:?}");
        }
        // Batches page by id the same way; the last page has no cursor.
        let bq = |cursor| BatchQuery {
            filters: Filters {
                limit: Some(3),
                cursor,
                ..Filters::default()
            },
            ..BatchQuery::default()
        };
        let b1 = batches(e.state(), &bq(None)).expect("b1");
        assert_eq!(b1.batches.len(), 3);
        let b2 = batches(e.state(), &bq(b1.next_cursor)).expect("b2");
        assert_eq!(b2.batches.len(), 1);
        assert_eq!(b2.batches[0].bid, "bid0000000004");
        assert_eq!(b2.next_cursor, None);
        // A job cursor is refused on batches.
        let wrong = bq(Some(job_cursor(0, Jid(1), 1)));
        assert_eq!(
            batches(e.state(), &wrong).expect_err("kind").param,
            "cursor"
        );
    }

    /// Paging costs each page its own length: only the first page walks
    /// the whole state (to count `matched`), and every page agrees with a
    /// sort of the whole state, also after priorities changed.
    #[test]
    fn later_pages_walk_only_their_own_length_and_agree_with_a_full_sort() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut e = Engine::open(EngineConfig::new(dir.path())).expect("open");
        for n in 1..=6u128 {
            submit_and_acquire(&mut e, n, submission("demo", "alice", 10));
        }
        // Job 5 moves to the front of the queue.
        e.execute(&Actor::admin("t"), &Command::StartJob { jid: Jid(5) })
            .expect("start");
        e.execute(
            &Actor::admin("t"),
            &Command::RecordSpace {
                jid: Jid(5),
                space_needed: 1,
                priority: Some(0),
            },
        )
        .expect("space");
        let state = e.state();
        let total = state.jobs.len();
        assert_eq!(total, 60);
        let mut sorted: Vec<(u8, Jid)> = state.jobs.values().map(|j| (j.priority, j.jid)).collect();
        sorted.sort_unstable();
        let q = |cursor: Option<String>| JobQuery {
            filters: Filters {
                limit: Some(7),
                cursor,
                ..Filters::default()
            },
            ..JobQuery::default()
        };
        let (first, walked) = jobs_walked(state, &q(None)).expect("first");
        assert_eq!(first.matched, total);
        assert_eq!(walked, total + 8, "the count, then one past the page");
        let mut seen: Vec<String> = jids(&first);
        let mut cursor = first.next_cursor;
        while let Some(c) = cursor {
            let (p, walked) = jobs_walked(state, &q(Some(c))).expect("page");
            assert_eq!(p.matched, total, "the first page's count");
            assert!(walked <= 8, "a later page walked {walked} jobs");
            seen.extend(jids(&p));
            cursor = p.next_cursor;
        }
        let want: Vec<String> = sorted.iter().map(|(_, j)| j.to_string()).collect();
        assert_eq!(seen, want);
        assert_eq!(seen[0], Jid(5).to_string());
        // Batches the same way.
        let (b1, walked) = batches_walked(
            state,
            &BatchQuery {
                filters: Filters {
                    limit: Some(2),
                    ..Filters::default()
                },
                ..BatchQuery::default()
            },
        )
        .expect("b1");
        assert_eq!((b1.matched, walked), (6, 6 + 3));
        let (b2, walked) = batches_walked(
            state,
            &BatchQuery {
                filters: Filters {
                    limit: Some(2),
                    cursor: b1.next_cursor,
                    ..Filters::default()
                },
                ..BatchQuery::default()
            },
        )
        .expect("b2");
        assert_eq!((b2.matched, walked), (6, 3));
        assert_eq!(b2.batches[0].bid, "bid0000000003");
    }
}
