//! The admin web UI (`/ui`) of a real `ingest serve` over a real
//! ZooKeeper: plain HTTP for sessions, CSRF and escaping; headless
//! Chromium through WebDriver (chromedriver, `fantoccini`) for an admin
//! finding a failed job and requeueing it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use fantoccini::{Client, ClientBuilder, Locator};
use reqwest::header;
use serde_json::{json, Value};

use crate::server::{self, eventually, Server, ADMIN, DEPOSITOR};
use crate::zk_server::{shared, unique_root, ZkServer};

/// The token of the admin named alice (from the admins file).
const ALICE: &str = "alice-admin-token-0123456789";

/// Starts `ingest serve` with an admins file naming alice (and the
/// ZooKeeper it projects into, which stops when dropped).
fn start(
    dir: &Path,
    daemons: Option<&[&str]>,
    args: &[String],
) -> (std::sync::Arc<ZkServer>, Server) {
    let zk = shared();
    // The object the search test asks to assemble (the access queue
    // refuses an ark the inventory lacks).
    server::seed_objects(dir, &[("ark:/99999/fk4uiaccess", 1, &[17_079])]);
    let admins = dir.join("admins");
    std::fs::write(&admins, format!("# name token\nalice {ALICE}\n")).expect("admins file");
    let mut all = vec!["--admins-file".to_string(), admins.display().to_string()];
    all.extend_from_slice(args);
    let s = server::start_with(
        dir,
        &zk.hosts(),
        &unique_root("ui"),
        daemons,
        "simulate",
        &all,
    );
    (zk, s)
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

/// Logs in through the form; the session cookie (`name=value`).
pub(crate) async fn login(s: &Server, token: &str) -> reqwest::Response {
    login_with(&http(), s, token).await
}

async fn login_with(client: &reqwest::Client, s: &Server, token: &str) -> reqwest::Response {
    client
        .post(format!("{}/ui/login", s.base))
        .header(header::ORIGIN, &s.base)
        .form(&[("token", token)])
        .send()
        .await
        .expect("login")
}

pub(crate) fn cookie_of(res: &reqwest::Response) -> Option<String> {
    let set = res.headers().get(header::SET_COOKIE)?.to_str().ok()?;
    Some(set.split(';').next()?.to_string())
}

pub(crate) async fn page(s: &Server, cookie: &str, path: &str) -> (u16, String) {
    let res = http()
        .get(format!("{}{path}", s.base))
        .header(header::COOKIE, cookie)
        .send()
        .await
        .expect("get");
    (res.status().as_u16(), res.text().await.expect("text"))
}

/// The CSRF token in a page's forms.
pub(crate) fn csrf_in(html: &str) -> String {
    let at = html.find("name=\"csrf\" value=\"").expect("a csrf field") + 19;
    html[at..at + 64].to_string()
}

pub(crate) async fn post(
    s: &Server,
    cookie: &str,
    origin: Option<&str>,
    path: &str,
    form: &[(&str, &str)],
) -> reqwest::Response {
    let mut req = http()
        .post(format!("{}{path}", s.base))
        .header(header::COOKIE, cookie)
        .form(form);
    if let Some(o) = origin {
        req = req.header(header::ORIGIN, o);
    }
    req.send().await.expect("post")
}

async fn head(s: &Server) -> u64 {
    s.get("/status").await["head_position"]
        .as_u64()
        .expect("head")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_sessions_csrf_cookies_logout_and_escaping() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Batches are acquired (their jobs made) but no job is started.
    let (_zk, s) = start(dir.path(), Some(&["job_pending=off"]), &[]);

    // No session: every page sends to the login form.
    let res = http()
        .get(format!("{}/ui/jobs", s.base))
        .send()
        .await
        .expect("get");
    assert_eq!(res.status(), 303);
    assert_eq!(res.headers()[header::LOCATION], "/ui/login");

    // A wrong token: refused without saying more, no cookie.
    let res = login(&s, "not-a-token-0123456789").await;
    assert_eq!(res.status(), 401);
    assert!(res.headers().get(header::SET_COOKIE).is_none());
    assert!(res.text().await.expect("text").contains("Login failed."));
    // A depositor's token is no admin's.
    assert_eq!(login(&s, DEPOSITOR).await.status(), 401);

    // Alice's token: a session cookie with its attributes.
    let res = login(&s, ALICE).await;
    assert_eq!(res.status(), 303);
    let set = res.headers()[header::SET_COOKIE]
        .to_str()
        .expect("ascii")
        .to_string();
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/ui"] {
        assert!(set.contains(attr), "{set}");
    }
    assert!(!set.contains("Secure"), "not configured for https: {set}");
    let cookie = cookie_of(&res).expect("cookie");

    // A batch whose submitter and manifest hold markup.
    let client = ingest_client::Client::new(&s.base, DEPOSITOR).expect("client");
    let input = ingest_protocol::submission::SubmissionInput {
        submitter: Some("<script>alert('s')</script>".into()),
        profile: Some("demo".into()),
        payload_type: Some("object-manifest".into()),
        payload_url: Some("https://example.org/batch.checkm".into()),
        manifest: vec!["https://example.org/1.txt <b>loc</b>".into()],
        ..Default::default()
    };
    let bid = client.submit(&input).await.expect("submitted").bid;
    let jid = eventually("the batch's job", 30, async || {
        let jobs = s.get(&format!("/jobs?batch={bid}")).await;
        jobs["jobs"][0]["jid"].as_str().map(str::to_string)
    })
    .await;

    // Pages carry the security headers.
    let res = http()
        .get(format!("{}/ui", s.base))
        .header(header::COOKIE, &cookie)
        .send()
        .await
        .expect("get");
    assert_eq!(res.status(), 200);
    let h = res.headers();
    let csp = h[header::CONTENT_SECURITY_POLICY].to_str().expect("csp");
    assert!(csp.contains("default-src 'none'") && csp.contains("frame-ancestors 'none'"));
    assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
    assert_eq!(h[header::CACHE_CONTROL], "no-store");
    let overview = res.text().await.expect("text");
    assert!(overview.contains("admin:alice"), "{overview}");
    let csrf = csrf_in(&overview);

    // POSTs without the CSRF token, with another, or from another origin
    // are refused and append nothing.
    let before = head(&s).await;
    let hold = "/ui/collections/demo/hold";
    let wrong = "0".repeat(64);
    for (origin, form) in [
        (Some(s.base.as_str()), vec![("reason", "no token")]),
        (
            Some(s.base.as_str()),
            vec![("csrf", wrong.as_str()), ("reason", "wrong token")],
        ),
        (
            Some("http://evil.example"),
            vec![("csrf", csrf.as_str()), ("reason", "cross-site")],
        ),
        (None, vec![("csrf", csrf.as_str()), ("reason", "no origin")]),
    ] {
        let res = post(&s, &cookie, origin, hold, &form).await;
        assert_eq!(res.status(), 403, "{origin:?} {form:?}");
    }
    assert_eq!(head(&s).await, before, "a refused POST appended");

    // With the token: recorded with alice's name and the reason, which is
    // shown escaped.
    let res = post(
        &s,
        &cookie,
        Some(&s.base),
        hold,
        &[("csrf", &csrf), ("reason", "migration")],
    )
    .await;
    assert_eq!(res.status(), 303);
    assert!(head(&s).await > before);
    let reason = "<script>alert('r')</script> checking";
    let res = post(
        &s,
        &cookie,
        Some(&s.base),
        &format!("/ui/jobs/{jid}/hold"),
        &[("csrf", &csrf), ("reason", reason)],
    )
    .await;
    assert_eq!(res.status(), 303);
    let (_, job) = page(&s, &cookie, &format!("/ui/jobs/{jid}")).await;
    assert!(job.contains("admin:alice"), "{job}");
    assert!(
        job.contains("&lt;script&gt;alert('r')&lt;/script&gt; checking"),
        "{job}"
    );
    let (_, batch) = page(&s, &cookie, &format!("/ui/batches/{bid}")).await;
    for html in [&job, &batch] {
        for raw in ["<script>alert", "<b>loc</b>"] {
            assert!(!html.contains(raw), "{raw} unescaped: {html}");
        }
    }
    assert!(
        batch.contains("&lt;script&gt;alert('s')&lt;/script&gt;"),
        "{batch}"
    );
    let (_, jobs) = page(&s, &cookie, "/ui/jobs?collection=demo").await;
    assert!(jobs.contains("&lt;b&gt;loc&lt;/b&gt;") && !jobs.contains("<b>loc</b>"));
    let (_, collections) = page(&s, &cookie, "/ui/collections").await;
    assert!(collections.contains("Release"), "held: a release button");

    // Logout ends the session on the server, not only in the browser.
    let res = post(&s, &cookie, Some(&s.base), "/ui/logout", &[("csrf", &csrf)]).await;
    assert_eq!(res.status(), 303);
    let cleared = res.headers()[header::SET_COOKIE].to_str().expect("ascii");
    assert!(cleared.contains("Max-Age=0"), "{cleared}");
    let (status, _) = page(&s, &cookie, "/ui").await;
    assert_eq!(status, 303, "the old cookie opens nothing");

    // Failed logins are limited: after ten, even the right token waits.
    for _ in 0..10 {
        login(&s, "not-a-token-0123456789").await;
    }
    assert_eq!(login(&s, ALICE).await.status(), 429);
}

/// A login through the form from the source address `from`.
async fn login_from(s: &Server, from: &str, token: &str) -> reqwest::Response {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .local_address(from.parse::<std::net::IpAddr>().expect("address"))
        .build()
        .expect("client");
    login_with(&client, s, token).await
}

/// Issue 25, finding 4: the failed-login limit was global, so ten wrong
/// logins a minute from anyone locked every admin out (429 for the right
/// token too), and the log named no client. The limit is per client address
/// (and per token tried): the guessing address is throttled, an admin
/// elsewhere logs in, and the log names the address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_logins_throttle_their_client_and_never_another() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_zk, s) = start(dir.path(), None, &[]);
    for i in 0..10 {
        let res = login_from(&s, "127.0.0.2", &format!("not-a-token-{i:012}")).await;
        assert_eq!(res.status(), 401);
    }
    assert_eq!(login_from(&s, "127.0.0.2", ALICE).await.status(), 429);
    let res = login_from(&s, "127.0.0.1", ALICE).await;
    assert_eq!(res.status(), 303, "a correct login from another client");
    assert!(cookie_of(&res).is_some());
    let log = std::fs::read_to_string(&s.log).expect("log");
    assert!(
        log.lines()
            .any(|l| l.contains("login refused") && l.contains("127.0.0.2")),
        "the refusal names the client"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("a login failed") && l.contains("127.0.0.2")),
        "a failure names the client"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_cookie_is_secure_when_configured() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_zk, s) = start(
        dir.path(),
        None,
        &["--ui-secure-cookies".into(), "true".into()],
    );
    let res = login(&s, ADMIN).await;
    assert_eq!(res.status(), 303);
    let set = res.headers()[header::SET_COOKIE].to_str().expect("ascii");
    assert!(set.contains("; Secure"), "{set}");
}

/// chromedriver (and the Chromium it starts) in a process group of their
/// own, killed as a group whatever happens.
struct Driver {
    child: Child,
    url: String,
    _profile: tempfile::TempDir,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let pgid = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-KILL", "--", &pgid]).status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

async fn browser() -> (Driver, Client) {
    use std::os::unix::process::CommandExt;
    let port = free_port();
    let child = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("start chromedriver (Debian package chromium-driver; tools/test installs it)");
    let profile = tempfile::tempdir().expect("tempdir");
    let driver = Driver {
        child,
        url: format!("http://127.0.0.1:{port}"),
        _profile: profile,
    };
    let caps: serde_json::Map<String, Value> = serde_json::from_value(json!({
        "browserName": "chrome",
        "goog:chromeOptions": {
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu",
                "--disable-dev-shm-usage", "--window-size=1400,1000",
                format!("--user-data-dir={}", driver._profile.path().display()),
            ]
        }
    }))
    .expect("caps");
    let client = eventually("chromedriver to take a session", 30, async || {
        ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps.clone())
            .connect(&driver.url)
            .await
            .ok()
    })
    .await;
    (driver, client)
}

/// Clicks `css` and waits until the browser has left the page it was on
/// (its root element gone stale), so what is read next is the new page.
async fn click_through(c: &Client, css: &str) -> Result<(), fantoccini::error::CmdError> {
    let old = c.find(Locator::Css("html")).await?;
    c.find(Locator::Css(css)).await?.click().await?;
    eventually("the next page", 30, async || {
        old.tag_name().await.is_err().then_some(())
    })
    .await;
    c.wait().for_element(Locator::Css("main")).await?;
    Ok(())
}

/// Logs alice in through the login form.
async fn log_in(c: &Client, s: &Server) -> Result<(), fantoccini::error::CmdError> {
    c.goto(&format!("{}/ui/login", s.base)).await?;
    c.find(Locator::Css("#token"))
        .await?
        .send_keys(ALICE)
        .await?;
    click_through(c, "#login").await
}

/// Gives the reason of the action form `action` and sends it.
async fn act(c: &Client, action: &str, reason: &str) -> Result<(), fantoccini::error::CmdError> {
    c.find(Locator::Css(&format!("#reason-{action}")))
        .await?
        .send_keys(reason)
        .await?;
    click_through(c, &format!("#do-{action}")).await
}

async fn text_of(c: &Client, css: &str) -> Option<String> {
    c.find(Locator::Css(css)).await.ok()?.text().await.ok()
}

async fn shot(c: &Client, dir: Option<&PathBuf>, name: &str) {
    if let Some(dir) = dir {
        let png = c.screenshot().await.expect("screenshot");
        std::fs::write(dir.join(format!("{name}.png")), png).expect("write screenshot");
    }
}

/// The scenario of issue 13: a fault fails a job of collection `collx`; an
/// admin logs in, finds it through the filters, requeues it from its page
/// and watches it complete; the history shows who and why. With `shots`,
/// a screenshot of each main page is written there.
async fn requeue_scenario(shots: Option<PathBuf>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_zk, s) = start(dir.path(), Some(&[]), &[]);
    let (_driver, c) = browser().await;
    let result = async {
        let shots = shots.as_ref();
        // Log in.
        c.goto(&format!("{}/ui/login", s.base)).await?;
        shot(&c, shots, "login").await;
        c.find(Locator::Css("#token"))
            .await?
            .send_keys(ALICE)
            .await?;
        click_through(&c, "#login").await?;
        let html = c.source().await?;
        assert!(html.contains("admin:alice"), "{html}");

        // Arm a fault in Downloading through the faults page.
        c.goto(&format!("{}/ui/faults", s.base)).await?;
        c.find(Locator::Css("#fault-state"))
            .await?
            .select_by_value("Downloading")
            .await?;
        c.find(Locator::Css("#fault-reason"))
            .await?
            .send_keys("disk test")
            .await?;
        click_through(&c, "#arm-fault").await?;
        assert!(text_of(&c, "#armed")
            .await
            .unwrap_or_default()
            .contains("Downloading"));
        shot(&c, shots, "faults").await;

        // A batch of collection collx fails; then one of another collection
        // completes.
        let client = ingest_client::Client::new(&s.base, DEPOSITOR).expect("client");
        let submit = async |profile: &str, n: usize| {
            let input = ingest_protocol::submission::SubmissionInput {
                submitter: Some("carol".into()),
                profile: Some(profile.into()),
                payload_type: Some("object-manifest".into()),
                payload_url: Some("https://example.org/batch.checkm".into()),
                manifest: (0..n)
                    .map(|i| format!("https://example.org/{i}.txt {profile}-{i}"))
                    .collect(),
                ..Default::default()
            };
            client.submit(&input).await.expect("submitted").bid
        };
        submit("collx", 1).await;
        let failed = eventually("a failed job", 60, async || {
            let page = s.get("/jobs?state=Failed").await;
            page["jobs"].as_array().and_then(|j| j.first()).cloned()
        })
        .await;
        assert_eq!(failed["profile"], "collx", "{failed}");
        submit("other", 2).await;
        let jid = failed["jid"].as_str().expect("jid").to_string();

        c.goto(&format!("{}/ui", s.base)).await?;
        shot(&c, shots, "overview").await;

        // Find it through the filters.
        c.goto(&format!("{}/ui/jobs", s.base)).await?;
        c.find(Locator::Css("#f-state"))
            .await?
            .select_by_value("Failed")
            .await?;
        c.find(Locator::Css("#f-collection"))
            .await?
            .send_keys("collx")
            .await?;
        click_through(&c, "#filter").await?;
        let rows = c.find_all(Locator::Css("#jobs tbody tr")).await?;
        assert_eq!(rows.len(), 1, "one failed job of collx");
        click_through(&c, "#jobs a.job").await?;
        assert_eq!(text_of(&c, "#job-state").await.as_deref(), Some("Failed"));
        shot(&c, shots, "job").await;

        // Requeue it with a reason; watch it complete.
        act(&c, "requeue", "disk replaced, retry").await?;
        let flash = text_of(&c, ".flash").await.unwrap_or_default();
        assert!(flash.contains("requeue"), "{flash}");
        let job_url = format!("{}/ui/jobs/{jid}", s.base);
        eventually("the requeued job to complete", 60, async || {
            c.goto(&job_url).await.ok()?;
            (text_of(&c, "#job-state").await?.as_str() == "Completed").then_some(())
        })
        .await;
        let html = c.source().await?;
        assert!(html.contains("admin:alice"), "the history names the admin");
        assert!(
            html.contains("disk replaced, retry"),
            "the history has the reason"
        );
        // What the lines above the table say is not in the table again.
        for shown in ["jid", "bid", "status"] {
            assert!(
                !html.contains(&format!("<th>{shown}</th>")),
                "{shown} twice: {html}"
            );
        }
        // No requeue button for a completed job.
        assert!(c.find(Locator::Css("#do-requeue")).await.is_err());
        shot(&c, shots, "job").await;

        if shots.is_some() {
            for (name, path) in [
                ("batches", "/ui/batches".to_string()),
                ("jobs", "/ui/jobs?collection=collx".to_string()),
                ("collections", "/ui/collections".to_string()),
                ("consistency", "/ui/consistency".to_string()),
            ] {
                c.goto(&format!("{}{path}", s.base)).await?;
                shot(&c, shots, name).await;
            }
        }
        Ok::<(), fantoccini::error::CmdError>(())
    }
    .await;
    let _ = c.close().await;
    result.expect("the browser scenario");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_requeues_a_failed_job_in_the_browser() {
    requeue_scenario(None).await;
}

/// Writes the screenshots of `docs/screenshots/` (ignored by default):
/// `INGEST_ZK_TOOL=$PWD/tools/zk cargo nextest run -p ingest --test
/// integration ui::screenshots --run-ignored only`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes docs/screenshots/*.png"]
async fn screenshots() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/screenshots");
    std::fs::create_dir_all(&dir).expect("mkdir");
    requeue_scenario(Some(dir.clone())).await;
    batch_scenario(Some(dir)).await;
}

/// Types `q` into the search box of the page the browser is on and sends it.
async fn search_for(c: &Client, q: &str) -> Result<(), fantoccini::error::CmdError> {
    c.find(Locator::Css("#search")).await?.send_keys(q).await?;
    click_through(c, "#search-go").await
}

/// The labels of the action buttons in `css`.
async fn buttons(c: &Client, css: &str) -> Result<Vec<String>, fantoccini::error::CmdError> {
    let mut labels = Vec::new();
    for b in c.find_all(Locator::Css(css)).await? {
        labels.push(b.text().await?);
    }
    Ok(labels)
}

/// The scenario of issue 26: a batch of two jobs (local ids `lid-a`,
/// `lid-b`) fails because a fault fails one of them. An operator finds the
/// batch, a job and a local id with the search box of the header; the
/// batch page puts the failure first and offers exactly what the engine
/// allows for a Failed batch; "Requeue failed jobs" requeues the failed
/// job, which completes, and "Update report" makes the batch Completed.
/// An access request is found by its id and by its ark. With `shots`, the
/// batch page, a search's list and the access request page are written
/// there.
async fn batch_scenario(shots: Option<PathBuf>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_zk, s) = start(dir.path(), Some(&[]), &[]);
    let (_driver, c) = browser().await;
    let result = async {
        let shots = shots.as_ref();
        let (status, armed) = s
            .call(
                reqwest::Method::POST,
                "/faults",
                ADMIN,
                Some(json!({"state": "Downloading", "count": 1, "reason": "disk test"})),
            )
            .await;
        assert_eq!(status, 201, "{armed}");
        let client = ingest_client::Client::new(&s.base, DEPOSITOR).expect("client");
        let submit = async |profile: &str, lines: &[&str]| {
            let input = ingest_protocol::submission::SubmissionInput {
                submitter: Some("carol".into()),
                profile: Some(profile.into()),
                payload_type: Some("object-manifest".into()),
                payload_url: Some("https://example.org/batch.checkm".into()),
                manifest: lines.iter().map(|l| l.to_string()).collect(),
                ..Default::default()
            };
            client.submit(&input).await.expect("submitted").bid
        };
        let bid = submit(
            "colly",
            &[
                "https://example.org/a.txt lid-a",
                "https://example.org/b.txt lid-b",
            ],
        )
        .await;
        eventually("the batch to fail", 60, async || {
            (s.get(&format!("/batches/{bid}")).await["status"] == "Failed").then_some(())
        })
        .await;
        let jobs = s.get(&format!("/jobs?batch={bid}")).await;
        let jobs = jobs["jobs"].as_array().expect("jobs").clone();
        let failed = jobs
            .iter()
            .find(|j| j["status"] == "Failed")
            .expect("a failed job");
        let failed_jid = failed["jid"].as_str().expect("jid").to_string();
        let other = jobs
            .iter()
            .find(|j| j["status"] == "Completed")
            .expect("a completed job");
        let other_jid = other["jid"].as_str().expect("jid").to_string();
        let other_lid = other["local_ids"][0].as_str().expect("lid").to_string();
        // A second batch shares the local id lid-a, in another collection.
        let second = submit("colly2", &["https://example.org/c.txt lid-a"]).await;
        eventually("the second batch to complete", 60, async || {
            (s.get(&format!("/batches/{second}")).await["status"] == "Completed").then_some(())
        })
        .await;

        log_in(&c, &s).await?;

        // The header's search box finds the batch by its id.
        search_for(&c, &bid).await?;
        let url = c.current_url().await?;
        assert_eq!(url.path(), format!("/ui/batches/{bid}"));
        assert_eq!(text_of(&c, "#batch-state").await.as_deref(), Some("Failed"));

        // The failure comes first: before the actions, the counts and the jobs.
        let html = c.source().await?;
        let at = |id: &str| {
            html.find(&format!("id=\"{id}\""))
                .unwrap_or_else(|| panic!("no #{id} on the batch page"))
        };
        assert!(at("batch-failure") < at("batch-actions"));
        assert!(at("batch-actions") < at("batch-counts"));
        assert!(at("batch-counts") < at("batch-jobs"));
        assert!(at("batch-jobs") < at("timeline"));
        let failure = text_of(&c, "#batch-failure").await.unwrap_or_default();
        assert!(failure.contains(&failed_jid), "{failure}");
        assert!(
            failure.contains("disk test"),
            "the fault's reason: {failure}"
        );
        assert!(
            !failure.contains(&other_jid),
            "only the failed job: {failure}"
        );
        // Nothing of the batch twice: each job once in the jobs table, the
        // failed one once more only in the failure.
        assert_eq!(html.matches(&format!(">{other_jid}<")).count(), 1, "{html}");
        assert_eq!(
            html.matches(&format!(">{failed_jid}<")).count(),
            2,
            "{html}"
        );
        // Exactly what the engine takes for a Failed batch whose failed
        // job can be requeued: no release (it is not Held).
        assert_eq!(
            buttons(&c, "#batch-actions button").await?,
            ["Requeue failed jobs", "Update report", "Delete"]
        );
        // Ids and states do not wrap.
        for css in [
            "#batch-jobs td.id",
            "#batch-jobs td.state",
            "#batch-jobs th",
        ] {
            let cell = c.find(Locator::Css(css)).await?;
            assert_eq!(cell.css_value("white-space").await?, "nowrap", "{css}");
        }
        shot(&c, shots, "batch").await;

        // Requeue the failed job from the batch page; it completes.
        act(&c, "requeue-failed", "disk replaced").await?;
        let flash = text_of(&c, ".flash").await.unwrap_or_default();
        assert!(flash.contains("requeued 1 failed job"), "{flash}");
        eventually("the requeued job to complete", 60, async || {
            (s.get(&format!("/jobs/{failed_jid}")).await["status"] == "Completed").then_some(())
        })
        .await;
        // Still Failed until reported again: the page offers the update.
        c.goto(&format!("{}/ui/batches/{bid}", s.base)).await?;
        assert_eq!(
            buttons(&c, "#batch-actions button").await?,
            ["Update report", "Delete"]
        );
        act(&c, "update-reporting", "the job completed").await?;
        let batch_url = format!("{}/ui/batches/{bid}", s.base);
        eventually("the batch to be reported Completed", 60, async || {
            c.goto(&batch_url).await.ok()?;
            (text_of(&c, "#batch-state").await?.as_str() == "Completed").then_some(())
        })
        .await;
        assert!(
            c.find(Locator::Css("#batch-failure")).await.is_err(),
            "no failure left"
        );

        // A job by its id, and by its local id when one job has it.
        search_for(&c, &failed_jid).await?;
        assert_eq!(
            c.current_url().await?.path(),
            format!("/ui/jobs/{failed_jid}")
        );
        search_for(&c, &other_lid).await?;
        let lid_jid = if other_lid == "lid-a" {
            None
        } else {
            Some(&other_jid)
        };
        match lid_jid {
            Some(jid) => {
                assert_eq!(c.current_url().await?.path(), format!("/ui/jobs/{jid}"));
            }
            None => {
                assert_eq!(c.current_url().await?.path(), "/ui/search");
            }
        }
        // A local id two jobs share lists both.
        search_for(&c, "lid-a").await?;
        assert_eq!(c.current_url().await?.path(), "/ui/search");
        let hits = c.find_all(Locator::Css("#search-hits tbody tr")).await?;
        assert_eq!(hits.len(), 2);
        shot(&c, shots, "search").await;
        // An access request by its id, and its ark.
        let (code, answer) = s
            .call(
                reqwest::Method::POST,
                "/access",
                DEPOSITOR,
                Some(json!({"ark": "ark:/99999/fk4uiaccess"})),
            )
            .await;
        assert_eq!(code, 201, "{answer}");
        let qid = answer["request"]["qid"].as_str().expect("qid").to_string();
        search_for(&c, &qid).await?;
        assert_eq!(c.current_url().await?.path(), format!("/ui/access/{qid}"));
        assert!(text_of(&c, "#access-state").await.is_some());
        shot(&c, shots, "access").await;
        search_for(&c, "ark:/99999/fk4uiaccess").await?;
        assert_eq!(c.current_url().await?.path(), format!("/ui/access/{qid}"));
        // Nothing found says what was searched.
        search_for(&c, "no-such-thing-42").await?;
        let none = text_of(&c, "#search-none").await.unwrap_or_default();
        assert!(
            none.contains("no-such-thing-42") && none.contains("local id"),
            "{none}"
        );
        Ok::<(), fantoccini::error::CmdError>(())
    }
    .await;
    let _ = c.close().await;
    result.expect("the browser scenario");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_finds_a_failed_batch_and_acts_on_it_in_the_browser() {
    batch_scenario(None).await;
}

/// Issue 26 (D1 through the UI): a batch submitted to a held collection is
/// Held; its page says why and offers the collection's release (a Held
/// batch of a held collection cannot be released alone), nothing else of
/// a release; releasing from the batch page gets the batch acquired and
/// walked to Completed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_batch_is_released_from_its_page_and_acquired() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_zk, s) = start(dir.path(), Some(&[]), &[]);
    let (status, body) = s
        .call(
            reqwest::Method::POST,
            "/collections/demo/hold",
            ADMIN,
            Some(json!({"reason": "storage migration"})),
        )
        .await;
    assert!(status < 300, "{body}");
    let bid = s.submit(2).await;
    eventually("the batch to be Held", 60, async || {
        (s.get(&format!("/batches/{bid}")).await["status"] == "Held").then_some(())
    })
    .await;
    let (_driver, c) = browser().await;
    let result = async {
        log_in(&c, &s).await?;
        c.goto(&format!("{}/ui/batches/{bid}", s.base)).await?;
        assert_eq!(text_of(&c, "#batch-state").await.as_deref(), Some("Held"));
        let why = text_of(&c, "#held-by").await.unwrap_or_default();
        assert!(why.contains("demo"), "{why}");
        let offered = buttons(&c, "#batch-actions button").await?;
        assert!(
            offered.contains(&"Release the collection".to_string()),
            "{offered:?}"
        );
        assert!(!offered.contains(&"Release".to_string()), "{offered:?}");
        act(&c, "release-collection", "migration done").await?;
        let flash = text_of(&c, ".flash").await.unwrap_or_default();
        assert!(flash.contains("release the collection"), "{flash}");
        eventually(
            "the released batch to be acquired and completed",
            60,
            async || {
                (s.get(&format!("/batches/{bid}")).await["status"] == "Completed").then_some(())
            },
        )
        .await;
        c.goto(&format!("{}/ui/batches/{bid}", s.base)).await?;
        assert!(c.find(Locator::Css("#held-by")).await.is_err());
        Ok::<(), fantoccini::error::CmdError>(())
    }
    .await;
    let _ = c.close().await;
    result.expect("the browser scenario");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_waiting_in_provisioning_says_why_on_its_page() {
    let dir = tempfile::tempdir().expect("tempdir");
    // No provisioning daemon: jobs stop in Provisioning.
    let (_zk, s) = start(dir.path(), Some(&["provisioning=off"]), &[]);
    let bid = s.submit(1).await;
    let jid = eventually("the job to reach Provisioning", 60, async || {
        let jobs = s
            .get(&format!("/jobs?batch={bid}&state=Provisioning"))
            .await;
        jobs["jobs"][0]["jid"].as_str().map(str::to_string)
    })
    .await;
    let cookie = cookie_of(&login(&s, ALICE).await).expect("cookie");
    let (status, html) = page(&s, &cookie, &format!("/ui/jobs/{jid}")).await;
    assert_eq!(status, 200);
    let at = html
        .find("id=\"job-waiting\"")
        .unwrap_or_else(|| panic!("{html}"));
    assert!(html[at..].contains("Waiting for working storage"), "{html}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_table_has_headers_and_the_search_refuses_what_no_id_is() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_zk, s) = start(dir.path(), Some(&["job_pending=off"]), &[]);
    s.submit(2).await;
    let cookie = cookie_of(&login(&s, ALICE).await).expect("cookie");
    for path in [
        "/ui",
        "/ui/batches",
        "/ui/jobs",
        "/ui/collections",
        "/ui/consistency",
        "/ui/faults",
    ] {
        let (status, html) = page(&s, &cookie, path).await;
        assert_eq!(status, 200, "{path}");
        assert!(html.contains("id=\"search\""), "{path}: the search box");
        // Every table of a page has a header row (key/value tables have a
        // header cell per row).
        for table in html.split("<table").skip(1) {
            let table = &table[..table.find("</table>").expect("closed")];
            assert!(
                table.contains("<thead>") || table.contains("class=\"kv\""),
                "{path}: a table without headers: {table}"
            );
        }
    }
    let long = "x".repeat(300);
    let (status, html) = page(&s, &cookie, &format!("/ui/search?q={long}")).await;
    assert_eq!(status, 400);
    assert!(
        html.contains("longer than 256 bytes") && !html.contains(&long),
        "{html}"
    );
}
