//! Percent-encoding as JavaScript's `encodeURIComponent` / `decodeURIComponent` do it: ids
//! and stream paths travel as single path segments.

/// Encodes everything but `A-Z a-z 0-9 - _ . ! ~ * ' ( )`.
pub fn encode_component(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.!~*'()".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Decodes `%XX` escapes; `None` for a malformed escape or bytes that are not UTF-8.
pub fn decode_component(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            out.push(
                u8::from_str_radix(hex, 16)
                    .ok()
                    .filter(|_| hex.bytes().all(|b| b.is_ascii_hexdigit()))?,
            );
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
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
