//! Real assembly end to end (issue 24): objects stored by `ingest serve
//! --steps real` in two real OCFL storage targets are requested on the
//! access queue, assembled by the in-process access daemons into the
//! delivery area, downloaded over HTTP from the URL the request names, and
//! read by an independent reader (python's `zipfile`/`tarfile`, and the
//! `bagit` package for bags): the files, their bytes and their digests
//! equal the stored version's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use reqwest::Method;
use serde_json::{json, Value};
use zookeeper_client as zk;

use crate::ingest::{add, rig, sha256, zip, Rig};
use crate::server::{eventually, DEPOSITOR};

/// Reads a container with python's standard library: every regular entry's
/// name and SHA-256.
const READER: &str = r#"
import hashlib, json, sys, tarfile, zipfile
path, fmt = sys.argv[1], sys.argv[2]
out = {}
if fmt == "zip":
    with zipfile.ZipFile(path) as z:
        bad = z.testzip()
        assert bad is None, "bad CRC: " + str(bad)
        for i in z.infolist():
            if not i.is_dir():
                out[i.filename] = hashlib.sha256(z.read(i)).hexdigest()
else:
    with tarfile.open(path, "r:gz" if fmt == "targz" else "r:") as t:
        for m in t.getmembers():
            if m.isfile():
                out[m.name] = hashlib.sha256(t.extractfile(m).read()).hexdigest()
print(json.dumps(out))
"#;

fn python_entries(path: &Path, format: &str) -> BTreeMap<String, String> {
    let out = std::process::Command::new("python3")
        .args(["-c", READER])
        .arg(path)
        .arg(format)
        .output()
        .expect("python3 (needed by this test)");
    assert!(
        out.status.success(),
        "python could not read the {format} container: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the reader's json")
}

/// Two storage targets (`primary` in the rig's `ocfl`, `second` beside it).
async fn two_target_rig(name: &str, extra: &[&str]) -> (Rig, tempfile::TempDir) {
    let second = tempfile::tempdir().expect("tempdir");
    let mut args = vec![
        "--storage-target".to_string(),
        format!("second={}", second.path().join("ocfl").display()),
        "--janitor-interval-secs".into(),
        "1".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    (rig(name, &args).await, second)
}

/// Stores two versions of one object: `a.txt` is the same in both (OCFL
/// keeps its content once, in v1), `b.txt` only in v1, `c.txt` only in
/// v2. Returns the ark.
async fn store_two_versions(rig: &Rig, local: &str) -> String {
    add(
        &rig.depot,
        "v1.zip",
        &zip(&[
            ("a.txt", b"the same in both versions"),
            ("b.txt", b"first only"),
        ]),
    );
    add(
        &rig.depot,
        "v2.zip",
        &zip(&[
            ("a.txt", b"the same in both versions"),
            ("c.txt", &vec![b'c'; 200_000]),
        ]),
    );
    let mut ark = String::new();
    for (file, mode) in [("v1.zip", "add"), ("v2.zip", "update")] {
        let bid = rig
            .submit(
                json!({"profile": "demo", "submitter": "alice", "type": "container",
                           "payload_url": format!("{}/files/{file}", rig.base),
                           "submission_mode": mode, "erc_where": local}),
            )
            .await;
        let batch = rig.finished(&bid).await;
        assert_eq!(batch["status"], "Completed", "{batch}");
        let job = rig.job(&Rig::jobs(&batch)[0]).await;
        ark = job["primary_id"].as_str().expect("ark").to_string();
    }
    ark
}

/// The stored version's files as the storage target has them: logical path
/// → SHA-256 of the bytes read back (`producer/` only unless `full`).
fn stored(storage: &Path, ark: &str, version: u32, full: bool) -> BTreeMap<String, String> {
    let target = ingest_steps::ocfl::OcflTarget::open_existing("check", storage).expect("storage");
    let v = target.version_content(ark, Some(version)).expect("version");
    v.files
        .iter()
        .filter(|f| full || f.logical_path.starts_with("producer/"))
        .map(|f| {
            let bytes = target
                .read_file(ark, Some(version), &f.logical_path)
                .expect("read back");
            (f.logical_path.clone(), sha256(&bytes))
        })
        .collect()
}

/// `ingest --engine URL access list` through the rig's server: the table.
fn access_table(rig: &Rig) -> String {
    let out = tokio::task::block_in_place(|| {
        std::process::Command::new(crate::util::ingest_bin())
            .args(["--engine", &rig.server.base, "access", "list"])
            .env("INGEST_ADMIN_TOKEN", crate::server::ADMIN)
            .output()
            .expect("run ingest")
    });
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Requests `body` and waits until the request ended; its view.
async fn assembled(rig: &Rig, body: Value) -> Value {
    let (code, answer) = rig
        .server
        .call(Method::POST, "/access", DEPOSITOR, Some(body))
        .await;
    assert_eq!(code, 201, "{answer}");
    let qid = answer["request"]["qid"].as_str().expect("qid").to_string();
    eventually(&format!("access request {qid} ended"), 90, async || {
        let a = rig.server.get(&format!("/access/{qid}")).await;
        matches!(a["status"].as_str(), Some("Completed" | "Failed")).then_some(a)
    })
    .await
}

/// Downloads the request's container into `dir`, checking its size and
/// SHA-256 against the delivery.
async fn download(view: &Value, dir: &Path) -> PathBuf {
    let delivery = &view["delivery"];
    let url = delivery["url"].as_str().expect("a delivery url");
    let answer = reqwest::get(url).await.expect("GET the delivery");
    assert_eq!(answer.status(), 200, "{url}");
    let bytes = answer.bytes().await.expect("body");
    assert_eq!(bytes.len() as u64, delivery["size"].as_u64().expect("size"));
    assert_eq!(sha256(&bytes), delivery["sha256"].as_str().expect("sha256"));
    let path = dir.join(format!(
        "{}.{}",
        view["qid"].as_str().expect("qid"),
        view["format"].as_str().expect("format")
    ));
    std::fs::write(&path, &bytes).expect("write the download");
    path
}

/// The entries under `<ark>/v<N>/`, with that prefix cut, the manifest
/// left out.
fn object_entries(
    entries: &BTreeMap<String, String>,
    ark: &str,
    version: u32,
) -> BTreeMap<String, String> {
    let prefix = format!("{}/v{version}/", ark.replace([':', '/'], "+"));
    entries
        .iter()
        .map(|(name, digest)| {
            let rel = name
                .strip_prefix(&prefix)
                .unwrap_or_else(|| panic!("{name} is not under {prefix}"));
            (rel.to_string(), digest.clone())
        })
        .filter(|(rel, _)| !rel.starts_with("manifest-"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_object_is_assembled_in_every_form_downloaded_and_read_back() {
    let (rig, _second) = two_target_rig("assembly", &[]).await;
    let ark = store_two_versions(&rig, "loc-assembled").await;
    // a.txt of v2 is v1's content: the assembler must find it there.
    let target =
        ingest_steps::ocfl::OcflTarget::open_existing("check", &rig.storage).expect("storage");
    let v2 = target.version_content(&ark, Some(2)).expect("v2");
    let a = v2
        .files
        .iter()
        .find(|f| f.logical_path == "producer/a.txt")
        .expect("a.txt in v2");
    assert!(
        a.path.to_string_lossy().contains("/v1/"),
        "a.txt deduplicated: {}",
        a.path.display()
    );

    let downloads = tempfile::tempdir().expect("tempdir");
    let cases = [
        ("zip", "producer", 0, 2),
        ("tar", "producer", 1, 1),
        ("targz", "producer", 2, 2),
        ("zip", "full", 2, 2),
        ("targz", "full", 1, 1),
    ];
    for (format, content, asked, version) in cases {
        let view = assembled(
            &rig,
            json!({"ark": ark, "version": asked, "format": format, "content": content}),
        )
        .await;
        assert_eq!(
            view["status"], "Completed",
            "{format} {content} v{asked}: {view}"
        );
        assert_eq!(view["delivery"]["version"], version, "{view}");
        let path = download(&view, downloads.path()).await;
        let entries = python_entries(&path, format);
        let want = stored(&rig.storage, &ark, version, content == "full");
        assert!(want.contains_key("producer/a.txt"), "{want:?}");
        assert_eq!(
            object_entries(&entries, &ark, version),
            want,
            "{format} {content} v{asked}"
        );
        assert!(
            entries.keys().any(|k| k.ends_with("/manifest-sha512.txt")),
            "a checksum manifest inside: {entries:?}"
        );
    }

    // The whole object: every version under its own vN/, each with every
    // file and its own manifest, sized as the sum of every version.
    let view = assembled(
        &rig,
        json!({"ark": ark, "format": "tar", "content": "object"}),
    )
    .await;
    assert_eq!(view["status"], "Completed", "{view}");
    assert_eq!(view["delivery"]["version"], 2, "{view}");
    let object = rig.server.get(&format!("/objects/{ark}")).await;
    let total: u64 = object["versions"]
        .as_array()
        .expect("versions")
        .iter()
        .flat_map(|v| v["files"].as_array().expect("files").iter())
        .map(|f| f["size"].as_u64().expect("size"))
        .sum();
    assert_eq!(view["size"], total, "every version's bytes: {view}");
    let entries = python_entries(&download(&view, downloads.path()).await, "tar");
    for version in [1, 2] {
        let prefix = format!("{}/v{version}/", ark.replace([':', '/'], "+"));
        let of_version: BTreeMap<String, String> = entries
            .iter()
            .filter(|(name, _)| name.starts_with(&prefix))
            .map(|(name, digest)| (name.clone(), digest.clone()))
            .collect();
        assert_eq!(
            object_entries(&of_version, &ark, version),
            stored(&rig.storage, &ark, version, true),
            "version {version} of the whole object"
        );
        assert!(
            of_version
                .keys()
                .any(|k| k.ends_with("/manifest-sha512.txt")),
            "a manifest for v{version}: {of_version:?}"
        );
    }
    assert!(
        entries
            .keys()
            .all(|k| k.contains("/v1/") || k.contains("/v2/")),
        "{entries:?}"
    );
    for (body, field) in [
        (
            json!({"ark": ark, "content": "object", "version": 1}),
            "version",
        ),
        (json!({"ark": ark, "content": "object", "bag": true}), "bag"),
    ] {
        let (code, answer) = rig
            .server
            .call(Method::POST, "/access", DEPOSITOR, Some(body))
            .await;
        assert_eq!(code, 422, "{answer}");
        assert!(answer.to_string().contains(field), "{answer}");
    }

    // The token node names the delivery with mrt-store's keys.
    let view = assembled(&rig, json!({"ark": ark, "format": "zip"})).await;
    let client = zk::Client::connect(&rig.zk_at).await.expect("zookeeper");
    let (data, _) = client
        .get_data(&format!("{}/token", view["path"].as_str().expect("path")))
        .await
        .expect("token node");
    let node: Value = serde_json::from_slice(&data).expect("json");
    assert_eq!(node["url"], view["delivery"]["url"], "{node}");
    assert_eq!(node["content"], "producer", "{node}");
    assert_eq!(node["delivery-size"], view["delivery"]["size"], "{node}");
    assert_eq!(
        node["delivery-digest"], view["delivery"]["sha256"],
        "{node}"
    );
    assert!(node["anticipated-availability-time"].is_string(), "{node}");
    assert!(node["expiration-time"].is_string(), "{node}");

    // HEAD and Range are answered.
    let url = view["delivery"]["url"].as_str().expect("url").to_string();
    let http = reqwest::Client::new();
    let head = http.head(&url).send().await.expect("HEAD");
    assert_eq!(head.status(), 200);
    let length = head
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    assert_eq!(
        length,
        view["delivery"]["size"].as_u64(),
        "HEAD names the size"
    );
    let whole = http
        .get(&url)
        .send()
        .await
        .expect("GET")
        .bytes()
        .await
        .expect("body");
    let part = http
        .get(&url)
        .header("Range", "bytes=10-29")
        .send()
        .await
        .expect("ranged GET");
    assert_eq!(part.status(), 206);
    assert_eq!(part.bytes().await.expect("part"), whole[10..30]);
    // A guessed name is not served.
    let guessed = url.rsplit_once('/').expect("a name").0.to_string()
        + "/9999999999-00000000000000000000000000000000.zip";
    assert_eq!(http.get(&guessed).send().await.expect("GET").status(), 404);

    // A bag: validated by the bagit package, its payload the full version.
    let view = assembled(&rig, json!({"ark": ark, "format": "zip", "bag": true})).await;
    assert_eq!(view["status"], "Completed", "{view}");
    assert_eq!(view["bag"], true, "{view}");
    let path = download(&view, downloads.path()).await;
    let entries = python_entries(&path, "zip");
    let payload: BTreeMap<String, String> = object_entries(&entries, &ark, 2)
        .into_iter()
        .filter_map(|(k, v)| k.strip_prefix("data/").map(|k| (k.to_string(), v)))
        .collect();
    assert_eq!(payload, stored(&rig.storage, &ark, 2, true));
    let Some(python) = tokio::task::spawn_blocking(|| {
        crate::util::venv_python("bagit-venv", "bagit==1.9.0", "bagit")
    })
    .await
    .expect("the venv task") else {
        return;
    };
    let check = "import bagit, sys, zipfile, os\n\
                 zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])\n\
                 top = os.path.join(sys.argv[2], os.listdir(sys.argv[2])[0])\n\
                 bag = bagit.Bag(os.path.join(top, os.listdir(top)[0]))\n\
                 bag.validate()\n\
                 print(bag.info['External-Identifier'])\n";
    let out = downloads.path().join("bag");
    let validated = std::process::Command::new(&python)
        .args(["-c", check])
        .arg(&path)
        .arg(&out)
        .output()
        .expect("python bagit");
    assert!(validated.status.success(), "bagit: {validated:?}");
    assert_eq!(String::from_utf8_lossy(&validated.stdout).trim(), ark);
}

/// Changes one byte of `producer/a.txt`'s stored content in `storage`.
fn damage(storage: &Path, ark: &str) -> String {
    let target = ingest_steps::ocfl::OcflTarget::open_existing("damage", storage).expect("storage");
    let v = target.version_content(ark, None).expect("head");
    let f = v
        .files
        .iter()
        .find(|f| f.logical_path == "producer/a.txt")
        .expect("a.txt");
    let mut bytes = std::fs::read(&f.path).expect("read");
    bytes[0] ^= 1;
    std::fs::write(&f.path, bytes).expect("write");
    f.logical_path.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_copy_fails_over_to_the_next_target_and_none_intact_fails_naming_the_file() {
    let (rig, second) = two_target_rig("assembly-damage", &[]).await;
    let ark = store_two_versions(&rig, "loc-damaged").await;
    let file = damage(&rig.storage, &ark);
    let view = assembled(&rig, json!({"ark": ark, "format": "tar"})).await;
    assert_eq!(view["status"], "Completed", "{view}");
    assert_eq!(view["delivery"]["target"], "second", "{view}");
    let message = view["message"].as_str().expect("message");
    assert!(
        message.contains("primary") && message.contains(&file),
        "says it failed over: {message}"
    );
    // The profile of the object's collection is told, by callback and
    // e-mail, where the container waits.
    let qid = view["qid"].as_str().expect("qid").to_string();
    let callback = told(&rig, &qid).await;
    assert_eq!(callback["status"], "Completed", "{callback}");
    assert_eq!(callback["url"], view["delivery"]["url"], "{callback}");
    assert_eq!(callback["size"], view["delivery"]["size"], "{callback}");
    assert_eq!(callback["sha256"], view["delivery"]["sha256"], "{callback}");
    assert_eq!(callback["ark"], ark.as_str(), "{callback}");
    assert_eq!(callback["profile"], "demo", "{callback}");
    assert!(callback["expires"].is_string(), "{callback}");
    let mail = rig
        .mail_containing(&format!("Subject: ingest access {qid} ready: "))
        .await;
    assert!(
        mail.contains("To: curator@example.org")
            && mail.contains(view["delivery"]["url"].as_str().expect("url")),
        "{mail}"
    );
    let downloads = tempfile::tempdir().expect("tempdir");
    let path = download(&view, downloads.path()).await;
    assert_eq!(
        object_entries(&python_entries(&path, "tar"), &ark, 2),
        stored(&second.path().join("ocfl"), &ark, 2, false),
        "the second target's intact copy"
    );

    let delivered = view.clone();
    damage(&second.path().join("ocfl"), &ark);
    let view = assembled(&rig, json!({"ark": ark, "format": "zip"})).await;
    assert_eq!(view["status"], "Failed", "{view}");
    let message = view["message"].as_str().expect("message");
    assert!(
        message.contains(&file) && message.contains("primary") && message.contains("second"),
        "names the file and each target: {message}"
    );
    assert!(view.get("delivery").is_none_or(Value::is_null), "{view}");
    let qid = view["qid"].as_str().expect("qid").to_string();
    let callback = told(&rig, &qid).await;
    assert_eq!(callback["status"], "Failed", "{callback}");
    shown_to_operators(&rig, &delivered).await;
    assert_eq!(callback["message"], message, "{callback}");
    assert!(callback.get("url").is_none(), "{callback}");
    rig.mail_containing(&format!("Subject: ingest access {qid} failed: "))
        .await;
}

/// The one callback received for request `qid`, once it came.
async fn told(rig: &Rig, qid: &str) -> Value {
    let callback = eventually(&format!("the callback of {qid}"), 60, async || {
        rig.callbacks_with("qid", qid).first().cloned()
    })
    .await;
    assert_eq!(rig.callbacks_with("qid", qid).len(), 1, "one callback");
    callback
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_delivery_is_removed_and_its_url_answers_gone() {
    let (rig, _second) = two_target_rig("assembly-expiry", &["--delivery-ttl-secs", "3"]).await;
    let ark = store_two_versions(&rig, "loc-expiring").await;
    let view = assembled(&rig, json!({"ark": ark, "format": "targz"})).await;
    assert_eq!(view["status"], "Completed", "{view}");
    let url = view["delivery"]["url"].as_str().expect("url").to_string();
    let name = url.rsplit_once('/').expect("a name").1.to_string();
    let file = rig._dir.path().join("work").join("deliveries").join(&name);
    assert!(file.is_file(), "{} in the delivery area", file.display());
    let qid = view["qid"].as_str().expect("qid").to_string();
    eventually("the janitor removed the expired delivery", 60, async || {
        (!file.exists()).then_some(())
    })
    .await;
    let answer = reqwest::get(&url).await.expect("GET");
    assert_eq!(answer.status(), 410);
    let view = rig.server.get(&format!("/access/{qid}")).await;
    assert_eq!(view["expired"], true, "the request says so: {view}");
}

/// One Completed request (`delivered`) and one Failed beside it: the
/// metrics (checked by `promtool check metrics`), `ingest access list` and
/// the admin UI's page show its size, target, URL and expiry.
async fn shown_to_operators(rig: &Rig, delivered: &Value) {
    let d = &delivered["delivery"];
    let size = d["size"].as_u64().expect("size");
    let url = d["url"].as_str().expect("url");
    let page = reqwest::get(format!("{}/metrics", rig.server.base))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    for series in [
        "ingest_access_requests{state=\"Completed\"} 1".to_string(),
        "ingest_access_requests{state=\"Failed\"} 1".to_string(),
        format!("ingest_access_assembled_bytes {size}"),
        format!("ingest_access_delivery_bytes {size}"),
        "ingest_access_delivery_files 1".to_string(),
    ] {
        assert!(page.lines().any(|l| l == series), "{series} in\n{page}");
    }
    let mut promtool = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus; tools/check-deploy installs it)");
    // Our families only: promtool's lint also flags the page's older
    // counters (their HELP is on the OpenMetrics family name, without
    // `_total`), which are not this test's.
    let ours: String = page
        .lines()
        .filter(|l| l.contains("ingest_access_"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::io::Write::write_all(&mut promtool.stdin.take().expect("stdin"), ours.as_bytes())
        .expect("feed promtool");
    let checked = promtool.wait_with_output().expect("promtool");
    let said = String::from_utf8_lossy(&checked.stdout).to_string()
        + &String::from_utf8_lossy(&checked.stderr);
    assert!(
        checked.status.success(),
        "promtool check metrics: {said}\n{ours}"
    );

    let table = access_table(rig);
    let header = table.lines().next().unwrap_or_default();
    for column in ["BYTES", "CONTENT", "TARGET", "EXPIRES", "URL"] {
        assert!(header.contains(column), "{table}");
    }
    let row = table
        .lines()
        .find(|l| l.starts_with(delivered["qid"].as_str().expect("qid")))
        .expect("the delivered request's row");
    let expires = chrono::DateTime::parse_from_rfc3339(d["expires"].as_str().expect("expires"))
        .expect("a time")
        .format("%Y-%m-%d %H:%M:%S")
        .to_string();
    for cell in [url, "second", &expires, "producer"] {
        assert!(row.contains(cell), "{cell} in {row}");
    }

    let login = crate::ui::login(&rig.server, crate::server::ADMIN).await;
    let cookie = crate::ui::cookie_of(&login).expect("a session cookie");
    let (code, html) = crate::ui::page(
        &rig.server,
        &cookie,
        &format!("/ui/access/{}", delivered["qid"].as_str().expect("qid")),
    )
    .await;
    assert_eq!(code, 200, "{html}");
    assert!(
        html.contains(&format!("id=\"access-delivery-url\" href=\"{url}\"")),
        "the download link: {html}"
    );
    assert!(
        html.contains("from second") && html.contains(" until "),
        "{html}"
    );
}

/// Writes `bytes` random bytes (`head -c` of `/dev/urandom`, so no
/// compression or sparse storage shrinks them) to `path`.
fn pseudo_random_file(path: &Path, bytes: u64) {
    let out = std::fs::File::create(path).expect("create");
    let status = std::process::Command::new("head")
        .args(["-c", &bytes.to_string(), "/dev/urandom"])
        .stdout(out)
        .status()
        .expect("head");
    assert!(status.success());
    assert_eq!(std::fs::metadata(path).expect("metadata").len(), bytes);
}

/// The peak resident set of process `pid` in bytes (`VmHWM`).
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmHWM")
        * 1024
}

/// Kills the worker when the test ends, also when an assertion fails.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Stores the file at `path` as an object of its own (a batch of one
/// `file` job, local id `local`) and gives its ark.
async fn stored_file(rig: &Rig, path: &Path, local: &str) -> String {
    let bid = rig
        .submit(
            json!({"profile": "demo", "submitter": "alice", "type": "file",
                       "payload_url": format!("file://{}", path.display()),
                       "erc_where": local}),
        )
        .await;
    let batch = rig.finished(&bid).await;
    assert_eq!(batch["status"], "Completed", "{batch}");
    let job = rig.job(&Rig::jobs(&batch)[0]).await;
    job["primary_id"].as_str().expect("ark").to_string()
}

/// The size of the object a separate worker assembles first, so that what
/// any first assembly costs whatever the object's size (the worker's HTTP
/// client, its threads' stacks and allocator heaps, the read-ahead
/// buffers: about 10 MiB with glibc's allocator, 14 MiB with mimalloc) is
/// in its peak RSS before the measured one starts. Over 4 MiB, so it is
/// read ahead as a large file is.
const WARM_UP_BYTES: u64 = 6 << 20;

/// An object of one `bytes`-byte file is stored by the server, whose own
/// access daemons are off; a separate `ingest worker --steps real`
/// running only the access daemons assembles it as a tar (after a smaller
/// object, [`WARM_UP_BYTES`]). The container is downloaded and checked,
/// and the worker's peak RSS grows by far less than the object while it
/// assembles: the container is streamed.
async fn a_separate_worker_assembles(name: &str, bytes: u64) {
    let payloads = tempfile::tempdir().expect("tempdir");
    let file = payloads.path().join("big.bin");
    pseudo_random_file(&file, bytes);
    let warm = payloads.path().join("warm.bin");
    pseudo_random_file(&warm, WARM_UP_BYTES);
    let (rig, _second) = two_target_rig(
        name,
        &[
            "--file-root",
            &payloads.path().display().to_string(),
            "--daemons",
            "access_small=off,access_large=off",
        ],
    )
    .await;
    let ark = stored_file(&rig, &file, "loc-big").await;
    let warm_ark = stored_file(&rig, &warm, "loc-warm").await;

    let (hosts, root) = rig.zk_at.split_at(rig.zk_at.find('/').expect("a root"));
    let dir = rig._dir.path();
    let log = dir.join("assembler.log");
    let worker = std::process::Command::new(crate::util::ingest_bin())
        .args([
            "worker",
            "--engine",
            &rig.server.base,
            "--zk",
            hosts,
            "--zk-root",
            root,
        ])
        .args(["--steps", "real", "--daemons", "access_small,access_large"])
        .args(["--name", "assembler", "--content-url", &rig.server.base])
        .arg("--working-storage")
        .arg(dir.join("assembler"))
        .arg("--delivery-dir")
        .arg(dir.join("work").join("deliveries"))
        .arg("--storage-target")
        .arg(format!("primary={}", rig.storage.display()))
        .arg("--profiles-dir")
        .arg(dir.join("profiles"))
        .arg("--outbox")
        .arg(dir.join("outbox"))
        .args(["--allow-network", "127.0.0.1/32"])
        .env("INGEST_WORKER_TOKEN", crate::server::WORKER)
        .env_remove("INGEST_DATA_DIR")
        .env_remove("INGEST_CONFIG")
        .env_remove("INGEST_DAEMONS")
        .env_remove("INGEST_WORKER_STEPS")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("start ingest worker");
    let worker = Killed(worker);
    let pid = worker.0.id();
    eventually("the worker's ZooKeeper session", 60, async || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("worker ZooKeeper session established")
            .then_some(())
    })
    .await;
    let started = peak_rss(pid);
    let view = assembled(&rig, json!({"ark": warm_ark, "format": "tar"})).await;
    assert_eq!(view["status"], "Completed", "{view}");
    let before = peak_rss(pid);

    let view = assembled(&rig, json!({"ark": ark, "format": "tar"})).await;
    assert_eq!(
        view["status"],
        "Completed",
        "{view}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    // Sized from the inventory: the file and the version's system files.
    let size = view["size"].as_u64().expect("size");
    assert!(size >= bytes && size < bytes + (1 << 20), "{view}");
    let queue = if size > 500_000_000 { "large" } else { "small" };
    assert_eq!(view["queue"], queue, "{view}");
    let after = peak_rss(pid);
    let worker_log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        worker_log.contains("assembly reported"),
        "the separate worker assembled it: {worker_log}"
    );
    eprintln!(
        "assembly of {bytes} bytes by a separate worker: peak RSS {started} bytes when started, {before} after a first assembly of {WARM_UP_BYTES} bytes, {after} after (+{})",
        after.saturating_sub(before)
    );
    assert!(
        after.saturating_sub(before) < bytes / 4,
        "the worker's peak RSS grew by {} bytes for a {bytes}-byte object: not streamed",
        after.saturating_sub(before)
    );

    // The container read back: the file, its bytes' digest, streamed
    // through python's tarfile.
    let url = view["delivery"]["url"].as_str().expect("url");
    let downloads = tempfile::tempdir().expect("tempdir");
    let path = downloads.path().join("big.tar");
    let mut answer = reqwest::get(url).await.expect("GET the delivery");
    assert_eq!(answer.status(), 200);
    let mut out = std::fs::File::create(&path).expect("create");
    while let Some(chunk) = answer.chunk().await.expect("a chunk") {
        std::io::Write::write_all(&mut out, &chunk).expect("write");
    }
    drop(out);
    let entries = python_entries(&path, "tar");
    let want = stored(&rig.storage, &ark, 1, false);
    assert_eq!(object_entries(&entries, &ark, 1), want);
    drop(worker);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_separate_worker_assembles_an_object_streaming_it() {
    a_separate_worker_assembles("assembly-worker", 48 << 20).await;
}

/// The issue's 2 GB object (`INGEST_LARGE_OBJECT_BYTES` to change it) on
/// the large queue; minutes in a debug build, so run by
/// `tools/large-assembly`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes: tools/large-assembly runs it"]
async fn a_separate_worker_assembles_a_2_gb_object_on_the_large_queue() {
    let bytes = std::env::var("INGEST_LARGE_OBJECT_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2u64 << 30);
    a_separate_worker_assembles("assembly-large", bytes).await;
}

/// An assembly in progress says how far it got (issue 24): the access
/// daemon reports the target it reads and the files and bytes packed so
/// far (`--assembly-pause-ms` holds each assembly after its first file),
/// and `GET /access/{qid}`, `GET /access`, `ingest access list` and the
/// request's page show it while the request is Processing, and no longer
/// once it ended. A report from anyone but the lock's holder, for a
/// request not Processing, or naming an oversized target is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_assembly_in_progress_shows_how_far_it_got() {
    let (rig, _second) =
        two_target_rig("assembly-progress", &["--assembly-pause-ms", "6000"]).await;
    let ark = store_two_versions(&rig, "loc-progress").await;
    let (code, answer) = rig
        .server
        .call(
            Method::POST,
            "/access",
            DEPOSITOR,
            Some(json!({"ark": ark, "format": "tar", "content": "full"})),
        )
        .await;
    assert_eq!(code, 201, "{answer}");
    let qid = answer["request"]["qid"].as_str().expect("qid").to_string();
    let path = format!("/access/{qid}");
    let view = eventually("the assembly's first progress", 60, async || {
        let v = rig.server.get(&path).await;
        (v["status"] == "Processing" && v["progress"]["files"].as_u64() >= Some(1)).then_some(v)
    })
    .await;
    let progress = &view["progress"];
    let size = view["size"].as_u64().expect("size");
    let bytes = progress["bytes"].as_u64().expect("bytes");
    assert!(bytes > 0 && bytes <= size, "{view}");
    assert_eq!(progress["target"], "primary", "{view}");
    assert!(
        progress["worker"].as_str().is_some_and(|w| !w.is_empty()),
        "{view}"
    );
    let list = rig.server.get("/access").await;
    let item = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .find(|i| i["qid"] == qid.as_str())
        .expect("listed");
    assert_eq!(item["progress"]["bytes"], bytes, "{list}");

    // The CLI's table and the request's page say it too.
    let table = access_table(&rig);
    let row = table
        .lines()
        .find(|l| l.starts_with(&qid))
        .unwrap_or_else(|| panic!("{qid} in {table}"));
    assert!(row.contains("files from primary"), "{table}");
    let login = crate::ui::login(&rig.server, crate::server::ADMIN).await;
    let cookie = crate::ui::cookie_of(&login).expect("a session cookie");
    let (code, html) = crate::ui::page(&rig.server, &cookie, &format!("/ui/access/{qid}")).await;
    assert_eq!(code, 200, "{html}");
    assert!(
        html.contains("id=\"access-progress\"") && html.contains("from primary"),
        "{html}"
    );

    // Only the lock's holder reports, and only sensible reports.
    let report = |target: String| json!({"worker": "intruder", "session_id": 1, "target": target, "files": 9, "bytes": 9});
    let stranger = ingest_protocol::fence::FenceSecret::from_bytes([7; 32]);
    let progress_path = format!("{path}/progress");
    // The status and error code of a stranger's report.
    let refusal = async |path: &str, target: String| {
        let (code, body) = rig
            .server
            .call_fenced(path, &stranger, report(target))
            .await;
        let error = body["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        (code, error)
    };
    assert_eq!(
        refusal(&progress_path, "primary".into()).await,
        (409, "lock_not_held".to_string())
    );
    assert_eq!(refusal(&progress_path, "t".repeat(300)).await.0, 422);
    assert_eq!(
        refusal("/access/qid9999999999/progress", "primary".into())
            .await
            .0,
        404
    );
    assert_eq!(rig.server.get(&path).await["progress"]["bytes"], bytes);

    // Ended: no progress is shown, and none is taken.
    let ended = eventually("the assembly ended", 90, async || {
        let v = rig.server.get(&path).await;
        (v["status"] == "Completed").then_some(v)
    })
    .await;
    assert!(ended.get("progress").is_none(), "{ended}");
    assert_eq!(
        refusal(&progress_path, "primary".into()).await,
        (409, "not_processing".to_string())
    );
}
