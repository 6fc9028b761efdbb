//! The outbound policy's URL and rule parsers on arbitrary input: never a
//! panic, refusals bounded, and what passes is consistent with the address
//! rules.
#![no_main]

use std::net::IpAddr;
use std::path::Path;

use ingest_protocol::outbound::{Host, OutboundPolicy, Url};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let policy = OutboundPolicy::new(
        &["*.example.org".into()],
        &["10.1.0.0/16".into()],
        Some(Path::new("/srv/files")),
    )
    .expect("the fixed rules parse");
    match policy.check_url(text) {
        Ok(url) => {
            let literal = match url.host() {
                Some(Host::Ipv4(ip)) => Some(IpAddr::V4(ip)),
                Some(Host::Ipv6(ip)) => Some(IpAddr::V6(ip)),
                _ => None,
            };
            if let Some(ip) = literal {
                assert!(policy.allows_ip(ip), "{text:?} passed with {ip}");
            }
            if matches!(url.scheme(), "http" | "https") {
                let from = Url::parse("https://example.org/").expect("url");
                let _ = policy.check_redirect(&from, &url);
            }
        }
        Err(e) => assert!(e.to_string().len() <= 1024, "an unbounded refusal"),
    }
    // The allow rules' parser: the first line as a host, the rest as a
    // network.
    let (host, network) = text.split_once('\n').unwrap_or((text, text));
    match OutboundPolicy::new(&[host.to_owned()], &[network.to_owned()], None) {
        Ok(p) => {
            let _ = p.allows_host(host);
        }
        Err(e) => assert!(e.to_string().len() <= 1024, "an unbounded refusal"),
    }
});
