//! AWS Signature Version 4, header-based (the `Authorization` header), hand-written on `ring`.
//!
//! Pure functions, no I/O and no clock: the caller passes the time. Tested against the AWS SigV4
//! test suite and the worked S3 examples of the AWS documentation.

use std::fmt::Write as _;

use percent_encoding::utf8_percent_encode;
use percent_encoding::AsciiSet;
use percent_encoding::NON_ALPHANUMERIC;
use ring::digest;
use ring::hmac;
use time::OffsetDateTime;
use time::PrimitiveDateTime;

/// `x-amz-content-sha256` of a request whose body is not hashed (reads).
pub(crate) const UNSIGNED_PAYLOAD: &str = "UNSIGNED-PAYLOAD";

const ALGORITHM: &str = "AWS4-HMAC-SHA256";

/// An access key. `Debug` never prints the secret or the token.
#[derive(Clone, PartialEq, Eq)]
pub struct S3Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    /// Temporary credentials (STS) also carry a session token, sent as `x-amz-security-token`.
    pub session_token: Option<String>,
}

impl std::fmt::Debug for S3Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .field(
                "session_token",
                &self.session_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// Lowercase hex of SHA-256.
pub(crate) fn sha256_hex(data: &[u8]) -> String {
    hex(digest::digest(&digest::SHA256, data).as_ref())
}

fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        let _ = write!(out, "{byte:02x}");
    }
    out
}

/// SigV4's `UriEncode` of a query name or value: every byte but the RFC 3986 unreserved
/// characters (`A-Z a-z 0-9 - . _ ~`) becomes `%XX` (uppercase); bytes of non-ASCII characters
/// always do.
const URI_ENCODE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');
/// The same for an object key path, whose `/` separators stay.
const URI_ENCODE_PATH: &AsciiSet = &URI_ENCODE.remove(b'/');

/// SigV4 URI encoding of `text`: `/` stays when `encode_slash` is false (object key paths), and
/// becomes `%2F` otherwise (query names and values).
pub(crate) fn uri_encode(text: &str, encode_slash: bool) -> String {
    let set = if encode_slash {
        URI_ENCODE
    } else {
        URI_ENCODE_PATH
    };
    utf8_percent_encode(text, set).to_string()
}

/// The canonical query string: names and values encoded, pairs sorted by name then value. It is
/// also what goes on the wire, so the signed and the sent query cannot differ.
pub(crate) fn canonical_query(query: &[(String, String)]) -> String {
    let mut pairs: Vec<(String, String)> = query
        .iter()
        .map(|(name, value)| (uri_encode(name, true), uri_encode(value, true)))
        .collect();
    pairs.sort();
    let mut out = String::new();
    for (index, (name, value)) in pairs.iter().enumerate() {
        if index > 0 {
            out.push('&');
        }
        out.push_str(name);
        out.push('=');
        out.push_str(value);
    }
    out
}

/// `20130524T000000Z` for a Unix time in seconds (UTC). A time past the year 9999 (out of
/// `time`'s range, and of SigV4's four-digit year) prints as that year's last second.
pub(crate) fn amz_date(unix_seconds: u64) -> String {
    let at = i64::try_from(unix_seconds)
        .ok()
        .and_then(|seconds| OffsetDateTime::from_unix_timestamp(seconds).ok())
        .unwrap_or_else(|| PrimitiveDateTime::MAX.assume_utc());
    format!(
        "{:04}{:02}{:02}T{:02}{:02}{:02}Z",
        at.year(),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second()
    )
}

/// One request, as far as signing is concerned.
pub(crate) struct SigningRequest<'a> {
    pub method: &'a str,
    /// The path exactly as sent, already encoded (see [`uri_encode`]).
    pub path: &'a str,
    /// Unencoded query pairs, in any order.
    pub query: &'a [(String, String)],
    /// Every header to sign (name in any case), `host` and `x-amz-date` included.
    pub headers: &'a [(String, String)],
    /// Hex SHA-256 of the body, or [`UNSIGNED_PAYLOAD`].
    pub payload_hash: &'a str,
}

/// Where and when a request is signed.
pub(crate) struct Scope<'a> {
    /// `YYYYMMDDTHHMMSSZ`, the same value as the `x-amz-date` header.
    pub amz_date: &'a str,
    pub region: &'a str,
    pub service: &'a str,
}

impl Scope<'_> {
    fn credential_scope(&self) -> String {
        format!(
            "{}/{}/{}/aws4_request",
            &self.amz_date[..8],
            self.region,
            self.service
        )
    }
}

/// Header names lowercased, values trimmed with inner runs of spaces collapsed, sorted by name;
/// repeated names joined with `,`. Returns (canonical headers block, signed header list).
fn canonical_headers(headers: &[(String, String)]) -> (String, String) {
    let mut normalized: Vec<(String, String)> = headers
        .iter()
        .map(|(name, value)| {
            let value = value.split_whitespace().collect::<Vec<_>>().join(" ");
            (name.to_ascii_lowercase(), value)
        })
        .collect();
    normalized.sort_by(|a, b| a.0.cmp(&b.0));
    let mut block = String::new();
    let mut names: Vec<&str> = Vec::new();
    for (name, value) in &normalized {
        if names.last() == Some(&name.as_str()) {
            // Same name as the previous line: append the value to it.
            block.pop();
            block.push(',');
        } else {
            names.push(name);
            block.push_str(name);
            block.push(':');
        }
        block.push_str(value);
        block.push('\n');
    }
    (block, names.join(";"))
}

pub(crate) fn canonical_request(request: &SigningRequest<'_>) -> (String, String) {
    let (headers, signed) = canonical_headers(request.headers);
    let canonical = format!(
        "{}\n{}\n{}\n{}\n{}\n{}",
        request.method,
        request.path,
        canonical_query(request.query),
        headers,
        signed,
        request.payload_hash
    );
    (canonical, signed)
}

pub(crate) fn string_to_sign(scope: &Scope<'_>, canonical_request: &str) -> String {
    format!(
        "{ALGORITHM}\n{}\n{}\n{}",
        scope.amz_date,
        scope.credential_scope(),
        sha256_hex(canonical_request.as_bytes())
    )
}

fn hmac_sha256(key: &[u8], data: &[u8]) -> hmac::Tag {
    hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), data)
}

/// Hex signature of a string to sign.
pub(crate) fn signature(secret: &str, scope: &Scope<'_>, string_to_sign: &str) -> String {
    let date = hmac_sha256(
        format!("AWS4{secret}").as_bytes(),
        &scope.amz_date.as_bytes()[..8],
    );
    let region = hmac_sha256(date.as_ref(), scope.region.as_bytes());
    let service = hmac_sha256(region.as_ref(), scope.service.as_bytes());
    let signing = hmac_sha256(service.as_ref(), b"aws4_request");
    hex(hmac_sha256(signing.as_ref(), string_to_sign.as_bytes()).as_ref())
}

/// The `Authorization` header value for `request`.
pub(crate) fn authorization(
    credentials: &S3Credentials,
    scope: &Scope<'_>,
    request: &SigningRequest<'_>,
) -> String {
    let (canonical, signed_headers) = canonical_request(request);
    let to_sign = string_to_sign(scope, &canonical);
    let signature = signature(&credentials.secret_access_key, scope, &to_sign);
    format!(
        "{ALGORITHM} Credential={}/{}, SignedHeaders={signed_headers}, Signature={signature}",
        credentials.access_key_id,
        scope.credential_scope()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect()
    }

    /// The AWS SigV4 test suite (`aws-sig-v4-test-suite`): service `service`, us-east-1,
    /// 2015-08-30T12:36:00Z, key AKIDEXAMPLE.
    fn suite(method: &str, path: &str, query: &[(&str, &str)], extra: &[(&str, &str)]) -> String {
        let credentials = S3Credentials {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
            session_token: None,
        };
        let scope = Scope {
            amz_date: "20150830T123600Z",
            region: "us-east-1",
            service: "service",
        };
        let mut headers = pairs(&[
            ("Host", "example.amazonaws.com"),
            ("X-Amz-Date", "20150830T123600Z"),
        ]);
        headers.extend(pairs(extra));
        let query = pairs(query);
        let request = SigningRequest {
            method,
            path,
            query: &query,
            headers: &headers,
            payload_hash: EMPTY_SHA256,
        };
        authorization(&credentials, &scope, &request)
    }

    const SUITE_PREFIX: &str =
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, ";

    #[test]
    fn aws_suite_get_vanilla() {
        assert_eq!(
            suite("GET", "/", &[], &[]),
            format!("{SUITE_PREFIX}SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31")
        );
    }

    #[test]
    fn aws_suite_post_vanilla() {
        assert_eq!(
            suite("POST", "/", &[], &[]),
            format!("{SUITE_PREFIX}SignedHeaders=host;x-amz-date, Signature=5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b")
        );
    }

    #[test]
    fn aws_suite_get_vanilla_query_order_key_case() {
        let query = [("Param2", "value2"), ("Param1", "value1")];
        assert_eq!(
            suite("GET", "/", &query, &[]),
            format!("{SUITE_PREFIX}SignedHeaders=host;x-amz-date, Signature=b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500")
        );
        // The intermediate steps, as published.
        let headers = pairs(&[
            ("Host", "example.amazonaws.com"),
            ("X-Amz-Date", "20150830T123600Z"),
        ]);
        let query = pairs(&query);
        let request = SigningRequest {
            method: "GET",
            path: "/",
            query: &query,
            headers: &headers,
            payload_hash: EMPTY_SHA256,
        };
        let (canonical, _) = canonical_request(&request);
        assert_eq!(
            canonical,
            format!("GET\n/\nParam1=value1&Param2=value2\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\n{EMPTY_SHA256}")
        );
        let scope = Scope {
            amz_date: "20150830T123600Z",
            region: "us-east-1",
            service: "service",
        };
        assert_eq!(
            string_to_sign(&scope, &canonical),
            "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n816cd5b414d056048ba4f7c5386d6e0533120fb1fcfa93762cf0fc39e2cf19e0"
        );
    }

    #[test]
    fn aws_suite_get_vanilla_empty_query_key() {
        assert_eq!(
            suite("GET", "/", &[("Param1", "value1")], &[]),
            format!("{SUITE_PREFIX}SignedHeaders=host;x-amz-date, Signature=a67d582fa61cc504c4bae71f336f98b97f1ea3c7a6bfe1b6e45aec72011b9aeb")
        );
    }

    #[test]
    fn aws_suite_get_header_value_trim() {
        let extra = [("My-Header1", " value1"), ("My-Header2", "\"a   b   c\"")];
        assert_eq!(
            suite("GET", "/", &[], &extra),
            format!("{SUITE_PREFIX}SignedHeaders=host;my-header1;my-header2;x-amz-date, Signature=acc3ed3afb60bb290fc8d2dd0098b9911fcaa05412b367055dee359757a9c736")
        );
    }

    #[test]
    fn aws_suite_post_header_value_case() {
        assert_eq!(
            suite("POST", "/", &[], &[("My-Header1", "VALUE1")]),
            format!("{SUITE_PREFIX}SignedHeaders=host;my-header1;x-amz-date, Signature=cdbc9802e29d2942e5e10b5bccfdd67c5f22c7c4e8ae67b53629efa58b974b7d")
        );
    }

    #[test]
    fn aws_suite_get_unreserved() {
        let path = uri_encode(
            "/-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
            false,
        );
        assert_eq!(
            suite("GET", &path, &[], &[]),
            format!("{SUITE_PREFIX}SignedHeaders=host;x-amz-date, Signature=07ef7494c76fa4850883e2b006601f940f8a34d404d0cfa977f52a65bbf5f24f")
        );
    }

    /// The worked examples of "Authenticating Requests: Using the Authorization Header (AWS
    /// Signature Version 4)" in the S3 API reference: bucket examplebucket, us-east-1,
    /// 2013-05-24T00:00:00Z.
    fn s3_example(
        method: &str,
        path: &str,
        query: &[(&str, &str)],
        headers: &[(&str, &str)],
        payload_hash: &str,
    ) -> String {
        let credentials = S3Credentials {
            access_key_id: "AKIAIOSFODNN7EXAMPLE".into(),
            secret_access_key: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into(),
            session_token: None,
        };
        let scope = Scope {
            amz_date: "20130524T000000Z",
            region: "us-east-1",
            service: "s3",
        };
        let mut all = pairs(&[
            ("Host", "examplebucket.s3.amazonaws.com"),
            ("x-amz-date", "20130524T000000Z"),
            ("x-amz-content-sha256", payload_hash),
        ]);
        all.extend(pairs(headers));
        let query = pairs(query);
        let request = SigningRequest {
            method,
            path,
            query: &query,
            headers: &all,
            payload_hash,
        };
        authorization(&credentials, &scope, &request)
    }

    const S3_PREFIX: &str =
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, ";

    #[test]
    fn s3_example_get_object_range() {
        let authorization = s3_example(
            "GET",
            "/test.txt",
            &[],
            &[("Range", "bytes=0-9")],
            EMPTY_SHA256,
        );
        assert_eq!(
            authorization,
            format!("{S3_PREFIX}SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41")
        );
    }

    #[test]
    fn s3_example_put_object() {
        let payload_hash = sha256_hex(b"Welcome to Amazon S3.");
        assert_eq!(
            payload_hash,
            "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072"
        );
        let authorization = s3_example(
            "PUT",
            &format!("/{}", uri_encode("test$file.text", false)),
            &[],
            &[
                ("Date", "Fri, 24 May 2013 00:00:00 GMT"),
                ("x-amz-storage-class", "REDUCED_REDUNDANCY"),
            ],
            &payload_hash,
        );
        assert_eq!(
            authorization,
            format!("{S3_PREFIX}SignedHeaders=date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class, Signature=98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd")
        );
    }

    #[test]
    fn s3_example_get_bucket_lifecycle() {
        let authorization = s3_example("GET", "/", &[("lifecycle", "")], &[], EMPTY_SHA256);
        assert_eq!(
            authorization,
            format!("{S3_PREFIX}SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature=fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543")
        );
    }

    #[test]
    fn s3_example_list_objects() {
        let authorization = s3_example(
            "GET",
            "/",
            &[("max-keys", "2"), ("prefix", "J")],
            &[],
            EMPTY_SHA256,
        );
        assert_eq!(
            authorization,
            format!("{S3_PREFIX}SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7")
        );
    }

    #[test]
    fn uri_encoding() {
        assert_eq!(
            uri_encode("segments/a b/ü+x.seg", false),
            "segments/a%20b/%C3%BC%2Bx.seg"
        );
        assert_eq!(uri_encode("a/b c~", true), "a%2Fb%20c~");
        assert_eq!(uri_encode("-._~AZaz09", false), "-._~AZaz09");
        assert_eq!(
            uri_encode("$&'()*!=:@,;", false),
            "%24%26%27%28%29%2A%21%3D%3A%40%2C%3B"
        );
        assert_eq!(
            canonical_query(&pairs(&[
                ("prefix", "a/b c"),
                ("list-type", "2"),
                ("uploads", "")
            ])),
            "list-type=2&prefix=a%2Fb%20c&uploads="
        );
    }

    /// Every byte value that UTF-8 can hold, in both slash modes, against the AWS rule written
    /// out byte by byte.
    #[test]
    fn uri_encoding_of_every_byte() {
        let expected = |text: &str, encode_slash: bool| {
            let mut out = String::new();
            for byte in text.bytes() {
                match byte {
                    b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                        out.push(byte as char)
                    }
                    b'/' if !encode_slash => out.push('/'),
                    _ => out.push_str(&format!("%{byte:02X}")),
                }
            }
            out
        };
        // All of U+0000..U+07FF (every one-byte character, every two-byte lead and continuation
        // byte), and a spread of three- and four-byte characters for their lead bytes.
        let chars: Vec<char> = (0..0x800)
            .chain((0x800..0x11_0000).step_by(0x1001))
            .chain([0xD7FF, 0xE000, 0xFFFF, 0x1_0000, 0x10_FFFF])
            .filter_map(char::from_u32)
            .collect();
        let mut seen = [false; 256];
        for c in &chars {
            let text = c.to_string();
            for byte in text.bytes() {
                seen[usize::from(byte)] = true;
            }
            for encode_slash in [false, true] {
                assert_eq!(
                    uri_encode(&text, encode_slash),
                    expected(&text, encode_slash),
                    "{c:?}, encode_slash {encode_slash}"
                );
            }
        }
        // Only the bytes that never occur in UTF-8 went untested.
        let missed: Vec<usize> = (0..256).filter(|&byte| !seen[byte]).collect();
        let never_utf8: Vec<usize> = [0xC0, 0xC1].into_iter().chain(0xF5..=0xFF).collect();
        assert_eq!(missed, never_utf8);
    }

    #[test]
    fn dates() {
        assert_eq!(amz_date(0), "19700101T000000Z");
        assert_eq!(amz_date(1_369_353_600), "20130524T000000Z");
        assert_eq!(amz_date(1_440_938_160), "20150830T123600Z");
        assert_eq!(amz_date(951_782_400), "20000229T000000Z");
        assert_eq!(amz_date(4_102_444_799), "20991231T235959Z");
        assert_eq!(amz_date(1_709_210_096), "20240229T123456Z");
        // 2100 is not a leap year.
        assert_eq!(amz_date(4_107_542_399), "21000228T235959Z");
        assert_eq!(amz_date(4_107_542_400), "21000301T000000Z");
        assert_eq!(amz_date(253_402_300_799), "99991231T235959Z");
        assert_eq!(amz_date(253_402_300_800), "99991231T235959Z");
        assert_eq!(amz_date(u64::MAX), "99991231T235959Z");
    }

    #[test]
    fn credentials_debug_hides_the_secret() {
        let credentials = S3Credentials {
            access_key_id: "AK".into(),
            secret_access_key: "very-secret".into(),
            session_token: Some("token".into()),
        };
        let printed = format!("{credentials:?}");
        assert!(printed.contains("AK"), "{printed}");
        assert!(
            !printed.contains("very-secret") && !printed.contains("token\""),
            "{printed}"
        );
    }
}
