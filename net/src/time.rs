//! RFC 3339 instants for `Pico-Expires-At` and the admin API: parsed with `Z` or `±hh:mm`
//! offsets (by the `time` crate), always rendered in UTC, whole seconds when the milliseconds
//! are zero and three digits when they are not.

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Parses `YYYY-MM-DDTHH:MM:SS[.fff…](Z|±hh:mm)` into Unix milliseconds.
pub fn parse_rfc3339_ms(text: &str) -> Option<i64> {
    let instant = OffsetDateTime::parse(text, &Rfc3339).ok()?;
    i64::try_from(instant.unix_timestamp_nanos().div_euclid(1_000_000)).ok()
}

/// Renders Unix milliseconds as RFC 3339 UTC. Instants beyond what RFC 3339 can write (before
/// year 0 or after 9999) are clamped to its range.
pub fn format_rfc3339_ms(ms: i64) -> String {
    let nanos = i128::from(ms) * 1_000_000;
    let instant = OffsetDateTime::from_unix_timestamp_nanos(nanos).unwrap_or(if ms < 0 {
        OffsetDateTime::UNIX_EPOCH
            .replace_year(0)
            .expect("year 0 is in range")
    } else {
        OffsetDateTime::UNIX_EPOCH
            .replace_year(9999)
            .expect("year 9999 is in range")
    });
    let (year, month, day) = (instant.year(), u8::from(instant.month()), instant.day());
    let (hour, minute, second) = (instant.hour(), instant.minute(), instant.second());
    match instant.millisecond() {
        0 => format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}Z"),
        millis => {
            format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{millis:03}Z")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_formats() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339_ms("2100-01-01T00:00:00Z"),
            Some(4_102_444_800_000)
        );
        assert_eq!(
            parse_rfc3339_ms("2100-01-01T01:00:00+01:00"),
            Some(4_102_444_800_000)
        );
        assert_eq!(
            parse_rfc3339_ms("2099-12-31T23:00:00-01:00"),
            Some(4_102_444_800_000)
        );
        assert_eq!(
            parse_rfc3339_ms("2024-02-29T12:00:00.5Z"),
            Some(1_709_208_000_500)
        );
        assert_eq!(parse_rfc3339_ms("2023-02-29T12:00:00Z"), None);
        assert_eq!(parse_rfc3339_ms("1700000000000"), None);
        assert_eq!(parse_rfc3339_ms("2024-01-01T00:00:00"), None);
        assert_eq!(format_rfc3339_ms(4_102_444_800_000), "2100-01-01T00:00:00Z");
        assert_eq!(
            format_rfc3339_ms(1_709_208_000_500),
            "2024-02-29T12:00:00.500Z"
        );
        assert_eq!(format_rfc3339_ms(-1), "1969-12-31T23:59:59.999Z");
        assert_eq!(parse_rfc3339_ms("1969-12-31T23:59:59.999Z"), Some(-1));
        assert!(format_rfc3339_ms(i64::MAX).starts_with("9999-"));
        assert!(format_rfc3339_ms(i64::MIN).starts_with("0000-"));
        for ms in [0, 951_782_400_123, 4_102_444_800_000, 1_709_208_000_500] {
            assert_eq!(parse_rfc3339_ms(&format_rfc3339_ms(ms)), Some(ms));
        }
    }
}
