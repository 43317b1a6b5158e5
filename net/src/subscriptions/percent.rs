//! Percent-encoding as JavaScript's `encodeURIComponent` / `decodeURIComponent` do it: ids
//! and stream paths travel as single path segments.

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// What `encodeURIComponent` escapes: everything but `A-Z a-z 0-9 - _ . ! ~ * ' ( )`.
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'!')
    .remove(b'~')
    .remove(b'*')
    .remove(b'\'')
    .remove(b'(')
    .remove(b')');

pub fn encode_component(text: &str) -> String {
    utf8_percent_encode(text, COMPONENT).to_string()
}

/// Decodes `%XX` escapes; `None` for a malformed escape (which `decodeURIComponent` refuses
/// and the crate would pass through) or bytes that are not UTF-8.
pub fn decode_component(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let well_formed = bytes.iter().enumerate().all(|(i, &b)| {
        b != b'%'
            || bytes
                .get(i + 1..i + 3)
                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
    });
    if !well_formed {
        return None;
    }
    percent_decode_str(text)
        .decode_utf8()
        .ok()
        .map(|text| text.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        assert_eq!(encode_component("manual/b"), "manual%2Fb");
        assert_eq!(encode_component("sub-1_a.b~"), "sub-1_a.b~");
        assert_eq!(encode_component("é ?"), "%C3%A9%20%3F");
        for text in ["manual/b", "é ?&=", "plain"] {
            assert_eq!(
                decode_component(&encode_component(text)).as_deref(),
                Some(text)
            );
        }
        assert_eq!(decode_component("a%2fb").as_deref(), Some("a/b"));
        assert_eq!(decode_component("%"), None);
        assert_eq!(decode_component("%zz"), None);
        assert_eq!(decode_component("%+1"), None);
        assert_eq!(decode_component("%FF"), None);
    }
}
