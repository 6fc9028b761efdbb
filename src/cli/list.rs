//! `ingest batches` and `ingest jobs`: pages of a listing through the
//! [`Backend`], printed as an aligned table, YAML or JSON.

use anyhow::Result;
use ingest_protocol::listing::{
    BatchPage, BatchQuery, Filters, JobPage, JobQuery, QueryError, MAX_LIMIT,
};

use super::args::{ListBatchesArgs, ListFilters, ListJobsArgs};
use super::backend::Backend;
use super::opts::Format;
use super::output::{emit, table, time, write_stdout};

/// The most pages `--all` follows (a million items at the largest page).
const MAX_PAGES: usize = 1000;

fn filters(f: &ListFilters) -> Result<Filters> {
    let filters = Filters {
        collection: f.collection.clone(),
        submitter: f.submitter.clone(),
        created_since: f.created_since,
        created_until: f.created_until,
        modified_since: f.modified_since,
        modified_until: f.modified_until,
        has_failures: f.has_failures,
        // --all pages as widely as a server allows.
        limit: f.limit.or(f.all.then_some(MAX_LIMIT)),
        cursor: f.cursor.clone(),
        within: None,
    };
    filters.validate().map_err(usage)?;
    Ok(filters)
}

fn usage(e: QueryError) -> anyhow::Error {
    super::exit::Usage(format!("--{}: {}", e.param.replace('_', "-"), e.reason)).into()
}

fn states<S: std::str::FromStr<Err = ingest_events::lifecycle::UnknownState>>(
    given: Option<&str>,
) -> Result<Vec<S>> {
    let Some(given) = given else {
        return Ok(Vec::new());
    };
    given
        .split(',')
        .map(|s| {
            s.trim()
                .parse::<S>()
                .map_err(|e| super::exit::Usage(format!("--state: {e}")).into())
        })
        .collect()
}

/// `ingest batches`.
pub(super) fn batches(backend: &mut dyn Backend, args: ListBatchesArgs) -> Result<()> {
    let mut q = BatchQuery {
        states: states(args.state.as_deref())?,
        filters: filters(&args.filters)?,
    };
    let first = backend.list_batches(&q)?;
    let page = follow(first, args.filters.all, |cursor| {
        q.filters.cursor = Some(cursor);
        backend.list_batches(&q)
    })?;
    print_batches(&page, args.filters.format)
}

/// `ingest jobs`.
pub(super) fn jobs(backend: &mut dyn Backend, args: ListJobsArgs) -> Result<()> {
    let mut q = JobQuery {
        states: states(args.state.as_deref())?,
        batch: args.batch,
        filters: filters(&args.filters)?,
    };
    let first = backend.list_jobs(&q)?;
    let page = follow(first, args.filters.all, |cursor| {
        q.filters.cursor = Some(cursor);
        backend.list_jobs(&q)
    })?;
    print_jobs(&page, args.filters.format)
}

/// A page that `--all` extends with the pages after it.
trait Paged: Sized {
    /// Takes the page's next cursor.
    fn take_cursor(&mut self) -> Option<String>;
    /// Appends the next page (its items, cursor and count).
    fn append(&mut self, next: Self);
}

impl Paged for BatchPage {
    fn take_cursor(&mut self) -> Option<String> {
        self.next_cursor.take()
    }
    fn append(&mut self, next: Self) {
        self.batches.extend(next.batches);
        self.next_cursor = next.next_cursor;
        self.matched = next.matched;
    }
}

impl Paged for JobPage {
    fn take_cursor(&mut self) -> Option<String> {
        self.next_cursor.take()
    }
    fn append(&mut self, next: Self) {
        self.jobs.extend(next.jobs);
        self.next_cursor = next.next_cursor;
        self.matched = next.matched;
    }
}

/// With `all`, follows the cursors from `page` on (at most [`MAX_PAGES`]).
fn follow<P: Paged>(
    mut page: P,
    all: bool,
    mut next: impl FnMut(String) -> Result<P>,
) -> Result<P> {
    let mut pages = 1;
    while all && pages < MAX_PAGES {
        let Some(cursor) = page.take_cursor() else {
            break;
        };
        let more = next(cursor)?;
        page.append(more);
        pages += 1;
    }
    Ok(page)
}

fn footer(shown: usize, matched: usize, next: Option<&str>) -> String {
    match next {
        Some(c) => format!("{shown} of {matched} shown; next page: --cursor {c} (or --all)\n"),
        None => format!("{shown} of {matched} shown\n"),
    }
}

fn print_batches(page: &BatchPage, format: Format) -> Result<()> {
    if format != Format::Table {
        return emit(page, format);
    }
    let rows = page
        .batches
        .iter()
        .map(|b| {
            vec![
                b.bid.clone(),
                b.status.clone(),
                b.profile.clone(),
                b.submitter.clone(),
                b.job_count.to_string(),
                b.failed_jobs.to_string(),
                time(&b.created),
                time(&b.last_modified),
                b.message.clone(),
            ]
        })
        .collect();
    let mut out = table(
        &[
            "BID",
            "STATUS",
            "PROFILE",
            "SUBMITTER",
            "JOBS",
            "FAILED",
            "CREATED",
            "MODIFIED",
            "MESSAGE",
        ],
        rows,
    );
    out.push_str(&footer(
        page.batches.len(),
        page.matched,
        page.next_cursor.as_deref(),
    ));
    write_stdout(&out);
    Ok(())
}

fn print_jobs(page: &JobPage, format: Format) -> Result<()> {
    if format != Format::Table {
        return emit(page, format);
    }
    let rows = page
        .jobs
        .iter()
        .map(|j| {
            vec![
                j.jid.clone(),
                j.bid.clone(),
                j.status.clone(),
                format!("{:02}", j.priority),
                j.profile.clone(),
                j.local_ids.join(";"),
                j.space_needed.to_string(),
                j.retry_count.to_string(),
                time(&j.last_modified),
                // Why a worker keeps it waiting says more than the message
                // of its last move.
                match &j.waiting {
                    Some(w) => format!("waiting: {w}"),
                    None => j.message.clone(),
                },
            ]
        })
        .collect();
    let mut out = table(
        &[
            "JID",
            "BID",
            "STATUS",
            "PRI",
            "PROFILE",
            "LOCAL_IDS",
            "BYTES",
            "REQUEUES",
            "MODIFIED",
            "MESSAGE",
        ],
        rows,
    );
    out.push_str(&footer(
        page.jobs.len(),
        page.matched,
        page.next_cursor.as_deref(),
    ));
    write_stdout(&out);
    Ok(())
}
