//! Object keys: which strings may name an object, and which may be a list prefix.
//!
//! Keys are `/`-separated, like S3's. On a `file://` bucket a key becomes a path below the root,
//! so anything that could leave the root (`..`, a leading `/`) or alias another key (`.`, empty
//! components, a trailing `/`) is refused up front, identically on every backend, so code tested
//! against `mem://` behaves the same on `file://` and `s3://`.

use crate::limits::KEY_MAX_BYTES;
use crate::StoreError;

/// File names starting with this are in-progress writes of the file backend, never objects; a
/// key may not contain a component with this prefix, so the two can never collide.
pub(crate) const TEMP_PREFIX: &str = ".pico-tmp.";

/// Checks an object key. The error is [`StoreError::BadUri`] (a caller bug, not a backend fault:
/// an upload loop must not retry it).
pub(crate) fn validate_key(key: &str) -> Result<(), StoreError> {
    if key.is_empty() {
        return Err(bad_key(key, "it is empty"));
    }
    if key.ends_with('/') {
        return Err(bad_key(key, "it ends with '/'"));
    }
    validate_components(key)
}

/// Checks a `list` prefix: like a key, except that it may be empty or end with `/`.
pub(crate) fn validate_prefix(prefix: &str) -> Result<(), StoreError> {
    if prefix.is_empty() {
        return Ok(());
    }
    validate_components(prefix.strip_suffix('/').unwrap_or(prefix))
}

fn validate_components(key: &str) -> Result<(), StoreError> {
    if key.len() > KEY_MAX_BYTES {
        return Err(bad_key(
            key,
            &format!("it is longer than {KEY_MAX_BYTES} bytes"),
        ));
    }
    if key.starts_with('/') {
        return Err(bad_key(key, "it starts with '/'"));
    }
    if key.contains('\0') {
        return Err(bad_key(key, "it contains a NUL byte"));
    }
    for component in key.split('/') {
        match component {
            "" => return Err(bad_key(key, "it has an empty component ('//')")),
            "." | ".." => return Err(bad_key(key, &format!("it has a '{component}' component"))),
            _ if component.starts_with(TEMP_PREFIX) => {
                return Err(bad_key(
                    key,
                    &format!("'{TEMP_PREFIX}' is reserved for temporary files"),
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

fn bad_key(key: &str, why: &str) -> StoreError {
    StoreError::BadUri(format!(
        "invalid object key \"{key}\": {why}; keys are '/'-separated names like segments/0001.seg"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_keys() {
        for key in [
            "a",
            "segments/0001.seg",
            "wal/node-1/00000001",
            ".hidden",
            "a..b/c.",
            "x/.y",
        ] {
            validate_key(key).unwrap();
        }
        for prefix in ["", "segments/", "segments/00", "a/b"] {
            validate_prefix(prefix).unwrap();
        }
    }

    #[test]
    fn bad_keys() {
        let long = "k".repeat(KEY_MAX_BYTES + 1);
        for key in [
            "",
            "/abs",
            "a/",
            "a//b",
            "../x",
            "a/../b",
            "a/..",
            "./a",
            "a/./b",
            "a\0b",
            ".pico-tmp.x",
            &long,
        ] {
            assert!(
                matches!(validate_key(key), Err(StoreError::BadUri(_))),
                "{key:?} accepted"
            );
        }
        for prefix in ["/", "/a", "..", "../", "a//", "a/../"] {
            assert!(
                matches!(validate_prefix(prefix), Err(StoreError::BadUri(_))),
                "{prefix:?} accepted"
            );
        }
    }
}
