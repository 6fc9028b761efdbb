//! Server-side sessions of the admin web UI, their CSRF tokens, and the
//! limit on failed logins.
//!
//! A session is a random 256-bit id (OS randomness) sent as the cookie
//! [`COOKIE`] (`HttpOnly; SameSite=Strict; Path=/ui`, `Secure` when
//! configured). The server keeps, per session, the admin's name, a CSRF
//! token (another 256 random bits) that every form carries, when it was
//! created and last used. A session ends on logout, after the idle time or
//! the absolute time; the store holds at most [`MAX_SESSIONS`] (the oldest
//! is dropped to make room).
//!
//! Failed logins are counted per client address (an IPv6 client by its
//! /64) and per token tried (a keyed hash of it, never the token): a client
//! with [`MAX_FAILURES`] failures in [`FAILURE_WINDOW`] is refused, and so is
//! a token tried and refused that often from anywhere. A correct token is
//! never counted, so a login from another client always goes through (the
//! limit was global: ten wrong logins a minute from anyone locked every
//! admin out).

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hash};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ingest_config::UiSettings;

/// The session cookie's name.
pub const COOKIE: &str = "ingest_ui";

/// The most sessions kept at once.
pub const MAX_SESSIONS: usize = 1024;

/// Failed logins allowed in [`FAILURE_WINDOW`] from one client (or with one
/// token) before its logins are refused until the window has moved on.
pub const MAX_FAILURES: usize = 10;

/// The most clients (and tokens) whose failures are kept; past it the
/// expired ones are dropped, then the one whose last failure is oldest.
pub const MAX_TRACKED: usize = 4096;

/// The window failed logins are counted over.
pub const FAILURE_WINDOW: Duration = Duration::from_secs(60);

/// Why a session could not be created.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The operating system gave no randomness.
    #[error("no randomness from the operating system: {0}")]
    Random(String),
}

/// One logged-in admin.
#[derive(Debug, Clone)]
pub struct Session {
    /// The admin's name (recorded as `admin:NAME`).
    pub admin: String,
    /// The token every form of this session carries.
    pub csrf: String,
    created: Instant,
    last_used: Instant,
    /// A message to show once on the next page (the outcome of an action).
    pub flash: Option<Flash>,
}

/// The outcome of an action, shown once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flash {
    /// Whether the action succeeded.
    pub ok: bool,
    /// What happened.
    pub message: String,
}

/// 256 random bits from the OS, hex.
fn random_hex() -> Result<String, SessionError> {
    let mut bytes = [0u8; 32];
    getrandom::getrandom(&mut bytes).map_err(|e| SessionError::Random(e.to_string()))?;
    Ok(hex::encode(bytes))
}

/// The sessions and the failed-login counters.
#[derive(Debug)]
pub struct Sessions {
    settings: UiSettings,
    inner: Mutex<Inner>,
    /// Keys the hash that stands for a token tried (random per process).
    token_hasher: std::collections::hash_map::RandomState,
}

#[derive(Debug, Default)]
struct Inner {
    by_id: HashMap<String, Session>,
    by_client: Failures<IpAddr>,
    by_token: Failures<u64>,
}

/// Why a login is refused before its token is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Throttled {
    /// This client failed too often.
    Client,
    /// This token was refused too often.
    Token,
}

/// Recent failures by key, at most [`MAX_TRACKED`] keys.
#[derive(Debug)]
struct Failures<K> {
    by_key: HashMap<K, VecDeque<Instant>>,
}

impl<K> Default for Failures<K> {
    fn default() -> Self {
        Failures {
            by_key: HashMap::new(),
        }
    }
}

impl<K: Hash + Eq + Copy> Failures<K> {
    /// Whether `key` has fewer than [`MAX_FAILURES`] in the window.
    fn allowed(&mut self, key: K, now: Instant) -> bool {
        let Some(times) = self.by_key.get_mut(&key) else {
            return true;
        };
        while times
            .front()
            .is_some_and(|t| now.duration_since(*t) >= FAILURE_WINDOW)
        {
            times.pop_front();
        }
        if times.is_empty() {
            self.by_key.remove(&key);
            return true;
        }
        times.len() < MAX_FAILURES
    }

    fn failed(&mut self, key: K, now: Instant) {
        if !self.by_key.contains_key(&key) && self.by_key.len() >= MAX_TRACKED {
            self.by_key.retain(|_, times| {
                times
                    .back()
                    .is_some_and(|t| now.duration_since(*t) < FAILURE_WINDOW)
            });
            if self.by_key.len() >= MAX_TRACKED {
                let oldest = self
                    .by_key
                    .iter()
                    .min_by_key(|(_, times)| times.back().copied())
                    .map(|(k, _)| *k);
                if let Some(k) = oldest {
                    self.by_key.remove(&k);
                }
            }
        }
        let times = self.by_key.entry(key).or_default();
        times.push_back(now);
        while times.len() > MAX_FAILURES {
            times.pop_front();
        }
    }
}

impl Sessions {
    /// An empty store.
    pub fn new(settings: UiSettings) -> Sessions {
        Sessions {
            settings,
            inner: Mutex::new(Inner::default()),
            token_hasher: std::collections::hash_map::RandomState::new(),
        }
    }

    /// The settings the store was made with.
    pub fn settings(&self) -> &UiSettings {
        &self.settings
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn expired(&self, s: &Session, now: Instant) -> bool {
        now.duration_since(s.last_used) >= self.settings.session_idle
            || now.duration_since(s.created) >= self.settings.session_max
    }

    /// Starts a session for `admin`: its id (the cookie's value).
    ///
    /// # Errors
    /// [`SessionError::Random`] when the OS gives no randomness.
    pub fn create(&self, admin: &str) -> Result<String, SessionError> {
        let id = random_hex()?;
        let csrf = random_hex()?;
        let now = Instant::now();
        let mut inner = self.lock();
        if inner.by_id.len() >= MAX_SESSIONS {
            inner.by_id.retain(|_, s| !self.expired(s, now));
        }
        while inner.by_id.len() >= MAX_SESSIONS {
            let oldest = inner
                .by_id
                .iter()
                .min_by_key(|(_, s)| s.last_used)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => inner.by_id.remove(&k),
                None => break,
            };
        }
        inner.by_id.insert(
            id.clone(),
            Session {
                admin: admin.to_string(),
                csrf,
                created: now,
                last_used: now,
                flash: None,
            },
        );
        Ok(id)
    }

    /// The live session `id`, marked as used now, with its flash taken;
    /// `None` (and the session dropped) when it does not exist or expired.
    pub fn touch(&self, id: &str) -> Option<Session> {
        let now = Instant::now();
        let mut inner = self.lock();
        let expired = self.expired(inner.by_id.get(id)?, now);
        if expired {
            inner.by_id.remove(id);
            return None;
        }
        let s = inner.by_id.get_mut(id)?;
        s.last_used = now;
        let shown = s.clone();
        s.flash = None;
        Some(shown)
    }

    /// Leaves a message for the session's next page.
    pub fn flash(&self, id: &str, flash: Flash) {
        if let Some(s) = self.lock().by_id.get_mut(id) {
            s.flash = Some(flash);
        }
    }

    /// Ends session `id`.
    pub fn remove(&self, id: &str) {
        self.lock().by_id.remove(id);
    }

    /// How many sessions are held.
    pub fn len(&self) -> usize {
        self.lock().by_id.len()
    }

    /// Whether no session is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `client` may try a login with `token` now: `Err` when the
    /// client, or the token, has [`MAX_FAILURES`] failures in the last
    /// [`FAILURE_WINDOW`]. `client` is the address the connection came
    /// from (see `api::client_key`).
    pub fn login_allowed(&self, client: IpAddr, token: &[u8]) -> Result<(), Throttled> {
        let now = Instant::now();
        let token = self.token_hasher.hash_one(token);
        let mut inner = self.lock();
        if !inner.by_client.allowed(client, now) {
            return Err(Throttled::Client);
        }
        if !inner.by_token.allowed(token, now) {
            return Err(Throttled::Token);
        }
        Ok(())
    }

    /// Counts a failed login of `client` with `token`.
    pub fn login_failed(&self, client: IpAddr, token: &[u8]) {
        let now = Instant::now();
        let token = self.token_hasher.hash_one(token);
        let mut inner = self.lock();
        inner.by_client.failed(client, now);
        inner.by_token.failed(token, now);
    }
}

/// The value of cookie `name` in a `Cookie` header.
pub fn cookie_value<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header.split(';').find_map(|pair| {
        let (k, v) = pair.trim().split_once('=')?;
        (k == name).then_some(v)
    })
}

/// The `Set-Cookie` value that starts a session.
pub fn set_cookie(id: &str, settings: &UiSettings) -> String {
    format!(
        "{COOKIE}={id}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={}{}",
        settings.session_max.as_secs(),
        if settings.secure_cookies {
            "; Secure"
        } else {
            ""
        }
    )
}

/// The `Set-Cookie` value that ends a session in the browser.
pub fn clear_cookie(settings: &UiSettings) -> String {
    format!(
        "{COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0{}",
        if settings.secure_cookies {
            "; Secure"
        } else {
            ""
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(idle: u64, max: u64) -> UiSettings {
        UiSettings {
            secure_cookies: true,
            session_idle: Duration::from_millis(idle),
            session_max: Duration::from_millis(max),
        }
    }

    #[test]
    fn sessions_are_random_expire_and_are_bounded() {
        let s = Sessions::new(settings(60_000, 60_000));
        let a = s.create("alice").expect("create");
        let b = s.create("alice").expect("create");
        assert_ne!(a, b);
        assert_eq!(a.len(), 64);
        let sa = s.touch(&a).expect("live");
        assert_eq!(sa.admin, "alice");
        assert_ne!(sa.csrf, s.touch(&b).expect("live").csrf);
        s.flash(
            &a,
            Flash {
                ok: true,
                message: "done".into(),
            },
        );
        assert!(s.touch(&a).expect("live").flash.is_some());
        assert!(s.touch(&a).expect("live").flash.is_none(), "shown once");
        s.remove(&a);
        assert!(s.touch(&a).is_none());
        for _ in 0..MAX_SESSIONS + 5 {
            s.create("bob").expect("create");
        }
        assert_eq!(s.len(), MAX_SESSIONS);

        let idle = Sessions::new(settings(0, 60_000));
        let id = idle.create("alice").expect("create");
        assert!(idle.touch(&id).is_none(), "idle expiry");
        let max = Sessions::new(settings(60_000, 0));
        let id = max.create("alice").expect("create");
        assert!(max.touch(&id).is_none(), "absolute expiry");
    }

    #[test]
    fn failed_logins_are_limited_by_client_and_by_token() {
        let s = Sessions::new(settings(1000, 1000));
        let a: IpAddr = "127.0.0.2".parse().expect("ip");
        let b: IpAddr = "127.0.0.3".parse().expect("ip");
        for i in 0..MAX_FAILURES {
            assert_eq!(s.login_allowed(a, format!("wrong-{i}").as_bytes()), Ok(()));
            s.login_failed(a, format!("wrong-{i}").as_bytes());
        }
        assert_eq!(s.login_allowed(a, b"right"), Err(Throttled::Client));
        assert_eq!(s.login_allowed(b, b"right"), Ok(()), "another client");
        // One wrong token tried from many clients.
        let s = Sessions::new(settings(1000, 1000));
        for i in 0..MAX_FAILURES {
            let c = IpAddr::from([10, 0, 0, i as u8]);
            s.login_failed(c, b"guess");
        }
        assert_eq!(s.login_allowed(b, b"guess"), Err(Throttled::Token));
        assert_eq!(s.login_allowed(b, b"right"), Ok(()));
    }

    #[test]
    fn the_failure_counters_stay_bounded() {
        let s = Sessions::new(settings(1000, 1000));
        for i in 0..(MAX_TRACKED + 100) as u32 {
            s.login_failed(IpAddr::from(i.to_be_bytes()), &i.to_be_bytes());
        }
        let inner = s.lock();
        assert!(inner.by_client.by_key.len() <= MAX_TRACKED);
        assert!(inner.by_token.by_key.len() <= MAX_TRACKED);
    }

    #[test]
    fn cookies_are_parsed_and_set_with_their_attributes() {
        assert_eq!(cookie_value("a=1; ingest_ui=xyz", COOKIE), Some("xyz"));
        assert_eq!(cookie_value("ingest_uix=1", COOKIE), None);
        let c = set_cookie("abc", &settings(1000, 5000));
        for part in [
            "HttpOnly",
            "SameSite=Strict",
            "Path=/ui",
            "Secure",
            "Max-Age=5",
        ] {
            assert!(c.contains(part), "{c}");
        }
    }
}
