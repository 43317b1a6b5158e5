//! Which webhook URLs the node will POST to. Deliveries come from inside the operator's network,
//! so a subscription must not be able to aim them at internal services (SSRF):
//! - loopback hosts (`localhost`, 127.0.0.0/8, `::1`) are allowed with `http` or `https`, for
//!   receivers on the same machine (local development, sidecars, the conformance suite), when
//!   the node allows them (`allow_loopback`: `pico serve` does when it listens on loopback only,
//!   or with `--webhook-allow-loopback`); otherwise they are refused like private addresses;
//! - any other host needs `https` and, when it is an IP literal, a public address;
//! - a host name is resolved again at every delivery and only its allowed addresses are used
//!   (`address_allowed`), so DNS cannot point an accepted name at a private address later.

use crate::limits::WEBHOOK_URL_BYTES_MAX;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Host {
    /// A DNS name, lowercased, without a trailing dot.
    Name(String),
    Ip(IpAddr),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookUrl {
    pub https: bool,
    pub host: Host,
    pub port: u16,
    /// Path and query for the request line (`/` when the URL has none).
    pub target: String,
}

impl WebhookUrl {
    /// The `Host` header value.
    pub fn host_header(&self) -> String {
        let host = match &self.host {
            Host::Name(name) => name.clone(),
            Host::Ip(IpAddr::V4(ip)) => ip.to_string(),
            Host::Ip(IpAddr::V6(ip)) => format!("[{ip}]"),
        };
        let default_port = if self.https { 443 } else { 80 };
        if self.port == default_port {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }

    fn is_loopback_host(&self) -> bool {
        match &self.host {
            Host::Name(name) => name == "localhost",
            Host::Ip(ip) => is_loopback(*ip),
        }
    }
}

/// Why a webhook URL is refused. The messages name "the webhook URL" whatever field held it
/// (a subscription's `webhook.url`, a named consumer's wake `url`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UrlError {
    /// Longer than [`WEBHOOK_URL_BYTES_MAX`] bytes.
    TooLong,
    /// A byte that is not printable ASCII (spaces included).
    NotPrintable,
    /// Not a URL by the WHATWG rules.
    Invalid(url::ParseError),
    /// Neither `http` nor `https`.
    Scheme,
    NoHost,
    /// A user name or password.
    Credentials,
    PortZero,
    /// An IPv4 address spelled other than as a dotted quad (the host as written).
    IpSpelling(String),
    /// A host name that is not letters, digits and hyphens (the host as written).
    HostName(String),
    /// A loopback host while the node does not allow them.
    LoopbackOff,
    /// `http` to a host that is not loopback.
    PlainHttp,
    /// An IP literal that is private, link-local or reserved.
    NotPublic(IpAddr),
}

impl std::fmt::Display for UrlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UrlError::TooLong => write!(
                f,
                "the webhook URL is longer than {WEBHOOK_URL_BYTES_MAX} bytes"
            ),
            UrlError::NotPrintable => {
                f.write_str("the webhook URL must be printable ASCII without spaces")
            }
            UrlError::Invalid(e) => write!(f, "the webhook URL is not a valid URL: {e}"),
            UrlError::Scheme => f.write_str("the webhook URL must be an http or https URL"),
            UrlError::NoHost => f.write_str("the webhook URL has no host"),
            UrlError::Credentials => f.write_str("the webhook URL must not contain credentials"),
            UrlError::PortZero => f.write_str("the webhook URL has an invalid port 0"),
            UrlError::IpSpelling(host) => write!(
                f,
                "the webhook URL host {host:?} is not a valid IP address"
            ),
            UrlError::HostName(host) => write!(
                f,
                "the webhook URL host {host:?} is not a valid host name"
            ),
            UrlError::LoopbackOff => f.write_str(
                "loopback webhooks (localhost, 127.0.0.0/8, ::1) are off on this node (pico serve --webhook-allow-loopback turns them on)",
            ),
            UrlError::PlainHttp => f.write_str(
                "plain http webhooks are only allowed for loopback hosts (localhost, 127.0.0.0/8, ::1); use https",
            ),
            UrlError::NotPublic(ip) => write!(
                f,
                "the webhook URL must not target a private, link-local or reserved address ({ip})"
            ),
        }
    }
}

impl std::error::Error for UrlError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            UrlError::Invalid(e) => Some(e),
            _ => None,
        }
    }
}

/// Parses an absolute `http(s)://host[:port][/path][?query]` URL with the `url` crate (the
/// WHATWG rules browsers and resolvers follow, so `https://2130706433/` is the IPv4 address
/// the policy then judges, not a name). On top of it: only printable ASCII (the target goes
/// into the request line), no credentials, no port 0, and a host name must be plain
/// letters, digits and hyphens.
pub fn parse(text: &str) -> Result<WebhookUrl, UrlError> {
    if text.len() > WEBHOOK_URL_BYTES_MAX {
        return Err(UrlError::TooLong);
    }
    if !text.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(UrlError::NotPrintable);
    }
    let url = url::Url::parse(text).map_err(UrlError::Invalid)?;
    let https = match url.scheme() {
        "https" => true,
        "http" => false,
        _ => return Err(UrlError::Scheme),
    };
    // WHATWG skips extra slashes (`https:///x` is host `x`); a URL written so is a mistake.
    let after_scheme = &text[url.scheme().len() + 1..];
    if !after_scheme.starts_with("//") || after_scheme[2..].starts_with('/') {
        return Err(UrlError::NoHost);
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(UrlError::Credentials);
    }
    let port = match url.port_or_known_default() {
        Some(0) | None => return Err(UrlError::PortZero),
        Some(port) => port,
    };
    let host = match url.host() {
        // Only a plain dotted quad is taken as an IPv4 address: `2130706433`, `0x7f.1` or
        // `10.1` are addresses to a resolver too, and spelled so only to slip past a reader.
        Some(url::Host::Ipv4(ip)) if written_host(after_scheme) != ip.to_string() => {
            return Err(UrlError::IpSpelling(written_host(after_scheme).to_string()))
        }
        Some(url::Host::Ipv4(ip)) => Host::Ip(IpAddr::V4(ip)),
        Some(url::Host::Ipv6(ip)) => Host::Ip(IpAddr::V6(ip)),
        Some(url::Host::Domain(name)) => Host::Name(host_name(name)?),
        None => return Err(UrlError::NoHost),
    };
    let target = match url.query() {
        Some(query) => format!("{}?{query}", url.path()),
        None => url.path().to_string(),
    };
    Ok(WebhookUrl {
        https,
        host,
        port,
        target,
    })
}

/// The host as written after `//`, without the port (for IPv4 hosts, which have no `[]`).
fn written_host(after_scheme: &str) -> &str {
    let authority = after_scheme[2..]
        .split(['/', '?', '#'])
        .next()
        .unwrap_or("");
    authority
        .rsplit_once(':')
        .map_or(authority, |(host, _)| host)
}

/// A DNS name of letters, digits and hyphens, lowercased, without its trailing dot.
fn host_name(host: &str) -> Result<String, UrlError> {
    let name = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    let valid_label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if name.len() > 253 || !name.split('.').all(valid_label) {
        return Err(UrlError::HostName(host.to_string()));
    }
    Ok(name)
}

/// Parses and applies the policy of the module comment (at subscription creation).
pub fn check(url: &str, allow_loopback: bool) -> Result<WebhookUrl, UrlError> {
    let parsed = parse(url)?;
    if parsed.is_loopback_host() {
        if !allow_loopback {
            return Err(UrlError::LoopbackOff);
        }
        return Ok(parsed);
    }
    if !parsed.https {
        return Err(UrlError::PlainHttp);
    }
    if let Host::Ip(ip) = parsed.host {
        if !is_public(ip) {
            return Err(UrlError::NotPublic(ip));
        }
    }
    Ok(parsed)
}

/// Whether a delivery to `url` may connect to `ip` (an address its host resolved to).
pub fn address_allowed(url: &WebhookUrl, ip: IpAddr, allow_loopback: bool) -> bool {
    if url.is_loopback_host() {
        allow_loopback && is_loopback(ip)
    } else {
        is_public(ip)
    }
}

fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// Globally routable unicast: not private, loopback, link-local, shared (CGNAT), documentation,
/// benchmarking, multicast or reserved, including IPv4 embedded in IPv6.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(a == 0
        || a == 10
        || a == 127
        || (a == 100 && (64..=127).contains(&b))
        || (a == 169 && b == 254)
        || (a == 172 && (16..=31).contains(&b))
        || (a == 192 && b == 0 && (c == 0 || c == 2))
        || (a == 192 && b == 168)
        || (a == 198 && (b == 18 || b == 19))
        || (a == 198 && b == 51 && c == 100)
        || (a == 203 && b == 0 && c == 113)
        || a >= 224)
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return is_public_v4(v4);
    }
    let s = ip.segments();
    !(ip.is_unspecified()
        || ip.is_loopback()
        // ::/96 (IPv4-compatible), 64:ff9b::/96 (NAT64) and 6to4 embed IPv4 destinations.
        || (s[..6] == [0; 6])
        || (s[0] == 0x64 && s[1] == 0xff9b)
        || s[0] == 0x2002
        // 100::/64 discard, 2001::/23 IETF assignments (Teredo...), 2001:db8::/32 documentation.
        || (s[0] == 0x100 && s[1..4] == [0; 3])
        || (s[0] == 0x2001 && s[1] < 0x200)
        || (s[0] == 0x2001 && s[1] == 0xdb8)
        // fc00::/7 unique local, fe80::/10 link-local, fec0::/10 site-local, ff00::/8 multicast.
        || (s[0] & 0xfe00) == 0xfc00
        || (s[0] & 0xffc0) == 0xfe80
        || (s[0] & 0xffc0) == 0xfec0
        || (s[0] & 0xff00) == 0xff00)
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #![proptest_config(crate::fuzzing::config())]
        #[test]
        fn fuzz_webhook_url(url in crate::fuzzing::inputs("webhook_url")) {
            let url = String::from_utf8_lossy(&url);
            let _ = parse(&url);
            let _ = check(&url, true);
        }
    }

    #[test]
    fn loopback_receivers_are_accepted_with_http() {
        let url = check("http://127.0.0.1:43123/webhook", true).unwrap();
        assert!(!url.https);
        assert_eq!(url.host, Host::Ip("127.0.0.1".parse().unwrap()));
        assert_eq!(url.port, 43123);
        assert_eq!(url.target, "/webhook");
        assert_eq!(url.host_header(), "127.0.0.1:43123");
        let url = check("http://LOCALHOST/?a=b", true).unwrap();
        assert_eq!(url.host, Host::Name("localhost".into()));
        assert_eq!((url.port, url.target.as_str()), (80, "/?a=b"));
        assert_eq!(url.host_header(), "localhost");
        assert!(check("http://[::1]:8080/h", true).is_ok());
        assert!(check("https://127.0.0.2/h", true).is_ok());
    }

    #[test]
    fn private_and_plain_http_targets_are_rejected() {
        for url in [
            "http://10.0.0.1/hook",
            "http://example.com/hook",
            "https://10.0.0.1/hook",
            "https://172.16.5.4/",
            "https://192.168.1.1/",
            "https://169.254.169.254/latest/meta-data",
            "https://100.64.0.1/",
            "https://0.0.0.0/",
            "https://[fe80::1]/",
            "https://[fd00::1]/",
            "https://[::ffff:10.0.0.1]/",
            "https://[::]/",
            "https://2130706433/",
            "https://0x7f000001/",
            "https://10.1/",
            "ftp://example.com/",
            "https://user:pw@example.com/",
            "https://exa mple.com/",
            "https://example.com:0/",
            "https://example.com:99999/",
            "https://example.com:+80/",
            "https:///path",
            "https://[::1/",
            "https://ex_ample.com/",
            "http://2130706433/",
            "https://127.1/",
            "https://0177.0.0.1/",
            "https:///path",
            "https:example.com/",
            "https://example.com:0/",
        ] {
            assert!(check(url, true).is_err(), "{url} should be rejected");
        }
    }

    #[test]
    fn each_refusal_says_why() {
        let long = format!("https://example.com/{}", "a".repeat(WEBHOOK_URL_BYTES_MAX));
        for (url, error) in [
            (long.as_str(), UrlError::TooLong),
            ("https://exa mple.com/", UrlError::NotPrintable),
            ("ftp://example.com/", UrlError::Scheme),
            ("https:///path", UrlError::NoHost),
            ("https://user:pw@example.com/", UrlError::Credentials),
            ("https://example.com:0/", UrlError::PortZero),
            (
                "https://0x7f000001/",
                UrlError::IpSpelling("0x7f000001".into()),
            ),
            (
                "https://ex_ample.com/",
                UrlError::HostName("ex_ample.com".into()),
            ),
            ("http://example.com/hook", UrlError::PlainHttp),
            (
                "https://10.0.0.1/hook",
                UrlError::NotPublic("10.0.0.1".parse().unwrap()),
            ),
        ] {
            assert_eq!(check(url, true), Err(error), "{url}");
        }
        let err = check("https://[::1/", true).unwrap_err();
        assert!(matches!(err, UrlError::Invalid(_)), "{err}");
        assert!(std::error::Error::source(&err).is_some());
        // Named generically: the same check serves consumers' wake `url`.
        assert_eq!(UrlError::NoHost.to_string(), "the webhook URL has no host");
    }

    #[test]
    fn public_https_targets_are_accepted() {
        let url = check("https://Hooks.Example.com./a/b?c=d#frag", true).unwrap();
        assert_eq!(url.host, Host::Name("hooks.example.com".into()));
        assert_eq!((url.port, url.target.as_str()), (443, "/a/b?c=d"));
        assert!(check("https://8.8.8.8:8443/h", true).is_ok());
        assert!(check("https://[2606:4700::1111]/h", true).is_ok());
    }

    #[test]
    fn resolved_addresses_are_checked_per_host_kind() {
        let public = check("https://hooks.example.com/", true).unwrap();
        assert!(address_allowed(
            &public,
            "93.184.216.34".parse().unwrap(),
            true
        ));
        assert!(!address_allowed(
            &public,
            "127.0.0.1".parse().unwrap(),
            true
        ));
        assert!(!address_allowed(&public, "10.1.2.3".parse().unwrap(), true));
        let local = check("http://localhost:9/", true).unwrap();
        assert!(address_allowed(&local, "127.0.0.1".parse().unwrap(), true));
        assert!(address_allowed(&local, "::1".parse().unwrap(), true));
        assert!(!address_allowed(
            &local,
            "93.184.216.34".parse().unwrap(),
            true
        ));
    }

    /// A node listening beyond loopback does not POST to its own ports.
    #[test]
    fn loopback_receivers_are_refused_when_the_node_does_not_allow_them() {
        for url in [
            "http://127.0.0.1:9090/admin",
            "https://127.0.0.2/h",
            "http://localhost:4437/",
            "http://[::1]:8080/h",
        ] {
            let err = check(url, false).unwrap_err();
            assert_eq!(err, UrlError::LoopbackOff, "{url}");
            assert!(
                err.to_string().contains("--webhook-allow-loopback"),
                "{err}"
            );
        }
        // Resolved at delivery too: a subscription created while they were allowed stops.
        let local = check("http://localhost:9/", true).unwrap();
        assert!(!address_allowed(
            &local,
            "127.0.0.1".parse().unwrap(),
            false
        ));
        let public = check("https://hooks.example.com/", false).unwrap();
        assert!(address_allowed(
            &public,
            "93.184.216.34".parse().unwrap(),
            false
        ));
    }
}
