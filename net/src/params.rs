//! Request parameters both protocols parse the same way: query strings, boolean headers,
//! strict integers.

use pico_engine::rules::ProducerTuple;

use crate::transport::message::Request;

/// Strict unsigned integer: digits only, no sign, no leading zeros but `0`, fits u64.
pub fn strict_u64(text: &str) -> Option<u64> {
    let valid = !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    valid.then(|| text.parse().ok()).flatten()
}

/// A header that means "yes" only as `true`, in any case; any other value is absent.
pub fn header_true(request: &Request, name: &str) -> bool {
    request
        .header(name)
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// Only some of the three producer headers were given.
#[derive(Debug)]
pub struct PartialProducer;

/// An idempotent producer's identity from its three headers: all three or none.
pub fn producer_tuple(
    id: Option<&str>,
    epoch: Option<u64>,
    seq: Option<u64>,
) -> Result<Option<ProducerTuple>, PartialProducer> {
    match (id, epoch, seq) {
        (None, None, None) => Ok(None),
        (Some(id), Some(epoch), Some(seq)) => Ok(Some(ProducerTuple {
            id: id.to_string(),
            epoch,
            seq,
        })),
        _ => Err(PartialProducer),
    }
}

/// The first value of a query parameter, percent-decoded with `+` as space.
/// `scheme://host` of a request, by its `Host` header (`localhost` without one): the base of
/// absolute URLs a node hands out (`Location`, webhook callbacks).
pub fn base_url(scheme: &str, request: &Request) -> String {
    let host = request.header("host").unwrap_or("localhost");
    format!("{scheme}://{host}")
}

pub fn query_param(query: &str, key: &str) -> Option<String> {
    query_values(query, key).into_iter().next()
}

/// Every value of a query parameter, percent-decoded (`application/x-www-form-urlencoded`:
/// `+` is a space, a malformed escape stays as it is, bytes that are not UTF-8 become U+FFFD).
pub fn query_values(query: &str, key: &str) -> Vec<String> {
    form_urlencoded::parse(query.as_bytes())
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v.into_owned())
        .collect()
}

/// A new stream's lifetime that ends at its create (`400`), naming the header that set it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpiryError {
    /// A TTL of 0.
    ZeroTtl { header: &'static str },
    /// An expiry time that has passed.
    Past { header: &'static str },
}

impl std::fmt::Display for ExpiryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExpiryError::ZeroTtl { header } => write!(
                f,
                "{header} must be at least 1 second (0 would expire the stream at once)"
            ),
            ExpiryError::Past { header } => write!(f, "{header} is in the past"),
        }
    }
}

impl std::error::Error for ExpiryError {}

/// A new stream's lifetime must outlast its create: a TTL of 0 or an expiry that has passed
/// would answer `201 Created` and then `404` to the next request. `Err` says which header.
pub fn check_expiry(
    ttl_sec: Option<u64>,
    expires_at_ms: Option<i64>,
    ttl_header: &'static str,
    expires_header: &'static str,
) -> Result<(), ExpiryError> {
    if ttl_sec == Some(0) {
        return Err(ExpiryError::ZeroTtl { header: ttl_header });
    }
    if expires_at_ms.is_some_and(|at| at <= pico_engine::now_ms()) {
        return Err(ExpiryError::Past {
            header: expires_header,
        });
    }
    Ok(())
}

/// Why a control API's JSON body was refused: `(status, code, message)` in the words both
/// control APIs (subscriptions, consumers) answer with, each in its own error type.
pub type ControlBodyError = (u16, &'static str, String);

/// A control API's JSON body: at most [`CONTROL_BODY_BYTES_MAX`] bytes (`413`), and an empty
/// or blank body reads as `{}`, so a request with no settings needs none.
///
/// [`CONTROL_BODY_BYTES_MAX`]: crate::limits::CONTROL_BODY_BYTES_MAX
pub fn control_json(body: &[u8]) -> Result<serde_json::Value, ControlBodyError> {
    use crate::limits::CONTROL_BODY_BYTES_MAX;
    if body.len() > CONTROL_BODY_BYTES_MAX {
        return Err((
            413,
            "LIMIT_EXCEEDED",
            format!("control request bodies are at most {CONTROL_BODY_BYTES_MAX} bytes"),
        ));
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(serde_json::Value::Object(Default::default()));
    }
    serde_json::from_slice(body)
        .map_err(|_| (400, "INVALID_REQUEST", "Invalid JSON body".to_string()))
}

/// The bearer token of `Authorization: Bearer <token>`, as text.
pub fn bearer_text(request: &Request) -> Option<&str> {
    crate::auth::bearer(request.header("authorization")).and_then(|t| std::str::from_utf8(t).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #![proptest_config(crate::fuzzing::config())]
        #[test]
        fn fuzz_query(query in crate::fuzzing::inputs("query")) {
            let query = String::from_utf8_lossy(&query);
            for key in ["seq", "offset", "cursor", "live", "prefix", "limit", ""] {
                for value in query_values(&query, key) {
                    if let Some(n) = strict_u64(&value) {
                        proptest::prop_assert_eq!(n.to_string(), value);
                    }
                }
            }
        }
    }

    #[test]
    fn query_values_decode_percent_and_plus() {
        assert_eq!(query_values("a=%2Fx+y&a=2&b=3", "a"), vec!["/x y", "2"]);
        assert_eq!(query_param("a=%zz%", "a").as_deref(), Some("%zz%"));
    }

    #[test]
    fn strict_integers() {
        assert_eq!(strict_u64("0"), Some(0));
        assert_eq!(strict_u64("42"), Some(42));
        for bad in ["", "01", "+1", "-1", "1.0", "18446744073709551616", " 1"] {
            assert_eq!(strict_u64(bad), None, "{bad}");
        }
    }

    #[test]
    fn query_parsing() {
        assert_eq!(query_param("a=1&a=2", "a").as_deref(), Some("1"));
        assert_eq!(
            query_param("prefix=%2Flogs+x", "prefix").as_deref(),
            Some("/logs x")
        );
        assert_eq!(query_param("p=%zz", "p").as_deref(), Some("%zz"));
        assert_eq!(query_param("p=%", "p").as_deref(), Some("%"));
        assert_eq!(query_param("x", "x").as_deref(), Some(""));
        assert_eq!(query_param("", "x"), None);
    }
}
