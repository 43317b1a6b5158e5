//! What a record of a JSON stream must be, whichever protocol appends it: exactly one JSON
//! value (RFC 8259), nested at most [`JSON_DEPTH_MAX`] deep, and whose strings are Unicode
//! (a `\u` escape of a surrogate must be half of a pair). A Durable Streams reader joins a JSON
//! stream's records into one array, so a record that is not one value would make its answer
//! invalid JSON or split one message in two; deep nesting and lone surrogates break common
//! readers (recursive parsers, strict UTF-8 decoders).

/// Deepest nesting of arrays and objects in one record; deeper is `400`.
pub const JSON_DEPTH_MAX: usize = 64;

/// Whether `content_type` names JSON (`application/json`, any parameters, any case).
pub fn is_json(content_type: &str) -> bool {
    crate::rules::mime_base_is(content_type, "application/json")
}

/// Why a record is not a JSON stream's record.
#[derive(Debug)]
pub enum JsonError {
    /// Not exactly one JSON value (serde_json says where and why).
    NotOneValue(serde_json::Error),
    /// Arrays and objects nested deeper than [`JSON_DEPTH_MAX`].
    TooDeep,
    /// A `\u` escape of a surrogate that is not half of a pair.
    LoneSurrogate,
    /// A string without its closing quote.
    Unterminated,
    /// A `\u` escape cut short by the end of the text.
    ShortEscape,
    /// A `\u` escape whose four characters are not hexadecimal digits.
    BadEscape,
}

impl std::fmt::Display for JsonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JsonError::NotOneValue(e) => write!(f, "not one JSON value: {e}"),
            JsonError::TooDeep => write!(f, "JSON nested deeper than {JSON_DEPTH_MAX}"),
            JsonError::LoneSurrogate => {
                f.write_str("a JSON string holds a lone surrogate (\\uD800-\\uDFFF)")
            }
            JsonError::Unterminated => f.write_str("an unterminated JSON string"),
            JsonError::ShortEscape => f.write_str("a short \\u escape"),
            JsonError::BadEscape => f.write_str("a bad \\u escape"),
        }
    }
}

/// Equal when the same check failed at the same place (serde_json's errors compare by their
/// category and position).
impl PartialEq for JsonError {
    fn eq(&self, other: &JsonError) -> bool {
        match (self, other) {
            (JsonError::NotOneValue(a), JsonError::NotOneValue(b)) => {
                a.classify() == b.classify() && a.line() == b.line() && a.column() == b.column()
            }
            (a, b) => std::mem::discriminant(a) == std::mem::discriminant(b),
        }
    }
}

impl Eq for JsonError {}

impl std::error::Error for JsonError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            JsonError::NotOneValue(e) => Some(e),
            _ => None,
        }
    }
}

/// `Ok` when `bytes` is one JSON value within the rules above; otherwise why not.
pub fn check_value(bytes: &[u8]) -> Result<(), JsonError> {
    serde_json::from_slice::<serde::de::IgnoredAny>(bytes).map_err(JsonError::NotOneValue)?;
    check_parsed_value(bytes)
}

/// The rules serde_json does not check, on text it parsed as one value already: nesting depth
/// (its skipping of a value has no limit) and surrogate escapes (it accepts a lone one).
pub fn check_parsed_value(bytes: &[u8]) -> Result<(), JsonError> {
    let mut depth = 0usize;
    let mut i = 0usize;
    while i < bytes.len() {
        match bytes[i] {
            b'[' | b'{' => {
                depth += 1;
                if depth > JSON_DEPTH_MAX {
                    return Err(JsonError::TooDeep);
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            b'"' => i = string_end(bytes, i + 1)?,
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

/// The index of the closing quote of the string starting at `i`, checking its `\u` escapes.
fn string_end(bytes: &[u8], mut i: usize) -> Result<usize, JsonError> {
    let lone = || Err(JsonError::LoneSurrogate);
    while i < bytes.len() {
        match bytes[i] {
            b'"' => return Ok(i),
            b'\\' if bytes.get(i + 1) == Some(&b'u') => {
                let unit = hex4(bytes, i + 2)?;
                i += 6;
                if (0xDC00..=0xDFFF).contains(&unit) {
                    return lone();
                }
                if (0xD800..=0xDBFF).contains(&unit) {
                    let low = (bytes.get(i) == Some(&b'\\') && bytes.get(i + 1) == Some(&b'u'))
                        .then(|| hex4(bytes, i + 2))
                        .transpose()?;
                    match low {
                        Some(low) if (0xDC00..=0xDFFF).contains(&low) => i += 6,
                        _ => return lone(),
                    }
                }
                continue;
            }
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
    Err(JsonError::Unterminated)
}

fn hex4(bytes: &[u8], at: usize) -> Result<u16, JsonError> {
    let digits = bytes
        .get(at..at + 4)
        .and_then(|d| std::str::from_utf8(d).ok())
        .ok_or(JsonError::ShortEscape)?;
    u16::from_str_radix(digits, 16).map_err(|_| JsonError::BadEscape)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_value_is_a_record_and_anything_else_is_not() {
        for good in [
            &b"1"[..],
            b" \"a\" ",
            b"[1,{\"a\":[]}]",
            b"\"\\ud83d\\ude00 \\\\u0041 \\\"\"",
            b"null",
        ] {
            assert!(
                check_value(good).is_ok(),
                "{}",
                String::from_utf8_lossy(good)
            );
        }
        for bad in [
            &b""[..],
            b"1 2",
            b"{\"a\":1}{\"b\":2}",
            b"[1,",
            b"1]",
            b"\"\\ud800\"",
            b"\"\\udc00\"",
            b"\"\\ud800\\u0041\"",
            b"\"\\ud800x\"",
        ] {
            assert!(
                check_value(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn nesting_stops_at_its_limit() {
        let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        assert!(check_value(nested(JSON_DEPTH_MAX).as_bytes()).is_ok());
        assert!(check_value(nested(JSON_DEPTH_MAX + 1).as_bytes()).is_err());
        // Brackets inside strings do not count.
        let quoted = format!("\"{}\"", "[".repeat(1000));
        assert!(check_value(quoted.as_bytes()).is_ok());
        // Deep input is refused without recursion, however deep.
        assert!(check_value(nested(1_000_000).as_bytes()).is_err());
    }

    #[test]
    fn content_types_that_name_json() {
        assert!(is_json("application/json"));
        assert!(is_json("Application/JSON; charset=utf-8"));
        assert!(!is_json("application/json-seq"));
        assert!(!is_json("text/plain"));
    }
}
