//! Identifiers allocated by the engine from the log.
//!
//! Batch and job ids are `bid` / `jid` followed by ten decimal digits, as
//! DESIGN.md fixes them. They are recorded in the events, so a rebuilt tree
//! carries the same ids: allocated from the log, or in adoption mode given
//! by the command (`Command::WithIds`, ids from ZooKeeper's sequential
//! counters, shared with mrt-zk).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The number of digits after the prefix.
const DIGITS: usize = 10;

/// An id string that does not have the `bid`/`jid` + 10 digits form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{input:?} is not a {kind} id (expected {prefix} followed by {DIGITS} digits, e.g. {prefix}0000000001)")]
pub struct ParseIdError {
    /// What was given.
    pub input: String,
    /// `batch` or `job`.
    pub kind: &'static str,
    /// `bid` or `jid`.
    pub prefix: &'static str,
}

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $prefix:literal, $kind:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub struct $name(pub u64);

        impl $name {
            /// The textual prefix of this kind of id.
            pub const PREFIX: &'static str = $prefix;

            /// The id that follows this one.
            pub fn next(self) -> Self {
                Self(self.0 + 1)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}{:0width$}", $prefix, self.0, width = DIGITS)
            }
        }

        impl FromStr for $name {
            type Err = ParseIdError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                let err = || ParseIdError { input: s.to_string(), kind: $kind, prefix: $prefix };
                let digits = s.strip_prefix($prefix).ok_or_else(err)?;
                if digits.len() != DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(err());
                }
                let n: u64 = digits.parse().map_err(|_| err())?;
                if n == 0 {
                    return Err(err());
                }
                Ok(Self(n))
            }
        }
    };
}

id_type!(
    /// A batch id, e.g. `bid0000000001`.
    Bid,
    "bid",
    "batch"
);
id_type!(
    /// A job id, e.g. `jid0000000001`.
    Jid,
    "jid",
    "job"
);
id_type!(
    /// An access (assembly) request id, e.g. `qid0000000001`: mrt-zk's
    /// `qid` prefix of `/access/{small,large}/qid…`, allocated from the log
    /// like the others.
    Qid,
    "qid",
    "access request"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_through_text() {
        assert_eq!(Bid(1).to_string(), "bid0000000001");
        assert_eq!("jid0000000042".parse::<Jid>(), Ok(Jid(42)));
        assert_eq!(Jid(9_999_999_999).to_string(), "jid9999999999");
    }

    #[test]
    fn malformed_ids_are_rejected_with_the_expected_form() {
        for bad in [
            "",
            "bid1",
            "jid0000000001",
            "bid000000000a",
            "bid00000000001",
            "bid0000000000",
        ] {
            let err = bad.parse::<Bid>().unwrap_err();
            assert!(err.to_string().contains("bid0000000001"), "{err}");
        }
    }
}
