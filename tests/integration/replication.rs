//! Replicated engines (issue 22) against a real ZooKeeper ensemble of three
//! on loopback and three real `ingest serve --replicas 3` processes:
//!
//! - the leader killed (SIGKILL) under a stream of submissions, twice, the
//!   second time with its data directory deleted: every acknowledged
//!   submission is on every engine afterwards, writes resume on a new
//!   leader, the wiped engine rejoins (from a peer or the whole tail), and
//!   every engine ends at the same position with the same head hash;
//! - the leader paused (SIGSTOP) past its session timeout: another engine
//!   takes over; resumed, the old leader appends nothing more and sends its
//!   clients to the new leader;
//! - one of three ZooKeeper servers stopped: writes go on; two of three:
//!   writes are refused with 503 `no_quorum`, nothing acknowledged is lost,
//!   and writes resume when they return;
//! - a busy follower's requests, counted by `tools/zk-op-count`: it reads
//!   the election only when it changes.

use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::server::{ADMIN, DEPOSITOR};
use crate::util::ingest_bin;
use crate::zk_server::{run_tool, spawn_watchdog_for};

/// How long a test waits for a condition before it fails (never a sleep).
const DEADLINE: Duration = Duration::from_secs(90);

/// A ZooKeeper ensemble of three on loopback (`tools/zk ensemble`), stopped
/// when dropped or, if the test process dies, by its watchdog.
struct Ensemble {
    dir: PathBuf,
    hosts: String,
    _watchdog: Option<(Child, ChildStdin)>,
}

impl Ensemble {
    fn start(name: &str) -> Ensemble {
        let dir = std::env::temp_dir().join(format!("ingest-ens-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let watchdog = spawn_watchdog_for(&dir, "ensemble stop");
        let d = dir.to_string_lossy().into_owned();
        run_tool(&["ensemble", "start", "--dir", &d]).unwrap_or_else(|e| panic!("{e}"));
        let hosts = run_tool(&["ensemble", "hosts", "--dir", &d])
            .unwrap_or_else(|e| panic!("{e}"))
            .trim()
            .to_string();
        Ensemble {
            dir,
            hosts,
            _watchdog: watchdog,
        }
    }

    fn member(&self, n: usize) -> String {
        self.dir
            .join(format!("member-{n}"))
            .to_string_lossy()
            .into_owned()
    }

    fn stop_member(&self, n: usize) {
        run_tool(&["stop", "--dir", &self.member(n), "--grace", "5"])
            .unwrap_or_else(|e| panic!("{e}"));
    }

    fn restart_member(&self, n: usize) {
        run_tool(&["restart", "--dir", &self.member(n)]).unwrap_or_else(|e| panic!("{e}"));
    }
}

impl Drop for Ensemble {
    fn drop(&mut self) {
        let _ = run_tool(&["ensemble", "stop", "--dir", &self.dir.to_string_lossy()]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One `ingest serve --replicas 3` process.
struct Engine {
    name: String,
    data: PathBuf,
    dir: PathBuf,
    listen: String,
    child: Option<Child>,
    base: String,
    /// Further `serve` arguments.
    extra: Vec<String>,
}

impl Engine {
    fn start(dir: &Path, name: &str, hosts: &str, root: &str) -> Engine {
        Engine::start_with(dir, name, hosts, root, &[])
    }

    fn start_with(dir: &Path, name: &str, hosts: &str, root: &str, extra: &[String]) -> Engine {
        // A fixed port per engine, so a restarted engine keeps its URL.
        let port = run_tool(&["free-port"]).unwrap_or_else(|e| panic!("{e}"));
        let mut e = Engine {
            name: name.to_string(),
            data: dir.join(name).join("data"),
            dir: dir.join(name),
            listen: format!("127.0.0.1:{}", port.trim()),
            child: None,
            base: String::new(),
            extra: extra.to_vec(),
        };
        e.launch(hosts, root);
        e
    }

    fn launch(&mut self, hosts: &str, root: &str) {
        std::fs::create_dir_all(&self.dir).expect("engine dir");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("serve.log"))
            .expect("log");
        let mut child = Command::new(ingest_bin())
            .arg("--data-dir")
            .arg(&self.data)
            .args([
                "serve",
                "--listen",
                &self.listen,
                "--zk",
                hosts,
                "--zk-root",
                root,
                "--zk-session-timeout",
                "2",
                "--replicas",
                "3",
                "--engine-id",
                &self.name,
                "--working-storage",
            ])
            .arg(self.dir.join("work"))
            .args(&self.extra)
            .env("INGEST_ADMIN_TOKEN", ADMIN)
            .env("INGEST_DEPOSITOR_TOKEN", DEPOSITOR)
            .env("INGEST_WORKER_TOKEN", crate::server::WORKER)
            .env("RUST_LOG", "info")
            .env_remove("INGEST_DATA_DIR")
            .env_remove("INGEST_CONFIG")
            .env_remove("INGEST_WORKER_STEPS")
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("start ingest serve");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)
            .expect("read the listening line");
        self.base = line
            .trim()
            .strip_prefix("ingest serve listening on ")
            .unwrap_or_else(|| panic!("{}: unexpected first line {line:?}", self.name))
            .to_string();
        self.child = Some(child);
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let ok = Command::new("kill")
            .args([sig, &pid])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill {sig} {pid}");
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("serve.log")).unwrap_or_default()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = Command::new("kill")
                .args(["-CONT", &c.id().to_string()])
                .status();
        }
        self.kill();
        if std::thread::panicking() {
            // The answers to the test's own polling would fill the tail.
            let log = self.log();
            let tail: String = log
                .lines()
                .filter(|l| !l.contains("answered status=2"))
                .rev()
                .take(60)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n");
            eprintln!("--- {} serve.log (tail) ---\n{tail}", self.name);
        }
    }
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client")
}

async fn replication(http: &reqwest::Client, base: &str) -> Option<Value> {
    let r = http
        .get(format!("{base}/replication"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .ok()?;
    r.json().await.ok()
}

/// Waits until exactly one live engine leads; returns its index.
async fn leader(http: &reqwest::Client, engines: &[&Engine]) -> usize {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let mut leaders = Vec::new();
        for (i, e) in engines.iter().enumerate() {
            if e.child.is_none() {
                continue;
            }
            if let Some(s) = replication(http, &e.base).await {
                if s["role"] == "leader" {
                    leaders.push(i);
                }
            }
        }
        if leaders.len() == 1 {
            return leaders[0];
        }
        assert!(Instant::now() < deadline, "no single leader: {leaders:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the engine at `base` follows the leader at `leader_base`
/// (a follower learns the leader from ZooKeeper a moment after the leader
/// advertises itself).
async fn follows(http: &reqwest::Client, base: &str, leader_base: &str) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(s) = replication(http, base).await {
            if s["role"] == "follower" && s["leader_url"] == leader_base {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{base} never followed {leader_base}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Logs in to the admin UI of the engine at `base` and reads its overview
/// until `shows` holds for it.
async fn ui_overview_until(base: &str, shows: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let page = ui_overview(base).await;
        if shows(&page) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{base}/ui never showed it: {page}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The admin UI's overview of the engine at `base`, after logging in.
async fn ui_overview(base: &str) -> String {
    ui_session(&http(), base).await.1
}

/// Logs in to the admin UI at `base` as the shared admin: the session
/// cookie and the overview page.
async fn ui_session(http: &reqwest::Client, base: &str) -> (String, String) {
    let login = http
        .post(format!("{base}/ui/login"))
        .header(reqwest::header::ORIGIN, base)
        .form(&[("token", ADMIN)])
        .send()
        .await
        .expect("login");
    let cookie = crate::ui::cookie_of(&login).expect("a session cookie");
    let page = http
        .get(format!("{base}/ui"))
        .header(reqwest::header::COOKIE, &cookie)
        .send()
        .await
        .expect("overview");
    assert_eq!(page.status().as_u16(), 200);
    (cookie, page.text().await.expect("text"))
}

/// [`submission`] as the typed client sends it.
fn submission_input(n: usize) -> ingest_protocol::submission::SubmissionInput {
    serde_json::from_value(submission(n)).expect("a submission")
}

fn submission(n: usize) -> Value {
    json!({
        "submitter": "alice",
        "profile": "demo",
        "type": "object-manifest",
        "payload_url": format!("https://example.org/batch-{n}.checkm"),
        "manifest": [format!("https://example.org/a-{n}.checkm loc{n}")],
        "erc_what": format!("Object {n}"),
    })
}

/// One submission to `base`: the bid when it was acknowledged (201), the
/// status otherwise (a redirect is not followed here).
async fn submit_once(http: &reqwest::Client, base: &str, n: usize) -> Result<String, u16> {
    let r = http
        .post(format!("{base}/batches"))
        .bearer_auth(DEPOSITOR)
        .json(&submission(n))
        .send()
        .await
        .map_err(|_| 0u16)?;
    let status = r.status().as_u16();
    if status != 201 {
        return Err(status);
    }
    let v: Value = r.json().await.map_err(|_| 1u16)?;
    Ok(v["bid"].as_str().expect("bid").to_string())
}

/// Waits until every live engine applied the same position with the same
/// head hash; returns it.
async fn converged(http: &reqwest::Client, engines: &[&Engine]) -> (u64, String) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let mut seen = Vec::new();
        for e in engines.iter().filter(|e| e.child.is_some()) {
            let s = replication(http, &e.base).await.unwrap_or(Value::Null);
            seen.push((
                s["applied"].as_u64().unwrap_or(0),
                s["head_hash"].as_str().unwrap_or("").to_string(),
                s["role"].clone(),
            ));
        }
        if !seen.is_empty()
            && seen.iter().all(|s| s.0 == seen[0].0 && s.1 == seen[0].1)
            && seen.iter().all(|s| s.2 == "leader" || s.2 == "follower")
        {
            return (seen[0].0, seen[0].1.clone());
        }
        assert!(
            Instant::now() < deadline,
            "engines did not converge: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every acknowledged bid is readable on every live engine (reads are
/// served by followers too).
async fn all_present(http: &reqwest::Client, engines: &[&Engine], acked: &[String]) {
    for e in engines.iter().filter(|e| e.child.is_some()) {
        for bid in acked {
            let r = http
                .get(format!("{}/batches/{bid}", e.base))
                .bearer_auth(ADMIN)
                .send()
                .await
                .expect("read a batch");
            assert_eq!(r.status().as_u16(), 200, "{bid} missing on {}", e.name);
        }
    }
}

fn three(dir: &Path, ens: &Ensemble, root: &str) -> Vec<Engine> {
    (1..=3)
        .map(|i| Engine::start(dir, &format!("e{i}"), &ens.hosts, root))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kills_lose_no_acknowledged_command_and_replicas_converge() {
    let ens = Ensemble::start("kill");
    let tmp = tempfile::tempdir().expect("tmp");
    let root = "/ingest-repl-kill";
    let mut engines = three(tmp.path(), &ens, root);
    let http = http();
    let all = || engines.iter().collect::<Vec<_>>();
    let mut acked: Vec<String> = Vec::new();
    let mut n = 0;

    // A follower sends a command to the leader.
    let l = leader(&http, &all()).await;
    let follower = (l + 1) % 3;
    follows(&http, &engines[follower].base, &engines[l].base).await;
    let r = http
        .post(format!("{}/batches", engines[follower].base))
        .bearer_auth(DEPOSITOR)
        .json(&submission(0))
        .send()
        .await
        .expect("post");
    assert_eq!(r.status().as_u16(), 307);
    assert_eq!(
        r.headers()[reqwest::header::LOCATION].to_str().unwrap(),
        format!("{}/batches", engines[l].base)
    );

    // Without a valid token a follower does not say where the leader is.
    for token in [None, Some("not-a-token-of-this-group-0123456789")] {
        let mut request = http
            .post(format!("{}/batches", engines[follower].base))
            .json(&submission(0));
        if let Some(t) = token {
            request = request.bearer_auth(t);
        }
        let r = request.send().await.expect("post");
        assert_eq!(r.status().as_u16(), 401, "token {token:?}");
        assert!(r.headers().get(reqwest::header::LOCATION).is_none());
        let body = r.text().await.expect("body");
        assert!(!body.contains(&engines[l].base), "{body}");
    }

    // The admin UI of each says what it is; the leader lists its replicas.
    // (The leader learns its replicas at its next upkeep.)
    ui_overview_until(&engines[l].base, |page| {
        page.contains(r#"id="replica-role" class="state good">leader<"#)
            && page.contains(r#"id="replicas""#)
    })
    .await;
    let to_leader = format!(r#"href="{}/ui""#, engines[l].base);
    ui_overview_until(&engines[follower].base, |page| {
        page.contains(r#"id="replica-role" class="state good">follower<"#)
            && page.contains(&to_leader)
    })
    .await;

    // The typed client, given every engine, finds the leader by itself.
    let bases = engines
        .iter()
        .map(|e| e.base.clone())
        .collect::<Vec<_>>()
        .join(",");
    let client = ingest_client::Client::new(&bases, DEPOSITOR).expect("client");
    for _ in 0..5 {
        n += 1;
        let s = client
            .submit(&submission_input(n))
            .await
            .expect("submit through any engine");
        acked.push(s.bid.to_string());
    }

    // The leader stores the tail compressed and counts both sizes (its
    // upkeep publishes them); the followers read the compressed nodes back
    // (they converge below).
    let deadline = Instant::now() + DEADLINE;
    let (frame, stored) = loop {
        let s = replication(&http, &engines[l].base)
            .await
            .unwrap_or(Value::Null);
        let frame = s["tail_frame_bytes"].as_u64().unwrap_or(0);
        if frame > 0 {
            break (frame, s["tail_stored_bytes"].as_u64().unwrap_or(0));
        }
        assert!(Instant::now() < deadline, "no tail bytes counted: {s}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        stored > 0 && stored < frame,
        "stored {stored} bytes of {frame}"
    );

    for round in 0..2 {
        let l = leader(&http, &engines.iter().collect::<Vec<_>>()).await;
        // Load while the leader dies: every engine is tried, in turn.
        for _ in 0..10 {
            n += 1;
            if let Ok(bid) = submit_once(&http, &engines[l].base, n).await {
                acked.push(bid);
            }
        }
        engines[l].kill();
        if round == 1 {
            // The disk is lost too: the engine rejoins by copying from a peer.
            std::fs::remove_dir_all(&engines[l].data).expect("wipe the data directory");
        }
        // Writes resume on a new leader.
        let deadline = Instant::now() + DEADLINE;
        let resumed = loop {
            n += 1;
            let mut got = None;
            for e in engines.iter().filter(|e| e.child.is_some()) {
                if let Ok(bid) = submit_once(&http, &e.base, n).await {
                    got = Some(bid);
                    break;
                }
            }
            if let Some(bid) = got {
                break bid;
            }
            assert!(
                Instant::now() < deadline,
                "no engine took writes after the leader died"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        acked.push(resumed);
        let hosts = ens.hosts.clone();
        engines[l].launch(&hosts, root);
        for _ in 0..5 {
            n += 1;
            let s = client
                .submit(&submission_input(n))
                .await
                .expect("submit after failover");
            acked.push(s.bid.to_string());
        }
        let (position, _) = converged(&http, &engines.iter().collect::<Vec<_>>()).await;
        assert!(position >= acked.len() as u64);
        all_present(&http, &engines.iter().collect::<Vec<_>>(), &acked).await;
    }
    // The wiped engine came back with an empty log: it copied from a peer
    // when the tail was already trimmed past its head, or applied the whole
    // tail when it was not (followers publish their position every 250 ms,
    // so a short run may not have trimmed yet); either way it converged
    // above and holds every acknowledged batch. The copy itself is tested by
    // `a_follower_left_too_far_behind_is_dropped_and_rejoins_by_copying`.
    // Every engine's own log verifies.
    for e in &engines {
        let r = http
            .get(format!("{}/verify", e.base))
            .bearer_auth(ADMIN)
            .send()
            .await
            .expect("verify");
        assert_eq!(r.status().as_u16(), 200, "{}", e.name);
        let v: Value = r.json().await.expect("json");
        assert_eq!(
            v["problems"].as_array().map(Vec::len),
            Some(0),
            "{}: {v}",
            e.name
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leader_appends_nothing_more_and_steps_down() {
    let ens = Ensemble::start("pause");
    let tmp = tempfile::tempdir().expect("tmp");
    let engines = three(tmp.path(), &ens, "/ingest-repl-pause");
    let http = http();
    let all: Vec<&Engine> = engines.iter().collect();
    let old = leader(&http, &all).await;
    let mut acked = vec![submit_once(&http, &engines[old].base, 1)
        .await
        .expect("first")];
    engines[old].signal("-STOP");
    // Another engine takes over once the paused one's session expires.
    let others: Vec<&Engine> = engines
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != old)
        .map(|(_, e)| e)
        .collect();
    let new = leader(&http, &others).await;
    acked.push(
        submit_once(&http, &others[new].base, 2)
            .await
            .expect("written on the new leader"),
    );
    engines[old].signal("-CONT");
    // Resumed, the old leader acknowledges nothing: it sends its clients on.
    let deadline = Instant::now() + DEADLINE;
    loop {
        match submit_once(&http, &engines[old].base, 3).await {
            Ok(bid) => panic!("the deposed leader acknowledged {bid}"),
            Err(307) => break,
            Err(_) => {}
        }
        assert!(Instant::now() < deadline, "the old leader never redirected");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let s = replication(&http, &engines[old].base)
        .await
        .expect("status");
    assert_eq!(s["role"], "follower", "{s}");
    assert_eq!(s["leader_url"].as_str(), Some(others[new].base.as_str()));
    converged(&http, &all).await;
    all_present(&http, &all, &acked).await;
    assert!(
        engines[old].log().contains("stopped leading"),
        "the old leader says it stepped down"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_zookeeper_quorum_writes_are_refused_and_nothing_is_lost() {
    let ens = Ensemble::start("quorum");
    let tmp = tempfile::tempdir().expect("tmp");
    // Every engine can sign checkpoints (whichever leads does).
    let (key, public) = crate::audit::generate_key(&tmp.path().join("signing"), "engine");
    let extra = vec![
        "--checkpoint-key".to_string(),
        key.to_string_lossy().into_owned(),
        "--checkpoint-every-events".to_string(),
        "3".to_string(),
    ];
    let engines: Vec<Engine> = (1..=3)
        .map(|i| {
            Engine::start_with(
                tmp.path(),
                &format!("e{i}"),
                &ens.hosts,
                "/ingest-repl-quorum",
                &extra,
            )
        })
        .collect();
    let http = http();
    let all: Vec<&Engine> = engines.iter().collect();
    let bases = engines
        .iter()
        .map(|e| e.base.clone())
        .collect::<Vec<_>>()
        .join(",");
    let client = ingest_client::Client::new(&bases, DEPOSITOR).expect("client");
    leader(&http, &all).await;
    let mut acked = Vec::new();
    acked.push(
        client
            .submit(&submission_input(1))
            .await
            .expect("before")
            .bid
            .to_string(),
    );
    for n in 10..16 {
        acked.push(
            client
                .submit(&submission_input(n))
                .await
                .expect("more")
                .bid
                .to_string(),
        );
    }
    // Evidence from a follower while the leader takes load: an audit bundle
    // and a consistency proof, checked by the independent verifier.
    let l = leader(&http, &all).await;
    let follower = &engines[(l + 1) % 3];
    converged(&http, &all).await;
    let checkpoints: Value = http
        .get(format!("{}/history?actor=engine", follower.base))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("history")
        .json()
        .await
        .expect("json");
    let at: Vec<u64> = checkpoints["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|r| r["event"] == "LogCheckpointed")
        .filter_map(|r| r["position"].as_u64())
        .collect();
    assert!(at.len() >= 2, "signed checkpoints: {checkpoints}");
    for (route, file) in [
        (format!("/audit/bundle?batch={}", acked[0]), "bundle.json"),
        (
            format!("/audit/proof?from={}&to={}", at[0], at[at.len() - 1]),
            "proof.json",
        ),
    ] {
        let r = http
            .get(format!("{}{route}", follower.base))
            .bearer_auth(ADMIN)
            .send()
            .await
            .expect("evidence");
        assert_eq!(r.status().as_u16(), 200, "{route} from a follower");
        let path = tmp.path().join(file);
        std::fs::write(&path, r.bytes().await.expect("body")).expect("write");
        crate::audit::python_verify(&path, Some(&public)).ok();
    }
    // One of three away: the quorum holds, writes go on.
    ens.stop_member(1);
    for n in 2..5 {
        acked.push(
            client
                .submit(&submission_input(n))
                .await
                .expect("with two of three")
                .bid
                .to_string(),
        );
    }
    // Two of three away: no engine can acknowledge anything.
    ens.stop_member(2);
    let deadline = Instant::now() + DEADLINE;
    loop {
        let mut codes = Vec::new();
        for e in &engines {
            let r = http
                .post(format!("{}/batches", e.base))
                .bearer_auth(DEPOSITOR)
                .json(&submission(99))
                .send()
                .await
                .expect("post");
            let status = r.status().as_u16();
            assert_ne!(status, 201, "a write was acknowledged without a quorum");
            let v: Value = r.json().await.unwrap_or(Value::Null);
            codes.push(v["error"]["code"].as_str().unwrap_or("").to_string());
        }
        if codes.iter().all(|c| c == "no_quorum") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not every engine said no_quorum: {codes:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The quorum returns: writes resume, nothing acknowledged was lost.
    ens.restart_member(1);
    ens.restart_member(2);
    let deadline = Instant::now() + DEADLINE;
    let bid = loop {
        match client.submit(&submission_input(5)).await {
            Ok(s) => break s.bid.to_string(),
            Err(e) => assert!(Instant::now() < deadline, "writes did not resume: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    acked.push(bid);
    converged(&http, &all).await;
    all_present(&http, &all, &acked).await;
}

/// A follower further behind than `--max-replica-lag-events` is dropped
/// from the set that holds the tail (the leader says so at ERROR), and when
/// it comes back it sees it was dropped, says so at ERROR, copies the log
/// from a peer and follows again at the same head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_left_too_far_behind_is_dropped_and_rejoins_by_copying() {
    let ens = Ensemble::start("lag");
    let tmp = tempfile::tempdir().expect("tmp");
    let extra = vec!["--max-replica-lag-events".to_string(), "5".to_string()];
    let engines: Vec<Engine> = (1..=3)
        .map(|i| {
            Engine::start_with(
                tmp.path(),
                &format!("e{i}"),
                &ens.hosts,
                "/ingest-repl-lag",
                &extra,
            )
        })
        .collect();
    let http = http();
    let all: Vec<&Engine> = engines.iter().collect();
    let l = leader(&http, &all).await;
    let lagging = (l + 1) % 3;
    engines[lagging].signal("-STOP");
    let mut acked = Vec::new();
    for n in 0..20 {
        acked.push(
            submit_once(&http, &engines[l].base, n)
                .await
                .expect("write"),
        );
    }
    // The leader drops it.
    let deadline = Instant::now() + DEADLINE;
    loop {
        let s = replication(&http, &engines[l].base)
            .await
            .unwrap_or(Value::Null);
        let dropped = s["replicas"].as_array().is_some_and(|r| {
            r.iter()
                .any(|r| r["id"] == engines[lagging].name.as_str() && r["dropped"] == true)
        });
        if dropped {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the lagging follower was never dropped: {s}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(engines[l]
        .log()
        .contains("was dropped from the set that holds the tail"));
    // Still stopped, its ZooKeeper session expires (its candidacy goes):
    // when it resumes, only its registration tells it it was dropped.
    let zk = zookeeper_client::Client::connect(&format!("{}/ingest-repl-lag", ens.hosts))
        .await
        .expect("zookeeper");
    let deadline = Instant::now() + DEADLINE;
    loop {
        let candidates = zk
            .list_children("/ingest-engine/replication/election")
            .await
            .expect("list the candidates");
        if candidates.len() == 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the stopped follower's session never expired: {candidates:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    engines[lagging].signal("-CONT");
    converged(&http, &all).await;
    all_present(&http, &all, &acked).await;
    let log = engines[lagging].log();
    assert!(
        log.contains("was dropped from the replicated set"),
        "the dropped follower says so"
    );
    assert!(
        log.contains("copied the log from a peer"),
        "and rejoins by copying"
    );
}

/// Issue 22: a follower's admin UI used to refuse every form (only the
/// leader appends, and a form cannot follow the API's 307 with its
/// session). Its forms now send the API request to the leader as the
/// logged-in admin: the queue paused and resumed from a follower's page is
/// paused and resumed on the leader, recorded with the admin as actor, and
/// the page says so; a command the leader refuses comes back as refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_ui_form_on_a_follower_is_carried_to_the_leader() {
    let ens = Ensemble::start("uiform");
    let tmp = tempfile::tempdir().expect("tmp");
    let engines = three(tmp.path(), &ens, "/ingest-repl-uiform");
    let http = http();
    let all: Vec<&Engine> = engines.iter().collect();
    let l = leader(&http, &all).await;
    let f = (l + 1) % 3;
    let (leader_base, follower_base) = (&engines[l].base, &engines[f].base);
    follows(&http, follower_base, leader_base).await;
    let (cookie, overview) = ui_session(&http, follower_base).await;
    let csrf = crate::ui::csrf_in(&overview);
    let form = async |path: &str, reason: &str| -> String {
        let r = http
            .post(format!("{follower_base}{path}"))
            .header(reqwest::header::ORIGIN, follower_base.as_str())
            .header(reqwest::header::COOKIE, &cookie)
            .form(&[("csrf", csrf.as_str()), ("reason", reason)])
            .send()
            .await
            .expect("form");
        assert_eq!(r.status().as_u16(), 303, "{path}");
        let to = r.headers()[reqwest::header::LOCATION]
            .to_str()
            .expect("location")
            .to_string();
        // The outcome is shown once, on the page the form goes back to.
        http.get(format!("{follower_base}{to}"))
            .header(reqwest::header::COOKIE, &cookie)
            .send()
            .await
            .expect("page")
            .text()
            .await
            .expect("text")
    };
    let paused = async |base: &str| -> bool {
        let q: Value = http
            .get(format!("{base}/queue"))
            .bearer_auth(ADMIN)
            .send()
            .await
            .expect("queue")
            .json()
            .await
            .expect("json");
        q["paused"].as_bool().expect("paused")
    };

    let page = form("/ui/queue/pause", "paused from a follower's page").await;
    assert!(
        page.contains("pause the queue: 1 event(s) recorded"),
        "{page}"
    );
    assert!(paused(leader_base).await, "the leader paused the queue");
    let history: Value = http
        .get(format!("{leader_base}/history?actor=admin:admin"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("history")
        .json()
        .await
        .expect("json");
    let text = history.to_string();
    assert!(text.contains("paused from a follower's page"), "{text}");
    // The follower applies it as every record of the leader.
    let deadline = Instant::now() + DEADLINE;
    while !paused(follower_base).await {
        assert!(Instant::now() < deadline, "the follower never applied it");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A command the leader refuses comes back as refused.
    let page = form("/ui/jobs/jid9999999999/hold", "no such job").await;
    assert!(page.contains("Refused: the leader refused it"), "{page}");

    let page = form("/ui/queue/resume", "resumed from a follower's page").await;
    assert!(
        page.contains("resume the queue: 1 event(s) recorded"),
        "{page}"
    );
    assert!(!paused(leader_base).await, "the leader resumed the queue");
}

/// A busy follower goes round its loop many times a second (list the tail,
/// read the new nodes). It read the leader node and listed the election in
/// every round too, each time with a new watch and the last one dropped
/// (a `removeWatches` request): most of its requests. It now reads them
/// when a watch says they changed, or once a poll interval. Counted by
/// `tools/zk-op-count` in front of one follower while the leader takes a
/// stream of submissions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_follower_reads_the_election_only_when_it_changes() {
    let ens = Ensemble::start("rounds");
    let tmp = tempfile::tempdir().expect("tmp");
    let root = "/ingest-repl-rounds";
    let first_two: Vec<Engine> = (1..=2)
        .map(|i| Engine::start(tmp.path(), &format!("e{i}"), &ens.hosts, root))
        .collect();
    let http = http();
    let l = leader(&http, &first_two.iter().collect::<Vec<_>>()).await;
    let out = tmp.path().join("ops.json");
    let one_server = ens.hosts.split(',').next().expect("a host").to_string();
    let (mut proxy, through) = crate::dispatch::op_counter(&one_server, &out);
    let counted = Engine::start(tmp.path(), "e3", &through, root);
    follows(&http, &counted.base, &first_two[l].base).await;
    let leader_base = first_two[l].base.clone();
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..8 {
        let (http, base) = (http.clone(), leader_base.clone());
        tasks.spawn(async move {
            for n in 0..60 {
                submit_once(&http, &base, w * 1000 + n)
                    .await
                    .expect("the leader acknowledges");
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("a submitter");
    }
    let mut all: Vec<&Engine> = first_two.iter().collect();
    all.push(&counted);
    converged(&http, &all).await;
    crate::dispatch::stop_op_counter(&mut proxy);
    let counts: Value =
        serde_json::from_str(&std::fs::read_to_string(&out).expect("the counts")).expect("JSON");
    let op = |name: &str| -> u64 {
        counts
            .as_array()
            .expect("connections")
            .iter()
            .filter_map(|c| c["ops"][name].as_u64())
            .sum()
    };
    let rounds = op("multiRead");
    assert!(
        rounds >= 20,
        "the follower read the tail in {rounds} rounds: {counts}"
    );
    // Before: one election listing, one leader read and at least one
    // removeWatches per round.
    assert!(
        op("removeWatches") * 4 < rounds,
        "{} removeWatches for {rounds} rounds: {counts}",
        op("removeWatches")
    );
    let listings = op("getChildren") + op("getChildren2");
    assert!(
        listings < rounds * 3 / 2,
        "{listings} listings for {rounds} rounds: {counts}"
    );
}
