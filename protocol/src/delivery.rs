//! The names of finished containers in the delivery area (issue 24): a
//! container is stored as `<expires>-<secret>.<ext>`, where `expires` is
//! the Unix second after which it is no longer served, `secret` 32
//! lowercase hex digits of fresh randomness (so the URL cannot be guessed)
//! and `ext` the container's (`zip`, `tar`, `tar.gz`). The worker writes
//! the name, `ingest serve` serves `GET /deliveries/<name>` until the
//! expiry (410 after) and the janitor removes an expired file: all three
//! read the expiry from the name, so no lookup is needed to refuse or
//! remove one.

/// The URL path under which deliveries are served.
pub const DELIVERY_PATH: &str = "/deliveries";

/// The container extensions a delivery name may end with.
const EXTENSIONS: [&str; 3] = ["zip", "tar", "tar.gz"];

/// A delivery's file name from its expiry, secret and extension.
pub fn name(expires_unix: i64, secret: &[u8; 16], extension: &str) -> String {
    format!("{expires_unix}-{}.{extension}", hex::encode(secret))
}

/// The expiry (Unix seconds) of a well-formed delivery name; `None` for
/// anything else (a hostile or foreign name is never opened).
pub fn expiry(name: &str) -> Option<i64> {
    let (expires, rest) = name.split_once('-')?;
    if expires.is_empty() || expires.len() > 12 || !expires.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (secret, extension) = rest.split_once('.')?;
    if secret.len() != 32
        || !secret
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        || !EXTENSIONS.contains(&extension)
    {
        return None;
    }
    expires.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_their_expiry_and_nothing_else_parses() {
        let n = name(1_900_000_000, &[0xab; 16], "tar.gz");
        assert_eq!(n, format!("1900000000-{}.tar.gz", "ab".repeat(16)));
        assert_eq!(expiry(&n), Some(1_900_000_000));
        for bad in [
            "",
            "x-abababababababababababababababab.zip",
            "1-ABABABABABABABABABABABABABABABAB.zip",
            "1-abab.zip",
            "1-abababababababababababababababab.exe",
            "1-abababababababababababababababab",
            "../1-abababababababababababababababab.zip",
            "1-abababababababababababababababab.zip/..",
        ] {
            assert_eq!(expiry(bad), None, "{bad}");
        }
    }
}
