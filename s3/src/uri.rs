//! `--storage` / `--wal` URI parsing: `<bucket id>@<scheme>://<path>[?k=v&k2=v2]`.
//!
//! Split by hand rather than with `url`: a bucket id before the scheme is no URL, and `url` reads
//! `file://./objects` as host `.` with path `/objects` (and `file://objects` as host `objects`),
//! where the text after `file://` must be the directory verbatim. The `s3` query is not
//! `form_urlencoded` either: that decodes `+` to a space and `%XX`, so a value such as
//! `endpoint=http://u:p%40ss@host` would no longer be what was written and what `Display` prints
//! back. (The `endpoint` value itself is checked with `url`, in `s3_bucket/config.rs`.)

use std::path::PathBuf;

use crate::StorageLocation;
use crate::StorageUri;
use crate::StoreError;

/// The accepted syntax, repeated in every parse error so the operator sees the fix.
const EXPECTED: &str = "expected <bucket id>@file://DIR, \
     <bucket id>@s3://BUCKET?region=…&endpoint=…&pathStyle=true or <bucket id>@mem://NAME \
     (bucket id: a signed 16-bit integer), e.g. -2@file://./objects";

fn bad_uri(uri: &str, why: &str) -> StoreError {
    StoreError::BadUri(format!("invalid storage URI \"{uri}\": {why}; {EXPECTED}"))
}

impl StorageUri {
    /// Parses a bucket URI.
    ///
    /// The bucket id is everything before the **first** `@` (an `s3` endpoint may itself contain
    /// `@`). `file://./objects` is the relative directory `./objects` and `file:///srv/objects`
    /// the absolute `/srv/objects`: the text after `file://` is the path, verbatim. A query on a
    /// `file://` URI (WAL tuning parameters, in other setups) has no meaning for a directory and is
    /// dropped with a warning. `s3` parameters are kept in order, unvalidated: the S3 backend
    /// decides which it understands.
    pub fn parse(uri: &str) -> Result<StorageUri, StoreError> {
        let Some((id, rest)) = uri.split_once('@') else {
            return Err(bad_uri(uri, "missing the bucket id before '@'"));
        };
        let bucket_id: i16 = id.parse().map_err(|_| {
            bad_uri(
                uri,
                &format!("bucket id \"{id}\" is not a signed 16-bit integer"),
            )
        })?;
        let Some((scheme, path)) = rest.split_once("://") else {
            return Err(bad_uri(uri, "missing <scheme>:// after '@'"));
        };
        let location = match scheme {
            "file" => parse_file(uri, path)?,
            "s3" => parse_s3(uri, path)?,
            "mem" => StorageLocation::Memory(path.to_string()),
            other => return Err(bad_uri(uri, &format!("unsupported scheme \"{other}\""))),
        };
        Ok(StorageUri {
            bucket_id,
            location,
        })
    }
}

fn parse_file(uri: &str, path: &str) -> Result<StorageLocation, StoreError> {
    let (path, query) = match path.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (path, None),
    };
    if path.is_empty() {
        return Err(bad_uri(uri, "the file:// directory is empty"));
    }
    if let Some(query) = query {
        log::warn!("storage URI {uri}: parameters \"{query}\" have no effect on a file:// bucket");
    }
    Ok(StorageLocation::File(PathBuf::from(path)))
}

fn parse_s3(uri: &str, path: &str) -> Result<StorageLocation, StoreError> {
    let (bucket, query) = path.split_once('?').unwrap_or((path, ""));
    // `s3://bucket/` is a common way of writing `s3://bucket`.
    let bucket = bucket.strip_suffix('/').unwrap_or(bucket);
    if bucket.is_empty() {
        return Err(bad_uri(uri, "the s3:// bucket name is empty"));
    }
    if bucket.contains('/') {
        return Err(bad_uri(
            uri,
            &format!("\"{bucket}\" is not a bucket name (key prefixes are not supported)"),
        ));
    }
    let mut params = Vec::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key.is_empty() {
            return Err(bad_uri(uri, &format!("parameter \"{pair}\" has no name")));
        }
        params.push((key.to_string(), value.to_string()));
    }
    Ok(StorageLocation::S3 {
        bucket: bucket.to_string(),
        params,
    })
}

/// Prints the URI in the syntax [`StorageUri::parse`] reads back.
impl std::fmt::Display for StorageUri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@", self.bucket_id)?;
        match &self.location {
            StorageLocation::File(path) => write!(f, "file://{}", path.display()),
            StorageLocation::S3 { bucket, params } => {
                write!(f, "s3://{bucket}")?;
                for (index, (key, value)) in params.iter().enumerate() {
                    let separator = if index == 0 { '?' } else { '&' };
                    write!(f, "{separator}{key}={value}")?;
                }
                Ok(())
            }
            StorageLocation::Memory(name) => write!(f, "mem://{name}"),
        }
    }
}

impl std::str::FromStr for StorageUri {
    type Err = StoreError;

    fn from_str(uri: &str) -> Result<StorageUri, StoreError> {
        StorageUri::parse(uri)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(id: i16, path: &str) -> StorageUri {
        StorageUri {
            bucket_id: id,
            location: StorageLocation::File(PathBuf::from(path)),
        }
    }

    #[test]
    fn file_uris() {
        assert_eq!(
            StorageUri::parse("-2@file://./objects").unwrap(),
            file(-2, "./objects")
        );
        assert_eq!(
            StorageUri::parse("-3@file:///srv/objects").unwrap(),
            file(-3, "/srv/objects")
        );
        assert_eq!(
            StorageUri::parse("0@file://objects").unwrap(),
            file(0, "objects")
        );
        assert_eq!(
            StorageUri::parse("32767@file://x").unwrap(),
            file(i16::MAX, "x")
        );
        assert_eq!(
            StorageUri::parse("-32768@file://x").unwrap(),
            file(i16::MIN, "x")
        );
        assert_eq!(
            StorageUri::parse("-3@file://./objects?batchInterval=5").unwrap(),
            file(-3, "./objects")
        );
    }

    #[test]
    fn s3_uris() {
        let uri = StorageUri::parse(
            "-3@s3://picomq?region=us-east-1&endpoint=http://127.0.0.1:3900&pathStyle=true",
        )
        .unwrap();
        let params = [
            ("region", "us-east-1"),
            ("endpoint", "http://127.0.0.1:3900"),
            ("pathStyle", "true"),
        ];
        let expected = StorageLocation::S3 {
            bucket: "picomq".into(),
            params: params
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        assert_eq!(
            uri,
            StorageUri {
                bucket_id: -3,
                location: expected
            }
        );

        let plain = StorageUri::parse("-2@s3://bucket/").unwrap();
        assert_eq!(
            plain.location,
            StorageLocation::S3 {
                bucket: "bucket".into(),
                params: vec![]
            }
        );
        // An endpoint with credentials in it: the id is split at the first '@' only.
        let creds = StorageUri::parse("1@s3://b?endpoint=http://u:p@host:9000&flag").unwrap();
        let expected = vec![
            ("endpoint".to_string(), "http://u:p@host:9000".to_string()),
            ("flag".into(), "".into()),
        ];
        assert_eq!(
            creds.location,
            StorageLocation::S3 {
                bucket: "b".into(),
                params: expected
            }
        );
        // Values are verbatim: no `+` to space, no %-decoding.
        let verbatim = StorageUri::parse("1@s3://b?endpoint=http://u:p%40ss@h&x=a+b").unwrap();
        let expected = vec![
            ("endpoint".to_string(), "http://u:p%40ss@h".to_string()),
            ("x".into(), "a+b".into()),
        ];
        assert_eq!(
            verbatim.location,
            StorageLocation::S3 {
                bucket: "b".into(),
                params: expected
            }
        );
        assert_eq!(
            verbatim.to_string(),
            "1@s3://b?endpoint=http://u:p%40ss@h&x=a+b"
        );
    }

    #[test]
    fn memory_uris() {
        let uri = StorageUri::parse("7@mem://test-bucket").unwrap();
        assert_eq!(
            uri,
            StorageUri {
                bucket_id: 7,
                location: StorageLocation::Memory("test-bucket".into())
            }
        );
    }

    #[test]
    fn display_round_trips() {
        for text in [
            "-2@file://./objects",
            "-3@file:///srv/objects",
            "-3@s3://picomq?region=us-east-1&endpoint=http://127.0.0.1:3900&pathStyle=true",
            "5@s3://bucket",
            "7@mem://x",
        ] {
            let uri = StorageUri::parse(text).unwrap();
            assert_eq!(uri.to_string(), text);
            assert_eq!(StorageUri::parse(&uri.to_string()).unwrap(), uri);
        }
    }

    #[test]
    fn bad_uris_say_what_is_expected() {
        let cases = [
            ("file://./objects", "missing the bucket id"),
            ("./objects", "missing the bucket id"),
            (
                "x@file://./objects",
                "bucket id \"x\" is not a signed 16-bit integer",
            ),
            ("32768@file://./objects", "is not a signed 16-bit integer"),
            ("@file://./objects", "bucket id \"\""),
            ("-2@./objects", "missing <scheme>://"),
            ("-2@gs://bucket", "unsupported scheme \"gs\""),
            ("-2@file://", "directory is empty"),
            ("-2@s3://", "bucket name is empty"),
            ("-2@s3://?region=x", "bucket name is empty"),
            ("-2@s3://b/prefix", "not a bucket name"),
            ("-2@s3://b?=v", "has no name"),
        ];
        for (uri, why) in cases {
            match StorageUri::parse(uri) {
                Err(StoreError::BadUri(message)) => {
                    assert!(message.contains(why), "{uri}: {message}");
                    assert!(message.contains("-2@file://./objects"), "{uri}: {message}");
                    assert!(message.contains(uri), "{uri}: {message}");
                }
                other => panic!("{uri} parsed as {other:?}"),
            }
        }
    }
}
