//! NOID-style identifier minting, as CDL's Noid tool does it for ARKs.
//!
//! An ark minted here reads `ark:/NAAN/SHOULDERBLADEC`: the NAAN (the
//! organisation's number), a shoulder (a prefix a collection or a
//! repository owns, such as `fk4`), a blade of `blade_len` characters and a
//! check character, like Noid's template `SHOULDER.reeee…k`.
//!
//! The check character is the NOID Check Digit Algorithm (NCDA): over the
//! string `NAAN/SHOULDERBLADE`, the sum of each character's position
//! (1-based) times its ordinal in [`ALPHABET`] (characters outside it,
//! such as `/`, count 0), modulo 29. It catches every single-character
//! error and every transposition of two characters.
//!
//! ```
//! use ingest_steps::noid::{check_char, verify};
//!
//! assert_eq!(check_char("13030/xf93gt2"), 'q');
//! assert!(verify("ark:/13030/xf93gt2q"));
//! ```

use std::fmt;

/// The 29 "betanumeric" characters of NOID: digits and consonants except
/// `l`, which reads like `1`. A character's ordinal is its index here.
pub const ALPHABET: &str = "0123456789bcdfghjkmnpqrstvwxz";

/// The alphabet as bytes, for indexing.
const ALPHABET_BYTES: &[u8; 29] = b"0123456789bcdfghjkmnpqrstvwxz";

/// The radix of blades and the modulus of the check character.
const RADIX: u64 = 29;

/// The longest blade: 29^13 is the largest power of 29 below 2^64.
pub const MAX_BLADE_LEN: usize = 13;

/// The longest shoulder [`Minter::open`] accepts.
pub const MAX_SHOULDER_LEN: usize = 10;

/// The constants of the two affine rounds that scramble the counter (see
/// [`blade`]). Each multiplier is not a multiple of 29, so it is coprime
/// with every 29^k and its round permutes the blade space. They are part of
/// the stored format: changing one would change every future ark and could
/// repeat a past one.
#[cfg(feature = "store")]
const ROUNDS: [(u64, u64); 2] = [
    (0x9E37_79B9_7F4A_7C15, 0x2545_F491_4F6C_DD1D),
    (0xD6E8_FEB8_6659_FD93, 0x5851_F42D_4C95_7F2D),
];

/// Errors of minting and of reading arks.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NoidError {
    /// The NAAN is not five or more ASCII digits.
    ///
    /// ### Handling
    /// A configuration error: report it at start-up; do not retry.
    #[error("invalid NAAN {naan:?}: expected 5 or more digits")]
    InvalidNaan {
        /// The NAAN as given.
        naan: String,
    },

    /// The shoulder is empty, too long, starts with a digit or has a
    /// character outside [`ALPHABET`].
    ///
    /// ### Handling
    /// A configuration error: report it at start-up; do not retry.
    #[error("invalid shoulder {shoulder:?}: {reason}")]
    InvalidShoulder {
        /// The shoulder as given.
        shoulder: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// The blade length is 0 or more than [`MAX_BLADE_LEN`].
    ///
    /// ### Handling
    /// A configuration error: report it at start-up; do not retry.
    #[error("invalid blade length {blade_len}: expected 1 to {MAX_BLADE_LEN}")]
    InvalidBladeLength {
        /// The length as given.
        blade_len: usize,
    },

    /// Every ark of this shoulder and blade length has been minted.
    ///
    /// ### Handling
    /// Permanent: stop minting on this shoulder and configure a longer
    /// blade or a new shoulder. Retrying gives the same error.
    #[error("ark space of {naan}/{shoulder} with {blade_len}-character blades is exhausted ({capacity} arks minted)")]
    Exhausted {
        /// The NAAN.
        naan: String,
        /// The shoulder.
        shoulder: String,
        /// The blade length.
        blade_len: usize,
        /// How many arks the space holds.
        capacity: u64,
    },

    /// The stored counter is not an 8-byte big-endian integer.
    ///
    /// ### Handling
    /// The minter's tree is damaged or another program wrote the key: stop
    /// minting and investigate; minting past it could repeat arks.
    #[error("corrupt NOID counter at key {key:?}: expected 8 bytes, found {len}")]
    CorruptCounter {
        /// The counter's key.
        key: String,
        /// The length of the stored value.
        len: usize,
    },

    /// sled failed to read, update or flush the counter.
    ///
    /// ### Handling
    /// An I/O failure: the counter may or may not have moved, but no ark
    /// was handed out, so retrying is safe (at worst it skips one ark).
    /// Stop if it persists.
    #[cfg(feature = "store")]
    #[error("NOID counter storage failed: {0}")]
    Storage(#[from] sled::Error),

    /// The text is not an ark: it does not start with `ark:`.
    ///
    /// ### Handling
    /// The input is the caller's to fix; reject it with this message.
    #[error("not an ark: {input:?} does not start with \"ark:\"")]
    NotArk {
        /// The text as given.
        input: String,
    },

    /// The text starts with `ark:` but is not `ark:/NAAN/NAME`.
    ///
    /// ### Handling
    /// The input is the caller's to fix; reject it with this message.
    #[error("malformed ark {input:?}: {reason}")]
    MalformedArk {
        /// The text as given.
        input: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// The NCDA check character of `s` (for an ark, `NAAN/NAME` without the
/// `ark:/` label).
///
/// Characters outside [`ALPHABET`] count 0 but still take a position.
pub fn check_char(s: &str) -> char {
    let sum = s
        .chars()
        .enumerate()
        .map(|(i, c)| ((i as u64 + 1) % RADIX) * ordinal(c))
        .fold(0u64, |acc, x| (acc + x) % RADIX);
    alphabet_char(sum)
}

/// Whether `ark` ends with the right check character.
///
/// Accepts `ark:/NAAN/NAME`, `ark:NAAN/NAME` or the bare `NAAN/NAME`; the
/// check covers everything after the label, so an ark with a qualifier
/// (`/c1`, `.pdf`) after the check character does not verify.
pub fn verify(ark: &str) -> bool {
    let body = strip_label(ark).unwrap_or(ark);
    let mut chars = body.chars();
    match chars.next_back() {
        Some(last) => !chars.as_str().is_empty() && check_char(chars.as_str()) == last,
        None => false,
    }
}

/// An ark split into its NAAN and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Ark {
    /// The Name Assigning Authority Number, e.g. `13030`.
    pub naan: String,
    /// Everything after the NAAN's `/`, e.g. `m5abc12q` (with any
    /// qualifiers).
    pub name: String,
}

impl fmt::Display for Ark {
    /// The canonical form `ark:/NAAN/NAME`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ark:/{}/{}", self.naan, self.name)
    }
}

/// Whether `s` parses as an ark (see [`parse_ark`]).
pub fn is_ark(s: &str) -> bool {
    parse_ark(s).is_ok()
}

/// Parses `ark:/NAAN/NAME` or `ark:NAAN/NAME` (the label in any case).
///
/// The NAAN must be ASCII letters and digits; the name must be non-empty
/// and have no whitespace or control characters. The check character is
/// not verified: use [`verify`] for arks minted with one.
///
/// # Errors
/// [`NoidError::NotArk`] without the `ark:` label,
/// [`NoidError::MalformedArk`] for the rest.
pub fn parse_ark(s: &str) -> Result<Ark, NoidError> {
    let body = strip_label(s).ok_or_else(|| NoidError::NotArk {
        input: s.to_string(),
    })?;
    let malformed = |reason| NoidError::MalformedArk {
        input: s.to_string(),
        reason,
    };
    let (naan, name) = body
        .split_once('/')
        .ok_or_else(|| malformed("expected ark:/NAAN/NAME"))?;
    if naan.is_empty() || !naan.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(malformed("the NAAN must be ASCII letters and digits"));
    }
    if name.is_empty() {
        return Err(malformed("the name after the NAAN is empty"));
    }
    if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(malformed(
            "the name contains whitespace or a control character",
        ));
    }
    Ok(Ark {
        naan: naan.to_string(),
        name: name.to_string(),
    })
}

/// Mints arks on one shoulder, keeping its counter in a sled tree.
///
/// Each [`Minter::mint`] takes the next counter value atomically and
/// flushes before handing out the ark, so an ark is never handed out twice,
/// across restarts and across minters sharing the tree.
#[cfg(feature = "store")]
#[derive(Debug, Clone)]
pub struct Minter {
    tree: sled::Tree,
    naan: String,
    shoulder: String,
    blade_len: usize,
    key: String,
    capacity: u64,
}

#[cfg(feature = "store")]
impl Minter {
    /// A minter for `ark:/NAAN/SHOULDER…` with blades of `blade_len`
    /// characters (29^`blade_len` arks in all).
    ///
    /// The counter lives under the key `noid/NAAN/SHOULDER/counter`, so two
    /// minters for the same shoulder share it. One opened again with
    /// another blade length continues the same counter; its arks have
    /// another length, so they cannot repeat earlier ones.
    ///
    /// # Errors
    /// [`NoidError::InvalidNaan`], [`NoidError::InvalidShoulder`] or
    /// [`NoidError::InvalidBladeLength`].
    ///
    /// # Cautions
    /// Shoulders that are prefixes of each other (`fk4` and `fk4b`) can
    /// mint the same ark from their separate counters. Noid's convention
    /// avoids this: a shoulder is letters followed by one digit.
    pub fn open(
        tree: sled::Tree,
        naan: &str,
        shoulder: &str,
        blade_len: usize,
    ) -> Result<Minter, NoidError> {
        validate_naan(naan)?;
        validate_shoulder(shoulder)?;
        if blade_len == 0 || blade_len > MAX_BLADE_LEN {
            return Err(NoidError::InvalidBladeLength { blade_len });
        }
        Ok(Minter {
            tree,
            key: format!("noid/{naan}/{shoulder}/counter"),
            naan: naan.to_string(),
            shoulder: shoulder.to_string(),
            blade_len,
            capacity: RADIX.pow(blade_len as u32),
        })
    }

    /// How many arks this shoulder and blade length hold.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Mints the next ark, e.g. `ark:/99999/fk4wp17zz0t` (the first ark of a
    /// new `99999`/`fk4` minter with 7-character blades).
    ///
    /// # Errors
    /// [`NoidError::Exhausted`] once every ark is used,
    /// [`NoidError::CorruptCounter`] or [`NoidError::Storage`].
    pub fn mint(&self) -> Result<String, NoidError> {
        let counter = self.take_counter()?;
        let body = format!(
            "{}/{}{}",
            self.naan,
            self.shoulder,
            blade(counter, self.blade_len, self.capacity)
        );
        let check = check_char(&body);
        Ok(format!("ark:/{body}{check}"))
    }

    /// Takes the next counter value and makes the take durable.
    fn take_counter(&self) -> Result<u64, NoidError> {
        let capacity = self.capacity;
        let previous = self.tree.fetch_and_update(self.key.as_bytes(), |old| {
            match old.map(decode_counter) {
                // Leave a full or unreadable counter as it is; the checks
                // below report it.
                Some(Some(n)) if n >= capacity => old.map(<[u8]>::to_vec),
                Some(None) => old.map(<[u8]>::to_vec),
                Some(Some(n)) => Some((n + 1).to_be_bytes().to_vec()),
                None => Some(1u64.to_be_bytes().to_vec()),
            }
        })?;
        let counter = match previous.as_deref() {
            None => 0,
            Some(bytes) => decode_counter(bytes).ok_or_else(|| NoidError::CorruptCounter {
                key: self.key.clone(),
                len: bytes.len(),
            })?,
        };
        if counter >= capacity {
            return Err(NoidError::Exhausted {
                naan: self.naan.clone(),
                shoulder: self.shoulder.clone(),
                blade_len: self.blade_len,
                capacity,
            });
        }
        self.tree.flush()?;
        Ok(counter)
    }
}

/// The blade for a counter value, `blade_len` characters of base 29, most
/// significant first.
///
/// The counter goes through an affine round (`x * m + o mod 29^k`), a
/// reversal of its base-29 digits and a second affine round. Each step is a
/// permutation of `0..29^k`, so distinct counters give distinct blades,
/// while consecutive counters give blades that do not look consecutive.
#[cfg(feature = "store")]
fn blade(counter: u64, blade_len: usize, capacity: u64) -> String {
    let [first, second] = ROUNDS;
    let scrambled = affine(counter, first, capacity);
    let scrambled = from_digits(&reversed(to_digits(scrambled, blade_len)));
    let scrambled = affine(scrambled, second, capacity);
    to_digits(scrambled, blade_len)
        .into_iter()
        .map(alphabet_char)
        .collect()
}

/// `(x * multiplier + offset) mod capacity`, without overflow.
#[cfg(feature = "store")]
fn affine(x: u64, (multiplier, offset): (u64, u64), capacity: u64) -> u64 {
    let capacity = u128::from(capacity);
    let result = (u128::from(x) * u128::from(multiplier) + u128::from(offset)) % capacity;
    // `result < capacity <= 29^13 < 2^64`, so the fallback is unreachable.
    u64::try_from(result).unwrap_or(0)
}

/// The `len` base-29 digits of `value`, most significant first.
#[cfg(feature = "store")]
fn to_digits(mut value: u64, len: usize) -> Vec<u64> {
    let mut digits = vec![0; len];
    for slot in digits.iter_mut().rev() {
        *slot = value % RADIX;
        value /= RADIX;
    }
    digits
}

#[cfg(feature = "store")]
fn from_digits(digits: &[u64]) -> u64 {
    digits.iter().fold(0, |acc, &d| acc * RADIX + d)
}

#[cfg(feature = "store")]
fn reversed(mut digits: Vec<u64>) -> Vec<u64> {
    digits.reverse();
    digits
}

#[cfg(feature = "store")]
fn decode_counter(bytes: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(bytes).ok().map(u64::from_be_bytes)
}

/// The ordinal of `c` in [`ALPHABET`], 0 outside it.
fn ordinal(c: char) -> u64 {
    ALPHABET.find(c).map_or(0, |i| i as u64)
}

/// The character of `ALPHABET` at `index % 29`.
fn alphabet_char(index: u64) -> char {
    let i = (index % RADIX) as usize;
    ALPHABET_BYTES.get(i).map_or('0', |&b| char::from(b))
}

/// The text after a case-insensitive `ark:` or `ark:/` label.
fn strip_label(s: &str) -> Option<&str> {
    let label = s.get(..4)?;
    if !label.eq_ignore_ascii_case("ark:") {
        return None;
    }
    let rest = s.get(4..)?;
    Some(rest.strip_prefix('/').unwrap_or(rest))
}

#[cfg(feature = "store")]
fn validate_naan(naan: &str) -> Result<(), NoidError> {
    if naan.len() >= 5 && naan.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(());
    }
    Err(NoidError::InvalidNaan {
        naan: naan.to_string(),
    })
}

#[cfg(feature = "store")]
fn validate_shoulder(shoulder: &str) -> Result<(), NoidError> {
    let invalid = |reason| NoidError::InvalidShoulder {
        shoulder: shoulder.to_string(),
        reason,
    };
    if shoulder.is_empty() || shoulder.chars().count() > MAX_SHOULDER_LEN {
        return Err(invalid("expected 1 to 10 characters"));
    }
    if !shoulder.chars().all(|c| ALPHABET.contains(c)) {
        return Err(invalid(
            "expected only the characters 0123456789bcdfghjkmnpqrstvwxz",
        ));
    }
    if shoulder.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(invalid("expected a letter first"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blade_is_a_permutation_of_small_spaces() {
        for len in 1..=3 {
            let capacity = RADIX.pow(len as u32);
            let mut seen: Vec<String> = (0..capacity).map(|n| blade(n, len, capacity)).collect();
            seen.sort();
            seen.dedup();
            assert_eq!(seen.len() as u64, capacity, "blade length {len}");
        }
    }

    #[test]
    fn largest_blade_fits() {
        let capacity = RADIX.pow(MAX_BLADE_LEN as u32);
        assert_eq!(blade(capacity - 1, MAX_BLADE_LEN, capacity).len(), 13);
    }
}
