//! Server-side request forgery (SSRF) guard for outbound webhook requests.
//!
//! Endpoint URLs are supplied by customers, so every delivery must be kept away from
//! loopback, private networks, cloud metadata services and other non-public addresses.
//! The guard works in two places:
//!
//! 1. [`AddressPolicy::check_url`] when an endpoint is registered and before each send:
//!    scheme, credentials, `localhost` names and IP-literal hosts.
//! 2. [`GuardedResolver`] inside the HTTP client: every name is resolved once, all answers
//!    are checked, and the client connects only to those checked addresses, which defeats
//!    DNS rebinding between a check and the connect.
//!
//! reqwest does not consult the resolver for IP-literal hosts (redirect targets included),
//! and with a proxy configured it resolves the proxy instead of the target. Clients that use
//! the guard must therefore call `check_url` before every request, disable redirects
//! (`reqwest::redirect::Policy::none()`) and proxies (`ClientBuilder::no_proxy`).

use std::error::Error as StdError;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use url::{Host, Url};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SsrfError {
    #[error("url scheme `{0}` is not allowed (use http or https)")]
    Scheme(String),
    #[error("https is required for endpoint urls")]
    HttpsRequired,
    #[error("url has no host")]
    NoHost,
    #[error("url must not contain credentials (user info)")]
    Credentials,
    #[error("host `{host}` is not allowed: localhost names always refer to the local machine")]
    LocalHostname { host: String },
    #[error("address {ip} is not allowed: {reason}")]
    Forbidden { ip: IpAddr, reason: &'static str },
    /// A name that resolves to a refused address. The address is not named: the message
    /// reaches whoever set the URL, and the server's DNS view of its own network is not theirs.
    #[error("host `{host}` resolves to an address that is not allowed: {reason}")]
    ResolvesForbidden { host: String, reason: &'static str },
    #[error("host `{host}` did not resolve to any address")]
    Unresolvable { host: String },
    #[error("could not resolve host `{host}`: {reason}")]
    LookupFailed {
        host: String,
        reason: String,
        /// The OS error behind it, if any: a lookup this process had no descriptor for
        /// (`EMFILE`) is not the host's failure.
        os_error: Option<i32>,
    },
}

const UNSPECIFIED: &str = "unspecified address";
const LOOPBACK: &str = "loopback address";
const PRIVATE: &str = "private network address (RFC 1918)";
const LINK_LOCAL: &str = "link-local address (includes cloud metadata endpoints)";
const SHARED_CGNAT: &str = "carrier-grade NAT shared address space";
const IETF_PROTOCOL: &str = "IETF protocol assignment";
const DOCUMENTATION: &str = "documentation address";
const BENCHMARKING: &str = "benchmarking address";
const MULTICAST: &str = "multicast address";
const BROADCAST: &str = "broadcast address";
const RESERVED: &str = "reserved address";
const UNIQUE_LOCAL: &str = "unique local address (includes cloud metadata endpoints)";
const SITE_LOCAL: &str = "site-local address (deprecated)";
const DISCARD_ONLY: &str = "discard-only address";
const TEREDO: &str = "Teredo tunnel address";
const ORCHID: &str = "ORCHID address";
const IPV4_COMPATIBLE: &str = "IPv4-compatible IPv6 address (deprecated)";
const LOCAL_NAT64: &str = "local-use NAT64 address outside 64:ff9b:1::/96";
const NOT_GLOBAL_UNICAST: &str = "reserved IPv6 address outside global unicast 2000::/3";

const fn v4_net(a: u8, b: u8, c: u8, d: u8, prefix_len: u8) -> Ipv4Net {
    Ipv4Net::new_assert(Ipv4Addr::new(a, b, c, d), prefix_len)
}

const fn v6_net(segments: [u16; 8], prefix_len: u8) -> Ipv6Net {
    let [a, b, c, d, e, f, g, h] = segments;
    Ipv6Net::new_assert(Ipv6Addr::new(a, b, c, d, e, f, g, h), prefix_len)
}

/// Refused IPv4 ranges; the first match gives the reason, so more specific entries come first.
const FORBIDDEN_V4: &[(Ipv4Net, &str)] = &[
    (v4_net(0, 0, 0, 0, 8), UNSPECIFIED),
    (v4_net(127, 0, 0, 0, 8), LOOPBACK),
    (v4_net(10, 0, 0, 0, 8), PRIVATE),
    (v4_net(172, 16, 0, 0, 12), PRIVATE),
    (v4_net(192, 168, 0, 0, 16), PRIVATE),
    (v4_net(169, 254, 0, 0, 16), LINK_LOCAL),
    (v4_net(100, 64, 0, 0, 10), SHARED_CGNAT),
    (v4_net(192, 0, 0, 0, 24), IETF_PROTOCOL),
    (v4_net(192, 0, 2, 0, 24), DOCUMENTATION),
    (v4_net(198, 51, 100, 0, 24), DOCUMENTATION),
    (v4_net(203, 0, 113, 0, 24), DOCUMENTATION),
    (v4_net(198, 18, 0, 0, 15), BENCHMARKING),
    (v4_net(224, 0, 0, 0, 4), MULTICAST),
    (v4_net(255, 255, 255, 255, 32), BROADCAST),
    (v4_net(240, 0, 0, 0, 4), RESERVED),
];

/// Refused IPv6 ranges that do not embed an IPv4 address; the first match gives the reason.
const FORBIDDEN_V6: &[(Ipv6Net, &str)] = &[
    (v6_net([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7), UNIQUE_LOCAL),
    (v6_net([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10), LINK_LOCAL),
    (v6_net([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10), SITE_LOCAL),
    (v6_net([0xff00, 0, 0, 0, 0, 0, 0, 0], 8), MULTICAST),
    (v6_net([0x0100, 0, 0, 0, 0, 0, 0, 0], 64), DISCARD_ONLY),
    (v6_net([0x2001, 0, 0, 0, 0, 0, 0, 0], 32), TEREDO),
    (v6_net([0x2001, 0x0002, 0, 0, 0, 0, 0, 0], 48), BENCHMARKING),
    (v6_net([0x2001, 0x0010, 0, 0, 0, 0, 0, 0], 28), ORCHID),
    (v6_net([0x2001, 0x0020, 0, 0, 0, 0, 0, 0], 28), ORCHID),
    (v6_net([0x2001, 0, 0, 0, 0, 0, 0, 0], 23), IETF_PROTOCOL),
    (
        v6_net([0x2001, 0x0db8, 0, 0, 0, 0, 0, 0], 32),
        DOCUMENTATION,
    ),
    (v6_net([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20), DOCUMENTATION),
    // RFC 8215 lets operators pick any prefix length inside 64:ff9b:1::/48, which moves the
    // embedded IPv4 address. Only the /96 layout (in EMBEDDED_V4) is unambiguous.
    (
        v6_net([0x0064, 0xff9b, 0x0001, 0, 0, 0, 0, 0], 48),
        LOCAL_NAT64,
    ),
];

/// IPv6 ranges that carry an IPv4 address, with the bit offset where it starts.
/// The embedded address is judged by the IPv4 rules.
const EMBEDDED_V4: &[(Ipv6Net, u32)] = &[
    // IPv4-mapped
    (v6_net([0, 0, 0, 0, 0, 0xffff, 0, 0], 96), 96),
    // NAT64 well-known prefix
    (v6_net([0x0064, 0xff9b, 0, 0, 0, 0, 0, 0], 96), 96),
    // NAT64 local-use prefix, /96 layout
    (v6_net([0x0064, 0xff9b, 0x0001, 0, 0, 0, 0, 0], 96), 96),
    // 6to4
    (v6_net([0x2002, 0, 0, 0, 0, 0, 0, 0], 16), 16),
];

/// Deprecated IPv4-compatible addresses (::a.b.c.d).
const IPV4_COMPATIBLE_V6: Ipv6Net = v6_net([0; 8], 96);

const GLOBAL_UNICAST_V6: Ipv6Net = v6_net([0x2000, 0, 0, 0, 0, 0, 0, 0], 3);

/// Why an address is never a valid webhook target, or None if it is public unicast.
pub fn forbidden_reason(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => forbidden_v4_reason(v4),
        IpAddr::V6(v6) => forbidden_v6_reason(v6),
    }
}

fn forbidden_v4_reason(ip: Ipv4Addr) -> Option<&'static str> {
    FORBIDDEN_V4
        .iter()
        .find(|(network, _)| network.contains(&ip))
        .map(|&(_, reason)| reason)
}

fn forbidden_v6_reason(ip: Ipv6Addr) -> Option<&'static str> {
    if ip.is_unspecified() {
        return Some(UNSPECIFIED);
    }
    if ip.is_loopback() {
        return Some(LOOPBACK);
    }
    if let Some(embedded) = embedded_ipv4(ip) {
        return forbidden_v4_reason(embedded);
    }
    // The deprecated IPv4-compatible range has no legitimate use as a destination and some
    // stacks still tunnel it to the embedded IPv4 address, so all of it is refused; the
    // embedded address's own reason is reported when there is one because it is more telling.
    if IPV4_COMPATIBLE_V6.contains(&ip) {
        let embedded = Ipv4Addr::from(u128::from(ip) as u32);
        return Some(forbidden_v4_reason(embedded).unwrap_or(IPV4_COMPATIBLE));
    }
    if let Some(&(_, reason)) = FORBIDDEN_V6
        .iter()
        .find(|(network, _)| network.contains(&ip))
    {
        return Some(reason);
    }
    // IANA keeps everything outside 2000::/3 reserved or for local use, so whatever was not
    // matched above cannot be a public destination.
    if !GLOBAL_UNICAST_V6.contains(&ip) {
        return Some(NOT_GLOBAL_UNICAST);
    }
    None
}

fn embedded_ipv4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let (_, offset) = EMBEDDED_V4
        .iter()
        .find(|(network, _)| network.contains(&ip))?;
    Some(Ipv4Addr::from(
        (u128::from(ip) >> (128 - 32 - offset)) as u32,
    ))
}

fn is_localhost_name(domain: &str) -> bool {
    let name = domain.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost" || name.ends_with(".localhost")
}

/// Which destinations outbound webhook requests may reach.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddressPolicy {
    allow: Vec<IpNet>,
    https_only: bool,
}

impl AddressPolicy {
    /// `allow` lists networks that are reachable even though the address rules refuse them
    /// (for example 127.0.0.0/8 in tests, or a known internal relay).
    pub fn new(allow: Vec<IpNet>, https_only: bool) -> Self {
        Self { allow, https_only }
    }

    pub fn allow_list(&self) -> &[IpNet] {
        &self.allow
    }

    pub fn https_only(&self) -> bool {
        self.https_only
    }

    /// Ok if the address may be connected to: allowed by the allow-list, or not forbidden.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), SsrfError> {
        if self.is_allow_listed(ip) {
            return Ok(());
        }
        match forbidden_reason(ip) {
            Some(reason) => Err(SsrfError::Forbidden { ip, reason }),
            None => Ok(()),
        }
    }

    /// An IPv4 address and its IPv4-mapped IPv6 form are the same destination, so either
    /// form matches an allow-list entry written in the other family.
    fn is_allow_listed(&self, ip: IpAddr) -> bool {
        let other_form = match ip {
            IpAddr::V4(v4) => IpAddr::V6(v4.to_ipv6_mapped()),
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        };
        self.allow
            .iter()
            .any(|network| network.contains(&ip) || network.contains(&other_form))
    }

    /// Checks scheme, credentials and host of an endpoint URL. IP-literal hosts are checked
    /// against the address rules (the url crate has already normalised forms such as
    /// `0x7f.1` or `2130706433`); other domain names pass here and are checked after
    /// resolution, except `localhost` and `*.localhost`, which are refused outright.
    pub fn check_url(&self, url: &Url) -> Result<(), SsrfError> {
        match url.scheme() {
            "https" => {}
            "http" if self.https_only => return Err(SsrfError::HttpsRequired),
            "http" => {}
            other => return Err(SsrfError::Scheme(other.to_owned())),
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(SsrfError::Credentials);
        }
        match url.host() {
            None => Err(SsrfError::NoHost),
            Some(Host::Ipv4(v4)) => self.check_ip(IpAddr::V4(v4)),
            Some(Host::Ipv6(v6)) => self.check_ip(IpAddr::V6(v6)),
            Some(Host::Domain(domain)) if is_localhost_name(domain) => {
                Err(SsrfError::LocalHostname {
                    host: domain.to_owned(),
                })
            }
            Some(Host::Domain(_)) => Ok(()),
        }
    }

    /// Resolves `host:port` and checks every answer. If any address is refused the whole
    /// host is refused, so a mixed or rebinding DNS answer cannot sneak a private address
    /// in next to a public one.
    pub async fn resolve_checked(
        &self,
        host: &str,
        port: u16,
    ) -> Result<Vec<SocketAddr>, SsrfError> {
        // `Url::host_str` keeps the brackets around IPv6 literals.
        let bare_host = host
            .strip_prefix('[')
            .and_then(|inner| inner.strip_suffix(']'))
            .unwrap_or(host);
        let addresses: Vec<SocketAddr> = tokio::net::lookup_host((bare_host, port))
            .await
            .map_err(|error| SsrfError::LookupFailed {
                host: host.to_owned(),
                reason: error.to_string(),
                os_error: error.raw_os_error(),
            })?
            .collect();
        if addresses.is_empty() {
            return Err(SsrfError::Unresolvable {
                host: host.to_owned(),
            });
        }
        let literal = bare_host.parse::<IpAddr>().is_ok();
        for address in &addresses {
            match self.check_ip(address.ip()) {
                Err(SsrfError::Forbidden { ip, reason }) if !literal => {
                    tracing::info!(host, %ip, reason, "a webhook host resolves to a refused address");
                    return Err(SsrfError::ResolvesForbidden {
                        host: host.to_owned(),
                        reason,
                    });
                }
                checked => checked?,
            }
        }
        Ok(addresses)
    }
}

/// What a webhook attempt records when its host is, or resolves to, a refused address: the
/// same text whatever the address and its reason, as endpoint create and update answer. The
/// customer reads it in the delivery log, and the kind of address an internal name leads to
/// is the server's network, not theirs; the reason goes to the server's log only.
pub const REFUSED_AT_SEND: &str =
    "refused: the host is, or resolves to, an address Hooklane does not send to";

/// A refused address met while sending ([`SsrfError::Forbidden`] or
/// [`SsrfError::ResolvesForbidden`]). It displays as [`REFUSED_AT_SEND`] only, wherever it
/// ends up in an error chain; the reason it holds is for the server's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedAddress(SsrfError);

impl RefusedAddress {
    /// A refused address, kept; any other error (a URL's scheme, a lookup that failed), which
    /// says nothing of the server's network, is given back.
    pub fn of(error: SsrfError) -> Result<Self, SsrfError> {
        match error {
            SsrfError::Forbidden { .. } | SsrfError::ResolvesForbidden { .. } => Ok(Self(error)),
            other => Err(other),
        }
    }

    /// Why the address is refused, with the host or the address: for the server's log.
    pub fn reason(&self) -> &SsrfError {
        &self.0
    }
}

impl std::fmt::Display for RefusedAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(REFUSED_AT_SEND)
    }
}

impl StdError for RefusedAddress {}

/// A reqwest DNS resolver that only hands out addresses accepted by an [`AddressPolicy`].
/// The client connects to exactly the addresses that were checked; there is no second lookup.
/// A refused address is answered with a [`RefusedAddress`], whose text tells nothing of it.
///
/// reqwest skips the resolver for IP-literal hosts, including redirect targets, so pair it
/// with [`AddressPolicy::check_url`], `redirect::Policy::none()` and `no_proxy()`.
#[derive(Debug, Clone)]
pub struct GuardedResolver {
    policy: Arc<AddressPolicy>,
}

impl GuardedResolver {
    pub fn new(policy: AddressPolicy) -> Self {
        Self {
            policy: Arc::new(policy),
        }
    }
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = Arc::clone(&self.policy);
        Box::pin(async move {
            // Port 0 is replaced by reqwest with the URL's port (or the scheme default).
            let addresses = match policy.resolve_checked(name.as_str(), 0).await {
                Ok(addresses) => addresses,
                Err(error) => {
                    let error: Box<dyn StdError + Send + Sync> = match RefusedAddress::of(error) {
                        Ok(refused) => Box::new(refused),
                        Err(other) => Box::new(other),
                    };
                    return Err(error);
                }
            };
            let addresses: reqwest::dns::Addrs = Box::new(addresses.into_iter());
            Ok::<_, Box<dyn StdError + Send + Sync>>(addresses)
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    fn loopback_allowed() -> AddressPolicy {
        AddressPolicy::new(
            vec!["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()],
            false,
        )
    }

    /// `None`: the URL passes; `Some(text)`: it is refused with an error containing `text`.
    const URL_CASES: &[(&str, Option<&str>)] = &[
        // IPv4 loopback in every notation the url crate normalises
        ("http://127.0.0.1/", Some("loopback")),
        ("http://2130706433/", Some("loopback")),
        ("http://0x7f.1/", Some("loopback")),
        ("http://0x7f000001/", Some("loopback")),
        ("http://0177.0.0.1/", Some("loopback")),
        ("http://127.1/", Some("loopback")),
        ("http://127.0.0.1./", Some("loopback")),
        ("http://127.255.255.254:8080/", Some("loopback")),
        ("http://%31%32%37.0.0.1/", Some("loopback")),
        ("http://\u{ff11}\u{ff12}\u{ff17}.0.0.1/", Some("loopback")),
        // IPv6 literals
        ("http://[::1]/", Some("loopback")),
        ("http://[::]/", Some("unspecified")),
        ("http://[0:0:0:0:0:0:0:1]/", Some("loopback")),
        ("http://[::ffff:127.0.0.1]/", Some("loopback")),
        ("http://[::ffff:7f00:1]/", Some("loopback")),
        ("http://[::127.0.0.1]/", Some("loopback")),
        ("http://[::8.8.8.8]/", Some("IPv4-compatible")),
        ("http://[::ffff:a9fe:a9fe]/", Some("link-local")),
        ("http://[64:ff9b::a9fe:a9fe]/", Some("link-local")),
        ("http://[64:ff9b::10.0.0.1]/", Some("private")),
        ("http://[64:ff9b:1::7f00:1]/", Some("loopback")),
        ("http://[64:ff9b:1:a00:1::]/", Some("local-use NAT64")),
        ("http://[2002:7f00:1::]/", Some("loopback")),
        ("http://[2002:a9fe:a9fe::1]/", Some("link-local")),
        ("http://[fd00:ec2::254]/", Some("unique local")),
        ("http://[fc00::1]/", Some("unique local")),
        ("http://[fe80::1]/", Some("link-local")),
        ("http://[fec0::1]/", Some("site-local")),
        ("http://[ff02::1]/", Some("multicast")),
        ("http://[2001:db8::1]/", Some("documentation")),
        (
            "http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/",
            Some("Teredo"),
        ),
        ("http://[100::1]/", Some("discard-only")),
        // private, link-local and other special IPv4 ranges
        ("http://0/", Some("unspecified")),
        ("http://0.0.0.0:8080/", Some("unspecified")),
        ("http://10.0.0.1/", Some("private")),
        ("http://172.16.0.1/", Some("private")),
        ("http://172.31.255.255/", Some("private")),
        ("http://192.168.1.1/", Some("private")),
        (
            "http://169.254.169.254/latest/meta-data",
            Some("link-local"),
        ),
        ("http://100.64.0.1/", Some("carrier-grade NAT")),
        ("http://192.0.0.170/", Some("IETF protocol")),
        ("http://192.0.2.10/", Some("documentation")),
        ("http://198.18.0.1/", Some("benchmarking")),
        ("http://224.0.0.1/", Some("multicast")),
        ("http://240.0.0.1/", Some("reserved")),
        ("http://255.255.255.255/", Some("broadcast")),
        // localhost names
        ("http://localhost/", Some("localhost names")),
        ("http://localhost./", Some("localhost names")),
        ("http://LOCALHOST/", Some("localhost names")),
        ("http://api.localhost:3000/hook", Some("localhost names")),
        ("https://Foo.LocalHost./", Some("localhost names")),
        // credentials, schemes
        ("http://a@127.0.0.1/", Some("credentials")),
        ("https://user:secret@example.com/hook", Some("credentials")),
        ("https://:secret@example.com/hook", Some("credentials")),
        ("file:///etc/passwd", Some("scheme `file`")),
        ("gopher://x/", Some("scheme `gopher`")),
        ("ftp://x/", Some("scheme `ftp`")),
        ("ws://example.com/", Some("scheme `ws`")),
        ("data:text/plain,hello", Some("scheme `data`")),
        // public destinations
        ("http://93.184.215.14/", None),
        ("https://example.com/hook", None),
        ("http://[2606:4700::1111]/", None),
        ("http://8.8.8.8:8080/x", None),
        ("https://172.32.0.1/", None),
        ("https://[64:ff9b::808:808]/", None),
        ("https://[2002:808:808::1]/", None),
        ("https://localhost.example.com/", None),
        ("https://mylocalhost/", None),
        ("https://127.0.0.1.nip.io/", None),
    ];

    #[test]
    fn check_url_table() {
        let policy = AddressPolicy::default();
        let mismatches: Vec<String> = URL_CASES
            .iter()
            .filter_map(|&(input, expected)| {
                let url = Url::parse(input).unwrap_or_else(|e| panic!("{input}: {e}"));
                let outcome = policy.check_url(&url).map_err(|error| error.to_string());
                let as_expected = match (&outcome, expected) {
                    (Ok(()), None) => true,
                    (Err(message), Some(fragment)) => message.contains(fragment),
                    _ => false,
                };
                (!as_expected).then(|| format!("{input}: expected {expected:?}, got {outcome:?}"))
            })
            .collect();
        assert!(mismatches.is_empty(), "{mismatches:#?}");
        assert!(URL_CASES.len() >= 40);
    }

    /// docs/RELIABILITY.md counts the table's forms: a case added or removed changes them.
    #[test]
    fn the_reliability_doc_counts_the_url_table() {
        let doc = include_str!("../../../docs/RELIABILITY.md").replace('\n', " ");
        let refused = URL_CASES.iter().filter(|(_, e)| e.is_some()).count();
        let public = URL_CASES.len() - refused;
        let claim = format!(
            "`check_url_table` runs **{} URL forms** through the guard: **{refused} refused** with the expected reason and {public} public ones",
            URL_CASES.len()
        );
        assert!(
            doc.contains(&claim),
            "docs/RELIABILITY.md should say: {claim}"
        );
    }

    /// `None`: public unicast; `Some(text)`: forbidden with a reason containing `text`.
    const ADDRESS_CASES: &[(&str, Option<&str>)] = &[
        ("0.0.0.0", Some("unspecified")),
        ("0.255.255.255", Some("unspecified")),
        ("127.0.0.1", Some("loopback")),
        ("10.255.255.255", Some("private")),
        ("172.16.0.0", Some("private")),
        ("192.168.255.255", Some("private")),
        ("169.254.169.254", Some("link-local")),
        ("100.64.0.0", Some("carrier-grade NAT")),
        ("100.127.255.255", Some("carrier-grade NAT")),
        ("192.0.0.8", Some("IETF protocol")),
        ("192.0.2.1", Some("documentation")),
        ("198.51.100.1", Some("documentation")),
        ("203.0.113.1", Some("documentation")),
        ("198.18.0.0", Some("benchmarking")),
        ("198.19.255.255", Some("benchmarking")),
        ("224.0.0.251", Some("multicast")),
        ("239.255.255.250", Some("multicast")),
        ("240.0.0.0", Some("reserved")),
        ("255.255.255.254", Some("reserved")),
        ("255.255.255.255", Some("broadcast")),
        ("::", Some("unspecified")),
        ("::1", Some("loopback")),
        ("::ffff:10.1.2.3", Some("private")),
        ("::ffff:0.0.0.0", Some("unspecified")),
        ("::0.0.0.2", Some("unspecified")),
        ("::1.2.3.4", Some("IPv4-compatible")),
        ("::ffff:0:8.8.8.8", Some("outside global unicast")),
        ("64:ff9b::7f00:1", Some("loopback")),
        ("64:ff9b:1::a9fe:a9fe", Some("link-local")),
        ("64:ff9b:1:ffff::1", Some("local-use NAT64")),
        ("2002:c0a8:101::", Some("private")),
        ("fd00:ec2::254", Some("unique local")),
        ("fdff:ffff::1", Some("unique local")),
        ("febf:ffff::1", Some("link-local")),
        ("fec0::1", Some("site-local")),
        ("ff05::2", Some("multicast")),
        ("100::", Some("discard-only")),
        ("100:0:0:1::", Some("outside global unicast")),
        ("2001::1", Some("Teredo")),
        ("2001:2::1", Some("benchmarking")),
        ("2001:10::1", Some("ORCHID")),
        ("2001:2f::1", Some("ORCHID")),
        ("2001:1ff::1", Some("IETF protocol")),
        ("2001:db8:ffff::1", Some("documentation")),
        ("3fff:fff::1", Some("documentation")),
        ("4000::1", Some("outside global unicast")),
        ("1.1.1.1", None),
        ("8.8.8.8", None),
        ("100.63.255.255", None),
        ("100.128.0.0", None),
        ("172.15.255.255", None),
        ("192.0.1.1", None),
        ("198.20.0.1", None),
        ("223.255.255.255", None),
        ("::ffff:8.8.8.8", None),
        ("64:ff9b::1.1.1.1", None),
        ("64:ff9b:1::1.1.1.1", None),
        ("2002:808:808::", None),
        ("2001:200::1", None),
        ("2001:4860:4860::8888", None),
        ("2606:4700::1111", None),
        ("3fff:1000::1", None),
    ];

    #[test]
    fn forbidden_reason_table() {
        let mismatches: Vec<String> = ADDRESS_CASES
            .iter()
            .filter_map(|&(input, expected)| {
                let ip: IpAddr = input.parse().unwrap_or_else(|e| panic!("{input}: {e}"));
                let actual = forbidden_reason(ip);
                let as_expected = match (actual, expected) {
                    (None, None) => true,
                    (Some(reason), Some(fragment)) => reason.contains(fragment),
                    _ => false,
                };
                (!as_expected).then(|| format!("{input}: expected {expected:?}, got {actual:?}"))
            })
            .collect();
        assert!(mismatches.is_empty(), "{mismatches:#?}");
    }

    #[test]
    fn rule_tables_hold_canonical_networks() {
        for (network, _) in FORBIDDEN_V4 {
            assert_eq!(*network, network.trunc(), "{network}");
        }
        let v6_networks = FORBIDDEN_V6
            .iter()
            .map(|(network, _)| network)
            .chain(EMBEDDED_V4.iter().map(|(network, _)| network))
            .chain([&IPV4_COMPATIBLE_V6, &GLOBAL_UNICAST_V6]);
        for network in v6_networks {
            assert_eq!(*network, network.trunc(), "{network}");
        }
    }

    #[test]
    fn allow_list_takes_precedence_only_for_listed_networks() {
        let policy = AddressPolicy::new(vec!["127.0.0.0/8".parse().unwrap()], false);
        assert_eq!(
            policy.check_url(&Url::parse("http://127.0.0.1/").unwrap()),
            Ok(())
        );
        assert_eq!(
            policy.check_url(&Url::parse("http://127.1:9000/").unwrap()),
            Ok(())
        );
        assert_eq!(
            policy.check_url(&Url::parse("http://10.0.0.1/").unwrap()),
            Err(SsrfError::Forbidden {
                ip: "10.0.0.1".parse().unwrap(),
                reason: PRIVATE,
            })
        );
        assert!(policy
            .check_url(&Url::parse("http://[::1]/").unwrap())
            .is_err());
        // Names are refused before any address is known, whatever the allow-list says.
        assert!(policy
            .check_url(&Url::parse("http://localhost/").unwrap())
            .is_err());
    }

    #[test]
    fn allow_list_matches_ipv4_mapped_addresses_both_ways() {
        let v4_listed = AddressPolicy::new(vec!["127.0.0.0/8".parse().unwrap()], false);
        assert_eq!(
            v4_listed.check_ip("::ffff:127.0.0.1".parse().unwrap()),
            Ok(())
        );

        let mapped_listed = AddressPolicy::new(vec!["::ffff:10.0.0.0/104".parse().unwrap()], false);
        assert_eq!(mapped_listed.check_ip("10.1.2.3".parse().unwrap()), Ok(()));
        assert!(mapped_listed
            .check_ip("192.168.0.1".parse().unwrap())
            .is_err());
    }

    #[test]
    fn https_only_refuses_plain_http() {
        let policy = AddressPolicy::new(Vec::new(), true);
        assert!(policy.https_only());
        assert_eq!(
            policy.check_url(&Url::parse("http://example.com/hook").unwrap()),
            Err(SsrfError::HttpsRequired)
        );
        assert_eq!(
            policy.check_url(&Url::parse("https://example.com/hook").unwrap()),
            Ok(())
        );
        assert!(matches!(
            policy.check_url(&Url::parse("ftp://example.com/").unwrap()),
            Err(SsrfError::Scheme(scheme)) if scheme == "ftp"
        ));
    }

    #[test]
    fn default_policy_is_empty_and_allows_plain_http() {
        let policy = AddressPolicy::default();
        assert!(policy.allow_list().is_empty());
        assert!(!policy.https_only());
        let networks: Vec<IpNet> = vec!["127.0.0.0/8".parse().unwrap()];
        assert_eq!(
            AddressPolicy::new(networks.clone(), false).allow_list(),
            &networks[..]
        );
    }

    #[tokio::test]
    async fn resolve_checked_refuses_localhost_unless_allow_listed() {
        let refused = AddressPolicy::default()
            .resolve_checked("localhost", 80)
            .await;
        assert!(
            matches!(
                refused,
                Err(SsrfError::ResolvesForbidden {
                    reason: LOOPBACK,
                    ..
                })
            ),
            "{refused:?}"
        );
        // Whoever set the URL learns the kind of address, not the address.
        let message = refused.unwrap_err().to_string();
        assert!(
            !message.contains("127.0.0.1") && !message.contains("::1"),
            "{message}"
        );

        let addresses = loopback_allowed()
            .resolve_checked("localhost", 80)
            .await
            .unwrap();
        assert!(!addresses.is_empty());
        assert!(addresses
            .iter()
            .all(|address| address.ip().is_loopback() && address.port() == 80));
    }

    #[tokio::test]
    async fn resolve_checked_handles_ip_literals() {
        let policy = AddressPolicy::default();
        assert!(policy.resolve_checked("[::1]", 443).await.is_err());
        assert_eq!(
            policy.resolve_checked("8.8.8.8", 443).await,
            Ok(vec!["8.8.8.8:443".parse().unwrap()])
        );
    }

    /// Serves `200 OK` to every connection on 127.0.0.1 until the test ends.
    async fn spawn_ok_server() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buffer = [0u8; 1024];
                    while !request.windows(4).any(|window| window == b"\r\n\r\n") {
                        match stream.read(&mut buffer).await {
                            Ok(0) | Err(_) => return,
                            Ok(read) => request.extend_from_slice(&buffer[..read]),
                        }
                    }
                    let response =
                        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok";
                    let _ = stream.write_all(response).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        port
    }

    fn guarded_client(policy: AddressPolicy) -> reqwest::Client {
        reqwest::Client::builder()
            .dns_resolver(Arc::new(GuardedResolver::new(policy)))
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(std::time::Duration::from_secs(10))
            .build()
            .unwrap()
    }

    fn error_chain(error: &dyn StdError) -> String {
        let mut messages = vec![error.to_string()];
        let mut source = error.source();
        while let Some(cause) = source {
            messages.push(cause.to_string());
            source = cause.source();
        }
        messages.join(": ")
    }

    #[tokio::test]
    async fn guarded_client_refuses_localhost_by_default() {
        let port = spawn_ok_server().await;
        let client = guarded_client(AddressPolicy::default());
        let error = client
            .get(format!("http://localhost:{port}/"))
            .send()
            .await
            .unwrap_err();
        let chain = error_chain(&error);
        // The client's error tells no more than that: the reason is for the server's log.
        assert!(chain.contains(REFUSED_AT_SEND), "{chain}");
        assert!(!chain.contains("loopback"), "{chain}");
    }

    /// Whatever the address and its reason, a refused one reads the same; only the server
    /// sees why.
    #[test]
    fn a_refused_address_reads_the_same_whatever_its_reason() {
        let reason = |ip: &str| forbidden_reason(ip.parse().unwrap()).unwrap();
        let refused = [
            SsrfError::Forbidden {
                ip: "127.0.0.1".parse().unwrap(),
                reason: reason("127.0.0.1"),
            },
            SsrfError::ResolvesForbidden {
                host: "db.internal".into(),
                reason: reason("10.0.0.1"),
            },
            SsrfError::ResolvesForbidden {
                host: "metadata.internal".into(),
                reason: reason("169.254.169.254"),
            },
        ];
        for error in refused {
            let detail = error.to_string();
            let refused = RefusedAddress::of(error).unwrap();
            assert_eq!(refused.to_string(), REFUSED_AT_SEND);
            assert_eq!(refused.reason().to_string(), detail);
        }
        // What is wrong with the URL's own text is not an address: it stays as it is.
        let scheme = SsrfError::Scheme("ftp".into());
        assert_eq!(RefusedAddress::of(scheme.clone()), Err(scheme));
    }

    #[tokio::test]
    async fn guarded_client_reaches_allow_listed_localhost() {
        let port = spawn_ok_server().await;
        let client = guarded_client(loopback_allowed());
        let response = client
            .post(format!("http://localhost:{port}/hook"))
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), reqwest::StatusCode::OK);
        assert_eq!(response.text().await.unwrap(), "ok");
    }
}
