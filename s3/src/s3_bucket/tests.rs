//! Tests of the `s3://` backend that need no server: configuration from the URI and the
//! environment, backoff bounds, which answers are transient.

use std::time::Duration;

use bytes::Bytes;
use reqwest::header::HeaderMap;
use reqwest::StatusCode;

use super::call::{transient, Answer};
use super::{S3Bucket, S3Config, S3Options};
use crate::sigv4::S3Credentials;
use crate::StoreError;

fn params(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect()
}

fn env(items: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
    move |name| {
        items
            .iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| value.to_string())
    }
}

const KEYS: &[(&str, &str)] = &[
    ("AWS_ACCESS_KEY_ID", "AK"),
    ("AWS_SECRET_ACCESS_KEY", "SK"),
    ("AWS_REGION", "eu-west-3"),
];

#[test]
fn config_from_uri_and_environment() {
    let config = S3Config::new(
        "segments",
        &params(&[
            ("region", "garage"),
            ("endpoint", "http://127.0.0.1:3900"),
            ("pathStyle", "true"),
        ]),
        None,
        env(KEYS),
    )
    .unwrap();
    assert_eq!(config.region, "garage");
    assert!(config.path_style);
    assert_eq!(config.credentials.access_key_id, "AK");
    assert_eq!(config.credentials.session_token, None);
    assert_eq!(
        config.url(Some("seg/a b/ü"), "").unwrap().as_str(),
        "http://127.0.0.1:3900/segments/seg/a%20b/%C3%BC"
    );
    assert_eq!(
        config
            .url(None, "list-type=2&prefix=a%2Fb")
            .unwrap()
            .as_str(),
        "http://127.0.0.1:3900/segments?list-type=2&prefix=a%2Fb"
    );

    // Region from the environment, AWS endpoint, virtual-host style.
    let config = S3Config::new("bkt", &[], None, env(KEYS)).unwrap();
    assert_eq!(config.region, "eu-west-3");
    assert!(!config.path_style);
    assert_eq!(
        config.url(Some("k+1"), "").unwrap().as_str(),
        "https://bkt.s3.eu-west-3.amazonaws.com/k%2B1"
    );
    assert_eq!(
        config.url(None, "").unwrap().as_str(),
        "https://bkt.s3.eu-west-3.amazonaws.com/"
    );
    let session: &[(&str, &str)] = &[
        ("AWS_ACCESS_KEY_ID", "AK"),
        ("AWS_SECRET_ACCESS_KEY", "SK"),
        ("AWS_SESSION_TOKEN", "T"),
        ("AWS_DEFAULT_REGION", "ap-south-1"),
    ];
    let config = S3Config::new("b", &[], None, env(session)).unwrap();
    assert_eq!(config.credentials.session_token.as_deref(), Some("T"));
    assert_eq!(config.region, "ap-south-1");
}

#[test]
fn missing_credentials_and_bad_endpoints_are_bad_uris() {
    for (vars, missing) in [
        (&[][..], "AWS_ACCESS_KEY_ID is not set"),
        (
            &[("AWS_ACCESS_KEY_ID", "AK")][..],
            "AWS_SECRET_ACCESS_KEY is not set",
        ),
        (
            &[("AWS_ACCESS_KEY_ID", "AK"), ("AWS_SECRET_ACCESS_KEY", "")][..],
            "AWS_SECRET_ACCESS_KEY is not set",
        ),
    ] {
        let vars: Vec<(&str, &str)> = vars.to_vec();
        let lookup = move |name: &str| {
            vars.iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| value.to_string())
        };
        match S3Config::new("b", &[], None, lookup) {
            Err(StoreError::BadUri(message)) => {
                assert!(message.contains(missing), "{message}");
                assert!(message.contains("no credentials"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }
    for endpoint in ["127.0.0.1:3900", "ftp://x", "http://h:1/path", "nonsense"] {
        match S3Config::new("b", &params(&[("endpoint", endpoint)]), None, env(KEYS)) {
            Err(StoreError::BadUri(message)) => {
                assert!(message.contains("endpoint"), "{message}")
            }
            other => panic!("{endpoint}: {other:?}"),
        }
    }
    assert!(matches!(
        S3Config::new("b", &params(&[("pathStyle", "yes")]), None, env(KEYS)),
        Err(StoreError::BadUri(_))
    ));
    // Explicit credentials win over (missing) environment ones.
    let explicit = S3Credentials {
        access_key_id: "X".into(),
        secret_access_key: "Y".into(),
        session_token: None,
    };
    let config = S3Config::new("b", &[], Some(explicit.clone()), env(&[])).unwrap();
    assert_eq!(config.credentials, explicit);
}

#[test]
fn backoff_is_bounded_and_jittered() {
    let config = S3Config::new("b", &[], None, env(KEYS)).unwrap();
    let bucket = S3Bucket::new(config, S3Options::default()).unwrap();
    for attempt in 1..40 {
        let ceiling = Duration::from_millis(50)
            .saturating_mul(1 << (attempt - 1).min(20))
            .min(Duration::from_secs(5));
        let backoff = bucket.backoff(attempt);
        assert!(backoff <= ceiling, "{attempt}: {backoff:?} > {ceiling:?}");
    }
    let samples: std::collections::HashSet<_> = (0..20).map(|_| bucket.backoff(5)).collect();
    assert!(samples.len() > 10, "not jittered: {samples:?}");
}

#[test]
fn transient_answers() {
    let answer = |status: u16, body: &'static str| Answer {
        status: StatusCode::from_u16(status).unwrap(),
        headers: HeaderMap::new(),
        body: Bytes::from_static(body.as_bytes()),
        truncated: false,
    };
    for status in [500, 502, 503, 504, 429, 408] {
        assert!(transient(&answer(status, ""), false).is_some(), "{status}");
    }
    let slow_down = answer(
        503,
        "<Error><Code>SlowDown</Code><Message>Reduce</Message></Error>",
    );
    assert_eq!(
        transient(&slow_down, false).unwrap(),
        "HTTP 503 Service Unavailable SlowDown Reduce"
    );
    assert!(transient(
        &answer(400, "<Error><Code>RequestTimeout</Code></Error>"),
        false
    )
    .is_some());
    for status in [200, 204, 206, 400, 403, 404, 416] {
        assert!(transient(&answer(status, ""), false).is_none(), "{status}");
    }
    let ok_error = answer(
        200,
        "<?xml version=\"1.0\"?><Error><Code>InternalError</Code></Error>",
    );
    assert!(transient(&ok_error, true).is_some());
    assert!(transient(&ok_error, false).is_none());
}
