//! The parsers of flag values argh cannot parse itself: durations, sizes, addresses and
//! the named choices.

use pico_client::Protocol;

/// Durations in whole seconds: a plain number, or one with a unit (`90s`, `30m`, `12h`, `7d`).
pub fn parse_duration(value: &str) -> Result<u64, String> {
    let trimmed = value.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(split);
    let bad = || format!("expected a duration such as 90s, 30m, 12h or 7d, got {value:?}");
    let number: u64 = digits.parse().map_err(|_| bad())?;
    let unit_secs = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(bad()),
    };
    number
        .checked_mul(unit_secs)
        .ok_or_else(|| format!("duration {value:?} is too large"))
}

/// Non-negative seconds, fractions allowed (`0.5`).
pub(super) fn parse_seconds(value: &str) -> Result<f64, String> {
    value
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0 && *s <= 1e9)
        .ok_or_else(|| format!("expected seconds (e.g. 25 or 0.5), got {value:?}"))
}

pub(super) fn parse_protocol(value: &str) -> Result<Protocol, String> {
    value.parse()
}

pub(super) fn parse_durability(value: &str) -> Result<pico_net::Durability, String> {
    match value.to_ascii_lowercase().as_str() {
        "local" => Ok(pico_net::Durability::Local),
        "object" => Ok(pico_net::Durability::Object),
        "memory" => Ok(pico_net::Durability::Memory),
        _ => Err("expected local, object or memory".into()),
    }
}

pub(super) fn parse_log_format(value: &str) -> Result<crate::logger::Format, String> {
    value.parse()
}

pub(super) fn parse_auth(value: &str) -> Result<bool, String> {
    match value.to_ascii_lowercase().as_str() {
        "off" => Ok(false),
        "required" => Ok(true),
        _ => Err("expected off or required".into()),
    }
}

pub(super) fn parse_routing(value: &str) -> Result<String, String> {
    match value {
        "redirect" | "local" => Ok(value.into()),
        _ => Err("expected redirect or local".into()),
    }
}

pub(super) fn parse_batch(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(0) => Err("the batch size must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(_) => Err("expected a positive number".into()),
    }
}

/// `HOST:PORT` with a numeric port. Host names are allowed (`localhost:4437`); resolving and
/// binding are the server's job, which reports failures in its own words.
pub fn parse_socket_addr(value: &str) -> Result<String, String> {
    if value.parse::<std::net::SocketAddr>().is_ok() {
        return Ok(value.into());
    }
    match value.rsplit_once(':') {
        Some((host, port))
            if !host.is_empty() && !host.contains(':') && port.parse::<u16>().is_ok() =>
        {
            Ok(value.into())
        }
        _ => Err("expected HOST:PORT, e.g. 127.0.0.1:4437".into()),
    }
}

/// `--ds-listen`: `HOST:PORT`, or `off` for no second listener.
pub fn parse_listener_or_off(value: &str) -> Result<String, String> {
    if value.eq_ignore_ascii_case("off") {
        return Ok("off".into());
    }
    parse_socket_addr(value).map_err(|e| format!("{e}, or off"))
}

/// Byte sizes: a plain number, or one with a binary suffix (`64KiB`, `8MiB`, `1G`; `K`, `KB`
/// and `KiB` all mean 1024, as cache and segment sizes are customarily powers of two).
pub fn parse_size(value: &str) -> Result<u64, String> {
    let trimmed = value.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, suffix) = trimmed.split_at(split);
    let bad = || format!("expected a size such as 65536, 64KiB or 8MiB, got {value:?}");
    let number: u64 = digits.parse().map_err(|_| bad())?;
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => return Err(bad()),
    };
    number
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("size {value:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90"), Ok(90));
        assert_eq!(parse_duration("90s"), Ok(90));
        assert_eq!(parse_duration("30m"), Ok(1800));
        assert_eq!(parse_duration("12h"), Ok(43_200));
        assert_eq!(parse_duration("7d"), Ok(604_800));
        assert_eq!(parse_duration("0"), Ok(0));
        for bad in ["", "d", "7w", "-1d", "1.5h", "99999999999999999999d"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
        assert!(
            parse_duration("213503982334602d").is_err(),
            "overflows u64 seconds"
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("65536"), Ok(65536));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("8 MiB"), Ok(8 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("0"), Ok(0));
        assert!(parse_size("").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("12XB").is_err());
        assert!(parse_size("99999999999999999999").is_err());
        assert!(parse_size("18446744073709551615G").is_err());
    }

    #[test]
    fn socket_addrs() {
        for ok in ["127.0.0.1:4437", "[::1]:80", "localhost:9090", "0.0.0.0:0"] {
            assert!(parse_socket_addr(ok).is_ok(), "{ok}");
        }
        for bad in ["4437", "127.0.0.1", ":80", "host:port", "::1:80", "h:70000"] {
            assert!(parse_socket_addr(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn batch_zero_is_rejected() {
        assert!(parse_batch("0").is_err());
        assert_eq!(parse_batch("100"), Ok(100));
    }
}
