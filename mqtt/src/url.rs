//! Broker URLs: `mqtt://host[:port]` (port 1883) and `mqtts://host[:port]`
//! (TLS, port 8883). Nothing else: credentials go in their own settings,
//! never in a URL that ends up in logs.

use std::fmt;

/// A parsed broker URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerUrl {
    /// Host name or address (IPv6 without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// `mqtts://`.
    pub tls: bool,
}

/// Why a broker URL was refused; the message quotes the URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UrlError(String);

impl BrokerUrl {
    /// Parses `url`.
    pub fn parse(url: &str) -> Result<Self, UrlError> {
        let bad = |reason: &str| UrlError(format!("{url:?} {reason}"));
        let (tls, rest) = if let Some(rest) = url.strip_prefix("mqtt://") {
            (false, rest)
        } else if let Some(rest) = url.strip_prefix("mqtts://") {
            (true, rest)
        } else {
            return Err(bad("must start with mqtt:// or mqtts://"));
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['/', '@', '?']) {
            return Err(bad(
                "must be scheme://host[:port] (credentials go in username/password)",
            ));
        }
        let (host, port) = match rest.strip_prefix('[') {
            Some(v6) => {
                let (host, after) = v6.split_once(']').ok_or_else(|| bad("has an unclosed '['"))?;
                match after.strip_prefix(':') {
                    Some(p) => (host, Some(p)),
                    None if after.is_empty() => (host, None),
                    None => return Err(bad("has junk after the address")),
                }
            }
            None => match rest.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (rest, None),
            },
        };
        if host.is_empty() {
            return Err(bad("has no host"));
        }
        let port = match port {
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| bad(&format!("has an invalid port {p:?}")))?,
            None if tls => 8883,
            None => 1883,
        };
        Ok(Self {
            host: host.to_owned(),
            port,
            tls,
        })
    }
}

impl fmt::Display for BrokerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "mqtts" } else { "mqtt" };
        if self.host.contains(':') {
            write!(f, "{scheme}://[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{scheme}://{}:{}", self.host, self.port)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(url: &str) -> (bool, String, u16) {
        let u = BrokerUrl::parse(url).unwrap();
        (u.tls, u.host, u.port)
    }

    #[test]
    fn urls_name_scheme_host_and_port() {
        assert_eq!(parts("mqtt://h"), (false, "h".into(), 1883));
        assert_eq!(parts("mqtts://h"), (true, "h".into(), 8883));
        assert_eq!(
            parts("mqtts://broker.example:9000/"),
            (true, "broker.example".into(), 9000)
        );
        assert_eq!(parts("mqtt://[::1]:1884"), (false, "::1".into(), 1884));
        assert_eq!(
            BrokerUrl::parse("mqtt://[::1]:1884").unwrap().to_string(),
            "mqtt://[::1]:1884"
        );
    }

    #[test]
    fn anything_else_is_refused_with_the_url_quoted() {
        for bad in [
            "tcp://x",
            "mqtt://",
            "mqtt://x:port",
            "mqtt://h:0",
            "mqtt://u:p@h",
            "mqtt://h/path",
            "mqtt://[::1",
            "mqtt://[::1]x",
        ] {
            let err = BrokerUrl::parse(bad).unwrap_err().to_string();
            assert!(err.contains(&format!("{bad:?}")), "{bad}: {err}");
        }
    }
}
