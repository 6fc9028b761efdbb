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

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ingest_config::UiSettings;

/// The session cookie's name.
pub const COOKIE: &str = "ingest_ui";

/// The most sessions kept at once.
pub const MAX_SESSIONS: usize = 1024;

/// Failed logins allowed in [`FAILURE_WINDOW`] before every login is
/// refused until the window has moved on.
pub const MAX_FAILURES: usize = 10;

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

/// The sessions and the failed-login counter.
#[derive(Debug)]
pub struct Sessions {
    settings: UiSettings,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    by_id: HashMap<String, Session>,
    failures: VecDeque<Instant>,
}

impl Sessions {
    /// An empty store.
    pub fn new(settings: UiSettings) -> Sessions {
        Sessions {
            settings,
            inner: Mutex::new(Inner::default()),
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

    /// Whether a login may be tried now (fewer than [`MAX_FAILURES`]
    /// failures in the last [`FAILURE_WINDOW`]).
    pub fn login_allowed(&self) -> bool {
        let now = Instant::now();
        let mut inner = self.lock();
        while inner
            .failures
            .front()
            .is_some_and(|t| now.duration_since(*t) >= FAILURE_WINDOW)
        {
            inner.failures.pop_front();
        }
        inner.failures.len() < MAX_FAILURES
    }

    /// Counts a failed login.
    pub fn login_failed(&self) {
        let mut inner = self.lock();
        inner.failures.push_back(Instant::now());
        while inner.failures.len() > MAX_FAILURES {
            inner.failures.pop_front();
        }
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
    fn failed_logins_are_limited() {
        let s = Sessions::new(settings(1000, 1000));
        for _ in 0..MAX_FAILURES {
            assert!(s.login_allowed());
            s.login_failed();
        }
        assert!(!s.login_allowed());
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
