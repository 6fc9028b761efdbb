//! How far an assembly got, told to an observer while it runs: the target
//! being read, and the object files and bytes packed so far. The access
//! daemon passes it on to the engine, where operators see it beside the
//! request.

/// How far an assembly got on one target (a failover starts again at zero
/// on the next).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// The target being read.
    pub target: String,
    /// The files packed whole.
    pub files: u64,
    /// The bytes of stored files read (and checked) so far.
    pub bytes: u64,
}

/// Told the [`Progress`] when a target is first read, after each file, and
/// every [`TELL_EVERY`] bytes within a file. Called on the assembling
/// thread: it must be quick (the access daemon's sends on a channel).
pub type Observer<'a> = &'a (dyn Fn(&Progress) + Sync);

/// Within a long file, the bytes read between two tellings.
pub const TELL_EVERY: u64 = 8 << 20;

/// Counts what an assembly reads and tells the observer.
pub(crate) struct Meter<'a> {
    observe: Option<Observer<'a>>,
    now: Progress,
    told: u64,
}

impl<'a> Meter<'a> {
    /// A meter that tells nobody.
    pub(crate) fn silent() -> Meter<'static> {
        Meter {
            observe: None,
            now: Progress::default(),
            told: 0,
        }
    }

    /// A meter of an assembly reading `target`; tells `observe` at once.
    pub(crate) fn start(observe: Option<Observer<'a>>, target: &str) -> Meter<'a> {
        let mut meter = Meter {
            observe,
            now: Progress {
                target: target.to_string(),
                files: 0,
                bytes: 0,
            },
            told: 0,
        };
        meter.tell();
        meter
    }

    /// `n` more bytes of a stored file were read.
    pub(crate) fn read(&mut self, n: u64) {
        self.now.bytes += n;
        if self.now.bytes - self.told >= TELL_EVERY {
            self.tell();
        }
    }

    /// One more file was packed whole.
    pub(crate) fn file_done(&mut self) {
        self.now.files += 1;
        self.tell();
    }

    fn tell(&mut self) {
        self.told = self.now.bytes;
        if let Some(observe) = self.observe {
            observe(&self.now);
        }
    }
}

impl std::fmt::Debug for Meter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Meter")
            .field("observed", &self.observe.is_some())
            .field("now", &self.now)
            .finish()
    }
}
