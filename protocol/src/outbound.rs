//! The outbound policy: which URLs `ingest` may fetch from (payloads,
//! manifests, containers) or post to (callbacks), shared by the server,
//! which checks every payload URL of a submission at the door, and the
//! workers, which check every connection and every redirect.
//!
//! By default a destination is refused when its address is loopback,
//! private (RFC 1918, ULA `fc00::/7`), link-local, multicast, unspecified,
//! shared (CGNAT `100.64.0.0/10`), broadcast, reserved, documentation or
//! benchmarking space, or an IPv6 form that embeds such an IPv4 address
//! (IPv4-mapped, IPv4-compatible, NAT64, 6to4). `--allow-host` and
//! `--allow-network` open what a site needs. A network rule may name one
//! port (`127.0.0.1:8080`, `10.0.0.0/8:443`, `[::1]:8080`,
//! `[fd00::/8]:443`): it then opens only that port, so a rule for a payload
//! server on loopback does not open ZooKeeper's port beside it. A port-bound
//! rule opens URLs whose host is a literal address; a host name resolved to
//! an address only such a rule opens stays refused (the resolver does not
//! know the port it resolves for), so names need a port-less rule or
//! `--allow-host`.
//!
//! This module knows no network: it parses URLs (with the `url` crate,
//! which also reads the decimal, hexadecimal, octal and short forms of an
//! IPv4 host, `http://2130706433/` being `http://127.0.0.1/`) and judges
//! addresses. Host names are judged after DNS resolution by the worker's
//! resolver; a submission's host names are not resolved
//! ([`OutboundPolicy::check_url`] checks only literal addresses).
//!
//! A refusal reads "refused by outbound policy" and never says what (if
//! anything) answers at the destination, so that refusals cannot be used to
//! scan the network.
//!
//! ```
//! use ingest_protocol::outbound::OutboundPolicy;
//!
//! let policy = OutboundPolicy::default();
//! assert!(policy.check_url("https://example.org/a.zip").is_ok());
//! assert!(policy.check_url("http://2130706433/").is_err());
//! let site = OutboundPolicy::new(&[], &["127.0.0.0/8".into()], None).unwrap();
//! assert!(site.check_url("http://127.1:8080/a").is_ok());
//! ```

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

pub use ipnet::IpNet;
pub use url::{Host, Url};

/// What a depositor reads when a destination is refused.
pub const REFUSED: &str = "refused by outbound policy";

/// The policy: the allow rules and the root of `file://` URLs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutboundPolicy {
    /// Host names (lower case, no trailing dot) whose addresses are all
    /// allowed; `*.example.org` allows every name under `example.org`.
    allow_hosts: Vec<String>,
    /// Networks whose addresses are allowed: on every port (`None`) or on
    /// one port.
    allow_networks: Vec<(IpNet, Option<u16>)>,
    /// The root `file://` URLs must lie under (none: `file://` refused),
    /// as configured (made absolute).
    file_root: Option<PathBuf>,
    /// The same root with its symbolic links resolved, when it exists (a
    /// URL may name either).
    file_root_resolved: Option<PathBuf>,
}

/// A bad allow rule.
///
/// ### Handling
/// A configuration error: refuse to start, naming the option.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// `--allow-network` is not a CIDR (`10.1.0.0/16`, `fd00::/8`) or an
    /// address, with an optional port (`10.1.0.0/16:443`, `[fd00::/8]:443`).
    #[error("--allow-network {0:?} is not a network (ADDRESS/PREFIX or ADDRESS, with an optional :PORT, e.g. 10.1.0.0/16, 127.0.0.1:8080, [::1]:8080)")]
    Network(String),
    /// `--allow-host` is empty or not a host name.
    #[error("--allow-host {0:?} is not a host name (NAME or *.DOMAIN)")]
    Host(String),
}

/// Why a URL is refused.
///
/// ### Handling
/// At submission: 422 naming the field. In a worker: a permanent failure
/// of the step (trying again gives the same answer). The messages do not
/// quote the URL; callers name it, cut.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UrlError {
    /// Not a URL at all.
    #[error("is not a URL ({0})")]
    Syntax(String),
    /// A scheme other than `http`, `https` (and `file` with a file root).
    #[error("has the scheme {scheme:?}; only {accepted} are accepted")]
    Scheme {
        /// The scheme given (bounded: a URL scheme is short by syntax,
        /// cut anyway).
        scheme: String,
        /// The schemes accepted here.
        accepted: &'static str,
    },
    /// `file://` without a configured root.
    #[error("is a file URL, refused: no file root is configured (--file-root)")]
    FileRootless,
    /// `file://` outside the configured root.
    #[error("is a file URL that is not under the file root")]
    FileOutside,
    /// An `http(s)` URL without a host.
    #[error("has no host")]
    NoHost,
    /// The destination's address (or, for a redirect, its scheme) is
    /// refused by the policy. Says nothing of what answers there.
    #[error("{REFUSED}")]
    Refused,
}

impl OutboundPolicy {
    /// A policy with `allow_hosts` (`NAME` or `*.DOMAIN`), `allow_networks`
    /// (`ADDRESS/PREFIX` or a single address, each with an optional `:PORT`;
    /// an IPv6 one with a port in brackets, `[::1]:8080`) and the `file://`
    /// root.
    ///
    /// # Errors
    /// [`PolicyError`] naming the first rule that does not parse.
    pub fn new(
        allow_hosts: &[String],
        allow_networks: &[String],
        file_root: Option<&Path>,
    ) -> Result<OutboundPolicy, PolicyError> {
        let mut hosts = Vec::with_capacity(allow_hosts.len());
        for h in allow_hosts {
            let name = normalize_host(h);
            let bare = name.strip_prefix("*.").unwrap_or(&name);
            let valid = !bare.is_empty()
                && bare.len() <= 253
                && bare
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | ':' | '_'));
            if !valid {
                return Err(PolicyError::Host(crate::cut(h, 100).into_owned()));
            }
            hosts.push(name);
        }
        let mut networks = Vec::with_capacity(allow_networks.len());
        for n in allow_networks {
            let (net, port) = parse_network_rule(n.trim())
                .ok_or_else(|| PolicyError::Network(crate::cut(n, 100).into_owned()))?;
            networks.push((net.trunc(), port));
        }
        let file_root =
            file_root.map(|r| std::path::absolute(r).unwrap_or_else(|_| r.to_path_buf()));
        let file_root_resolved = file_root.as_deref().and_then(|r| r.canonicalize().ok());
        Ok(OutboundPolicy {
            allow_hosts: hosts,
            allow_networks: networks,
            file_root,
            file_root_resolved,
        })
    }

    /// The root of `file://` URLs, if any.
    pub fn file_root(&self) -> Option<&Path> {
        self.file_root.as_deref()
    }

    /// Whether `host` (a name as it appears in a URL) is allowed by an
    /// `--allow-host` rule, whatever its addresses.
    pub fn allows_host(&self, host: &str) -> bool {
        let host = normalize_host(host);
        self.allow_hosts
            .iter()
            .any(|rule| match rule.strip_prefix("*.") {
                Some(domain) => host
                    .strip_suffix(domain)
                    .is_some_and(|head| head.ends_with('.')),
                None => *rule == host,
            })
    }

    /// Whether `ip` is allowed on every port: in a network of a rule
    /// without a port, or of no refused class. This is what the workers'
    /// resolver asks of a host name's addresses (it does not know the port).
    pub fn allows_ip(&self, ip: IpAddr) -> bool {
        self.allows_ip_port(ip, None)
    }

    /// Whether a connection to `ip` on `port` is allowed: in a network of a
    /// rule without a port or with this port, or of no refused class.
    pub fn allows(&self, ip: IpAddr, port: u16) -> bool {
        self.allows_ip_port(ip, Some(port))
    }

    fn allows_ip_port(&self, ip: IpAddr, port: Option<u16>) -> bool {
        let embedded = embedded_v4(ip).map(IpAddr::V4);
        let allowed = |a: IpAddr| {
            self.allow_networks.iter().any(|(n, p)| {
                n.contains(&a)
                    && match p {
                        None => true,
                        Some(p) => port == Some(*p),
                    }
            })
        };
        if allowed(ip) || embedded.is_some_and(allowed) {
            return true;
        }
        refused_class(ip).is_none()
    }

    /// Checks a URL a depositor gives (a payload URL) or a worker is about
    /// to fetch: its syntax, its scheme (`http`, `https`, and `file` only
    /// under the file root, checked on the path as written) and, for a
    /// literal address host in any form, the address classes. Host names
    /// are not resolved here.
    ///
    /// # Errors
    /// [`UrlError`] saying what is wrong.
    pub fn check_url(&self, text: &str) -> Result<Url, UrlError> {
        let url = Url::parse(text.trim())
            .map_err(|e| UrlError::Syntax(crate::cut(&e.to_string(), 200).into_owned()))?;
        match url.scheme() {
            "http" | "https" => {
                self.check_host(&url)?;
                Ok(url)
            }
            "file" => {
                let root = self.file_root.as_deref().ok_or(UrlError::FileRootless)?;
                let path = url.to_file_path().map_err(|()| UrlError::FileOutside)?;
                let resolved = self.file_root_resolved.as_deref();
                // On the path as written (`Url` has removed `.` and `..`);
                // the worker checks it again with its links resolved.
                if path.starts_with(root) || resolved.is_some_and(|r| path.starts_with(r)) {
                    Ok(url)
                } else {
                    Err(UrlError::FileOutside)
                }
            }
            other => Err(UrlError::Scheme {
                scheme: crate::cut(other, 40).into_owned(),
                accepted: if self.file_root.is_some() {
                    "http, https and file"
                } else {
                    "http and https"
                },
            }),
        }
    }

    /// Checks one hop of a redirect from `from` to `to`: only to `http` or
    /// `https` (never from `https` down to `http`), and a literal address
    /// host by its class (host names are checked when they are resolved).
    ///
    /// # Errors
    /// [`UrlError::Refused`].
    pub fn check_redirect(&self, from: &Url, to: &Url) -> Result<(), UrlError> {
        let scheme_ok = matches!(
            (from.scheme(), to.scheme()),
            ("http", "http" | "https") | ("https", "https")
        );
        if !scheme_ok {
            return Err(UrlError::Refused);
        }
        self.check_host(to)
    }

    /// An `http(s)` URL's host: a literal address by its class, a name
    /// allowed unless it is `localhost` (or under it, RFC 6761).
    fn check_host(&self, url: &Url) -> Result<(), UrlError> {
        let host = url.host().ok_or(UrlError::NoHost)?;
        if let Some(text) = url.host_str() {
            if self.allows_host(text.trim_start_matches('[').trim_end_matches(']')) {
                return Ok(());
            }
        }
        // `http` and `https` always have a known default port.
        let port = url.port_or_known_default().unwrap_or(0);
        let allowed = match host {
            Host::Ipv4(ip) => self.allows(IpAddr::V4(ip), port),
            Host::Ipv6(ip) => self.allows(IpAddr::V6(ip), port),
            Host::Domain(name) => {
                let name = normalize_host(name);
                name != "localhost" && !name.ends_with(".localhost")
            }
        };
        if allowed {
            Ok(())
        } else {
            Err(UrlError::Refused)
        }
    }
}

/// One `--allow-network` rule: `NET`, `NET:PORT` (IPv4), `[NET]:PORT` or
/// `[NET]` (IPv6; a bare IPv6 network takes no port, its colons being its
/// own). `NET` is `ADDRESS/PREFIX` or an address; the port is 1–65535.
fn parse_network_rule(text: &str) -> Option<(IpNet, Option<u16>)> {
    let net = |t: &str| {
        t.parse::<IpNet>()
            .ok()
            .or_else(|| t.parse::<IpAddr>().ok().map(IpNet::from))
    };
    let port = |t: &str| t.parse::<u16>().ok().filter(|p| *p != 0);
    if let Some(rest) = text.strip_prefix('[') {
        let (inner, after) = rest.split_once(']')?;
        let n = net(inner)?;
        return match after {
            "" => Some((n, None)),
            p => Some((n, Some(port(p.strip_prefix(':')?)?))),
        };
    }
    match text.matches(':').count() {
        1 => {
            let (n, p) = text.split_once(':')?;
            let n = net(n).filter(|n| matches!(n, IpNet::V4(_)))?;
            Some((n, Some(port(p)?)))
        }
        _ => Some((net(text)?, None)),
    }
}

fn normalize_host(host: &str) -> String {
    host.trim().trim_end_matches('.').to_ascii_lowercase()
}

/// The class an address is refused for by default, or `None` when it is a
/// public address. IPv6 forms that embed an IPv4 address are judged by
/// that address.
pub fn refused_class(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => v4_class(v4),
        IpAddr::V6(v6) => match embedded_v4(ip) {
            Some(v4) => v4_class(v4),
            None => v6_class(v6),
        },
    }
}

fn v4_class(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(match (a, b, c) {
        _ if ip.is_broadcast() => "broadcast",
        (0, _, _) => "unspecified",
        (10, _, _) | (172, 16..=31, _) | (192, 168, _) => "private",
        (100, 64..=127, _) => "shared (CGNAT)",
        (127, _, _) => "loopback",
        (169, 254, _) => "link-local",
        (192, 0, 0) => "protocol assignments",
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => "documentation",
        (198, 18..=19, _) => "benchmarking",
        (224..=239, _, _) => "multicast",
        (240..=255, _, _) => "reserved",
        _ => return None,
    })
}

fn v6_class(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    Some(match s {
        _ if ip.is_unspecified() => "unspecified",
        _ if ip.is_loopback() => "loopback",
        [0xfc00..=0xfdff, ..] => "private",
        [0xfe80..=0xfebf, ..] => "link-local",
        [0xfec0..=0xfeff, ..] => "site-local",
        [0xff00..=0xffff, ..] => "multicast",
        [0x2001, 0x0db8, ..] => "documentation",
        [0x2001, 0, ..] => "Teredo",
        [0x0100, 0, 0, 0, ..] => "discard",
        [0x0064, 0xff9b, 1, ..] => "private",
        // Any other address under ::/8 is reserved (the embedded forms are
        // judged before this).
        [0, ..] => "reserved",
        _ => return None,
    })
}

/// The IPv4 address an IPv6 address carries: IPv4-mapped
/// (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`, not `::` or `::1`),
/// NAT64 (`64:ff9b::a.b.c.d`) or 6to4 (`2002:AABB:CCDD::`).
pub fn embedded_v4(ip: IpAddr) -> Option<Ipv4Addr> {
    let IpAddr::V6(v6) = ip else { return None };
    let s = v6.segments();
    let tail = || {
        let [.., a, b, c, d] = v6.octets();
        Ipv4Addr::new(a, b, c, d)
    };
    match s {
        [0, 0, 0, 0, 0, 0xffff, _, _] => Some(tail()),
        [0, 0, 0, 0, 0, 0, _, _] if !v6.is_unspecified() && !v6.is_loopback() => Some(tail()),
        [0x0064, 0xff9b, 0, 0, 0, 0, _, _] => Some(tail()),
        [0x2002, hi, lo, ..] => {
            let [a, b] = hi.to_be_bytes();
            let [c, d] = lo.to_be_bytes();
            Some(Ipv4Addr::new(a, b, c, d))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(policy: &OutboundPolicy, url: &str) {
        assert_eq!(policy.check_url(url), Err(UrlError::Refused), "{url}");
    }

    #[test]
    fn every_refused_class_is_refused_in_every_literal_form() {
        let p = OutboundPolicy::default();
        for url in [
            "http://127.0.0.1/",
            "http://127.0.0.2:8080/x",
            "http://2130706433/",
            "http://0x7f000001/",
            "http://0177.0.0.1/",
            "http://127.1/",
            "http://0.0.0.0/",
            "http://0/",
            "http://10.1.2.3/",
            "http://172.16.0.1/",
            "http://192.168.1.1/",
            "http://100.64.0.1/",
            "http://169.254.169.254/latest/meta-data",
            "http://224.0.0.1/",
            "http://255.255.255.255/",
            "http://240.0.0.1/",
            "http://[::1]/",
            "http://[::]/",
            "http://[::ffff:127.0.0.1]/",
            "http://[::ffff:7f00:1]/",
            "http://[::ffff:169.254.169.254]/",
            "http://[::127.0.0.1]/",
            "http://[64:ff9b::10.0.0.1]/",
            "http://[2002:7f00:1::]/",
            "http://[fc00::1]/",
            "http://[fd12:3456::1]/",
            "http://[fe80::1]/",
            "http://[ff02::1]/",
            "https://localhost/",
            "https://LOCALHOST./",
            "http://a.b.localhost:99/",
        ] {
            refused(&p, url);
        }
    }

    #[test]
    fn public_addresses_and_names_pass() {
        let p = OutboundPolicy::default();
        for url in [
            "https://example.org/a.zip",
            "http://93.184.216.34/",
            "http://8.8.8.8:8080/x",
            "http://[2606:2800:220:1:248:1893:25c8:1946]/",
            "http://[::ffff:8.8.8.8]/",
            "http://[64:ff9b::8.8.8.8]/",
            "http://[2002:0808:0808::]/",
        ] {
            assert!(p.check_url(url).is_ok(), "{url}");
        }
    }

    #[test]
    fn allow_rules_open_networks_and_hosts() {
        let p = OutboundPolicy::new(
            &["Repo.Internal.".into(), "*.corp.example".into()],
            &["127.0.0.0/8".into(), "10.1.0.0/16".into(), "fd00::1".into()],
            None,
        )
        .expect("policy");
        for url in [
            "http://127.0.0.1:1/",
            "http://2130706433/",
            "http://127.1/",
            "http://[::ffff:127.0.0.1]/",
            "http://10.1.200.3/",
            "http://[fd00::1]/",
            "http://repo.internal/",
        ] {
            assert!(p.check_url(url).is_ok(), "{url}");
        }
        assert!(p.allows_host("a.corp.example"));
        assert!(p.allows_host("A.B.CORP.EXAMPLE."));
        assert!(!p.allows_host("corp.example"));
        assert!(!p.allows_host("evilcorp.example"));
        refused(&p, "http://10.2.0.1/");
        refused(&p, "http://[fd00::2]/");
        refused(&p, "http://localhost/");
        assert!(OutboundPolicy::new(&[], &["10.0.0.0/33".into()], None).is_err());
        assert!(OutboundPolicy::new(&[], &["not a net".into()], None).is_err());
        assert!(OutboundPolicy::new(&["".into()], &[], None).is_err());
        assert!(OutboundPolicy::new(&["a b".into()], &[], None).is_err());
    }

    // Regression: `--allow-network 127.0.0.1/32` opened every port of the
    // address, ZooKeeper's included; a rule may now name its one port.
    #[test]
    fn a_rule_with_a_port_opens_only_that_port() {
        let p = OutboundPolicy::new(
            &[],
            &[
                "127.0.0.1:8080".into(),
                "10.0.0.0/8:443".into(),
                "[::1]:8080".into(),
                "[fd00::/8]".into(),
                "fd01::/16".into(),
            ],
            None,
        )
        .expect("policy");
        for url in [
            "http://127.0.0.1:8080/a",
            "https://10.2.3.4/",
            "http://10.2.3.4:443/",
            "http://[::1]:8080/",
            "http://[fd00::5]:2181/",
            "http://[fd01::5]:1/",
        ] {
            assert!(p.check_url(url).is_ok(), "{url}");
        }
        for url in [
            "http://127.0.0.1:2181/",
            "http://127.0.0.1/",
            "http://10.2.3.4/",
            "https://10.2.3.4:8443/",
            "http://[::1]/",
            "http://[::ffff:127.0.0.1]:2181/",
        ] {
            refused(&p, url);
        }
        assert!(p.allows("127.0.0.1".parse().expect("ip"), 8080));
        assert!(!p.allows("127.0.0.1".parse().expect("ip"), 2181));
        // A resolver that knows no port opens only port-less rules.
        assert!(!p.allows_ip("127.0.0.1".parse().expect("ip")));
        assert!(p.allows_ip("fd00::5".parse().expect("ip")));
        let u = |s: &str| Url::parse(s).expect("url");
        assert_eq!(
            p.check_redirect(&u("http://example.org/"), &u("http://127.0.0.1:2181/")),
            Err(UrlError::Refused)
        );
        for bad in [
            "127.0.0.1:0",
            "127.0.0.1:65536",
            "127.0.0.1:",
            "[::1]:",
            "[::1]x",
            "::1:8080x",
            "[::1",
            "10.0.0.0/8:443:1",
        ] {
            assert!(
                OutboundPolicy::new(&[], &[bad.into()], None).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn schemes_syntax_and_the_file_root() {
        let p = OutboundPolicy::default();
        assert!(matches!(p.check_url("not a url"), Err(UrlError::Syntax(_))));
        assert!(matches!(p.check_url(""), Err(UrlError::Syntax(_))));
        assert!(matches!(
            p.check_url("ftp://example.org/x"),
            Err(UrlError::Scheme { .. })
        ));
        assert!(matches!(
            p.check_url("data:text/plain,hello"),
            Err(UrlError::Scheme { .. })
        ));
        assert_eq!(
            p.check_url("file:///etc/passwd"),
            Err(UrlError::FileRootless)
        );
        let rooted = OutboundPolicy::new(&[], &[], Some(Path::new("/srv/files"))).expect("p");
        assert_eq!(
            rooted.check_url("file:///etc/passwd"),
            Err(UrlError::FileOutside)
        );
        assert_eq!(
            rooted.check_url("file:///srv/files/../../etc/passwd"),
            Err(UrlError::FileOutside)
        );
        assert_eq!(
            rooted.check_url("file:///srv/filesX/a"),
            Err(UrlError::FileOutside)
        );
        assert!(rooted.check_url("file:///srv/files/a/b.txt").is_ok());
        assert!(rooted.check_url("gopher://x/").is_err());
    }

    #[test]
    fn redirects_keep_to_http_and_never_downgrade() {
        let p = OutboundPolicy::default();
        let u = |s: &str| Url::parse(s).expect("url");
        let ok = |a: &str, b: &str| p.check_redirect(&u(a), &u(b));
        assert!(ok("http://example.org/", "https://example.org/").is_ok());
        assert!(ok("https://example.org/", "https://example.net/").is_ok());
        assert_eq!(
            ok("https://example.org/", "http://example.org/"),
            Err(UrlError::Refused)
        );
        assert_eq!(
            ok("http://example.org/", "file:///etc/passwd"),
            Err(UrlError::Refused)
        );
        assert_eq!(
            ok("http://example.org/", "http://127.0.0.1:22/"),
            Err(UrlError::Refused)
        );
        assert_eq!(
            ok("http://example.org/", "http://2130706433/"),
            Err(UrlError::Refused)
        );
    }

    #[test]
    fn refusals_never_quote_an_unbounded_input() {
        let p = OutboundPolicy::default();
        let long = format!("{}://x", "a".repeat(10_000));
        let e = p.check_url(&long).expect_err("scheme");
        assert!(e.to_string().len() < 200, "{e}");
        let e = OutboundPolicy::new(&[], &["9".repeat(10_000)], None).expect_err("net");
        assert!(e.to_string().len() < 300, "{e}");
    }
}
