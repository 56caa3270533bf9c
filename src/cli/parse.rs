//! Parsers of argument values clap does not know: sizes, `NAMESPACE/APP`, listen addresses,
//! durations and etcd key prefixes.

use std::net::SocketAddr;
use std::time::Duration;

/// What a duration is written like, for the messages.
const DURATION_HINT: &str = "a duration like 500ms, 10s, 1m30s, 1.5s or 2h";

/// Why an argument value is refused; clap shows the message after the flag's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ValueError {
    #[error("{text:?} is not a size like 65536, 64Ki, 64Mi or 1Gi")]
    Size { text: String },
    #[error("{text:?} has unknown unit {unit:?}; use Ki, Mi or Gi")]
    SizeUnit { text: String, unit: String },
    #[error("{text:?} is too large")]
    SizeTooLarge { text: String },
    #[error(
        "{text:?} has {c:?} at byte {at}; an etcd prefix takes letters, digits and / . _ - : only (every byte is part of the keys, so another spelling is another key space)"
    )]
    EtcdPrefix { text: String, c: char, at: usize },
    #[error(
        "{text:?} is not NAMESPACE/APP (an app is its namespace and its app label, e.g. default/{example})"
    )]
    App { text: String, example: String },
    #[error("{text:?} is not a listen address like :8443, 0.0.0.0:8443 or [::]:8443 ({why})")]
    Listen { text: String, why: String },
    #[error("an empty string is not {DURATION_HINT}")]
    EmptyDuration,
    #[error("{text:?} is too large for {DURATION_HINT}")]
    DurationTooLarge { text: String },
    #[error("{text:?} is not {DURATION_HINT}: {number:?} is not a number")]
    NotANumber { text: String, number: String },
    #[error("{text:?} is not {DURATION_HINT}: {number} has no unit")]
    NoUnit { text: String, number: String },
    #[error("{text:?} is not {DURATION_HINT}: unknown unit {unit:?} (use ns, us, ms, s, m or h)")]
    DurationUnit { text: String, unit: String },
}

/// `65536`, `64Ki`, `64Mi`, `1Gi`.
pub(crate) fn parse_size(text: &str) -> Result<usize, ValueError> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: usize = number
        .parse()
        .map_err(|_| ValueError::Size { text: text.into() })?;
    let scale: usize = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        _ => {
            return Err(ValueError::SizeUnit {
                text: text.into(),
                unit: unit.into(),
            });
        }
    };
    value
        .checked_mul(scale)
        .ok_or_else(|| ValueError::SizeTooLarge { text: text.into() })
}

/// `--etcd-prefix`: letters, digits and `/ . _ - :`, as etcd users write key prefixes
/// (`/ip-webhook/`, `/calico/ipam/v2/`). Anything else — a space, a control character, a
/// non-ASCII letter — is refused: every byte is part of the key, so `" /ipw"` would be a key
/// space of its own, and two replicas given different spellings would hand out one IP twice.
pub(crate) fn parse_etcd_prefix(text: &str) -> Result<String, ValueError> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '-' | ':');
    match text.char_indices().find(|(_, c)| !allowed(*c)) {
        None => Ok(text.to_string()),
        Some((at, c)) => Err(ValueError::EtcdPrefix {
            text: text.into(),
            c,
            at,
        }),
    }
}

/// `--app`: `NAMESPACE/APP`.
pub(crate) fn parse_app(text: &str) -> Result<String, ValueError> {
    match text.split_once('/') {
        Some((namespace, app))
            if !namespace.is_empty() && !app.is_empty() && !app.contains('/') =>
        {
            Ok(text.to_string())
        }
        _ => Err(ValueError::App {
            text: text.into(),
            example: if text.is_empty() || text.contains('/') {
                "web".into()
            } else {
                text.into()
            },
        }),
    }
}

/// A listen address: `HOST:PORT` with an IP address (IPv6 in brackets) or `localhost`, or
/// Go's `:PORT` for every IPv4 address.
pub(crate) fn parse_listen(text: &str) -> Result<SocketAddr, ValueError> {
    let bad = |why: &str| ValueError::Listen {
        text: text.into(),
        why: why.into(),
    };
    // A host alone (`localhost`, `10.0.0.1`, `[::1]`) or a port alone (`8443`): say which half
    // is missing, with the address that was probably meant.
    let host = text.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
    if text == "localhost"
        || text.parse::<std::net::Ipv4Addr>().is_ok()
        || host.is_some_and(|h| h.parse::<std::net::Ipv6Addr>().is_ok())
        || text.parse::<std::net::Ipv6Addr>().is_ok()
    {
        let host = match text.parse::<std::net::Ipv6Addr>() {
            Ok(_) => format!("[{text}]"),
            Err(_) => text.to_string(),
        };
        return Err(bad(&format!("the port is missing: write {host}:8443")));
    }
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad(&format!(
            "the host is missing: write :{text} for every IPv4 address"
        )));
    }
    if let Some(port) = text.strip_prefix(':') {
        let port: u16 = port.parse().map_err(|_| bad("bad port"))?;
        return Ok(SocketAddr::from(([0, 0, 0, 0], port)));
    }
    if let Some(port) = text.strip_prefix("localhost:") {
        let port: u16 = port.parse().map_err(|_| bad("bad port"))?;
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    text.parse()
        .map_err(|_| bad("the host must be an IP address or localhost"))
}

/// A duration as Go writes them: `500ms`, `10s`, `1m30s`, `1.5s`, `2h45m`, units `ns`, `us`
/// (`µs`), `ms`, `s`, `m`, `h`; a bare whole number is seconds.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, ValueError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(ValueError::EmptyDuration);
    }
    let too_large = || ValueError::DurationTooLarge { text: text.into() };
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|_| too_large());
    }
    let mut nanos: u128 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_end);
        let unit_end = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_end);
        rest = after;
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
            return Err(ValueError::NotANumber {
                text: text.into(),
                number: number.into(),
            });
        }
        let per_unit: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => {
                return Err(ValueError::NoUnit {
                    text: text.into(),
                    number: number.into(),
                });
            }
            other => {
                return Err(ValueError::DurationUnit {
                    text: text.into(),
                    unit: other.into(),
                });
            }
        };
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| too_large())?
        };
        // Go truncates a fraction finer than a nanosecond; so does this.
        let fraction = &fraction[..fraction.len().min(18)];
        let fraction_nanos = if fraction.is_empty() {
            0
        } else {
            let digits: u128 = fraction.parse().map_err(|_| too_large())?;
            digits * per_unit / 10u128.pow(fraction.len() as u32)
        };
        nanos = whole
            .checked_mul(per_unit)
            .and_then(|n| n.checked_add(fraction_nanos))
            .and_then(|n| n.checked_add(nanos))
            .filter(|n| *n <= u64::MAX as u128)
            .ok_or_else(too_large)?;
    }
    Ok(Duration::from_nanos(nanos as u64))
}
