//! Subscription patterns over stream paths relative to the DS root: `*` is exactly one path
//! segment, `**` zero or more segments, any other segment a literal (`%2A` in a literal stands
//! for a `*` that is part of the name).

use crate::limits::PATTERN_SEGMENTS_MAX;

fn segments(path: &str) -> impl Iterator<Item = &str> {
    path.split('/').filter(|s| !s.is_empty())
}

/// Whether `path` (relative to the root) matches `pattern`.
pub fn matches(pattern: &str, path: &str) -> bool {
    let pattern: Vec<&str> = segments(pattern).collect();
    let path: Vec<&str> = segments(path).collect();
    // ok[j] = pattern[i..] matches path[j..], computed from the last pattern segment back:
    // a table instead of backtracking so several `**` cannot make it exponential.
    let mut ok = vec![false; path.len() + 1];
    ok[path.len()] = true;
    for seg in pattern.iter().rev() {
        let mut next = vec![false; path.len() + 1];
        for j in (0..=path.len()).rev() {
            next[j] = match *seg {
                "**" => ok[j] || (j < path.len() && next[j + 1]),
                "*" => j < path.len() && ok[j + 1],
                literal => j < path.len() && ok[j + 1] && literal_eq(literal, path[j]),
            };
        }
        ok = next;
    }
    ok[0]
}

fn literal_eq(literal: &str, segment: &str) -> bool {
    if literal.contains('%') {
        literal.replace("%2A", "*").replace("%2a", "*") == segment
    } else {
        literal == segment
    }
}

/// Why a subscription pattern is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PatternError {
    Empty,
    /// More than [`PATTERN_SEGMENTS_MAX`] segments.
    TooManySegments,
    /// A segment with `*` that is not `*` or `**` (the segment).
    PartialWildcard(String),
}

impl std::fmt::Display for PatternError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PatternError::Empty => f.write_str("pattern must not be empty"),
            PatternError::TooManySegments => {
                write!(f, "pattern has more than {PATTERN_SEGMENTS_MAX} segments")
            }
            PatternError::PartialWildcard(seg) => write!(
                f,
                "pattern segment {seg:?}: `*` and `**` must be whole segments"
            ),
        }
    }
}

impl std::error::Error for PatternError {}

/// Checks a normalized pattern: wildcards must be whole segments (`ev*` is refused rather than
/// silently treated as a literal).
pub fn validate(pattern: &str) -> Result<(), PatternError> {
    let count = segments(pattern).count();
    if count == 0 {
        return Err(PatternError::Empty);
    }
    if count > PATTERN_SEGMENTS_MAX {
        return Err(PatternError::TooManySegments);
    }
    if let Some(seg) = segments(pattern).find(|s| s.contains('*') && *s != "*" && *s != "**") {
        return Err(PatternError::PartialWildcard(seg.to_string()));
    }
    Ok(())
}

/// The name prefix every match starts with (the literal segments before the first wildcard), so
/// a creation scans only the streams that can match.
pub fn literal_prefix(pattern: &str) -> String {
    let all: Vec<&str> = segments(pattern).collect();
    let literal = all
        .iter()
        .take_while(|s| **s != "*" && **s != "**" && !s.contains('%'))
        .count();
    let mut prefix = all[..literal].join("/");
    if literal < all.len() && literal > 0 {
        prefix.push('/');
    }
    prefix
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_star_is_one_segment() {
        assert!(matches("events/*", "events/x"));
        assert!(!matches("events/*", "events"));
        assert!(!matches("events/*", "events/x/y"));
        assert!(!matches("events/*", "other/x"));
        assert!(matches("*/b", "a/b"));
    }

    #[test]
    fn double_star_is_any_number_of_segments() {
        assert!(matches("events/**", "events"));
        assert!(matches("events/**", "events/a/b/c"));
        assert!(matches("**/c", "c"));
        assert!(matches("**/c", "a/b/c"));
        assert!(!matches("**/c", "a/b/d"));
        assert!(matches("a/**/b/**/c", "a/x/b/y/z/c"));
        assert!(!matches("a/**/b/**/c", "a/x/y/z/c"));
        // Many `**` against a long path stays fast and correct.
        let long = vec!["s"; 200].join("/");
        assert!(!matches("**/**/**/**/**/**/**/**/x", &long));
    }

    #[test]
    fn literals_and_escapes() {
        assert!(matches("a/b", "a/b"));
        assert!(matches("/a/b/", "a/b"));
        assert!(!matches("a/b", "a/bc"));
        assert!(matches("a/%2A", "a/*"));
        assert!(!matches("a/%2A", "a/x"));
    }

    #[test]
    fn validation() {
        assert!(validate("events/*").is_ok());
        assert!(validate("**").is_ok());
        assert_eq!(
            validate("ev*"),
            Err(PatternError::PartialWildcard("ev*".into()))
        );
        assert_eq!(validate(""), Err(PatternError::Empty));
        assert_eq!(
            validate(&vec!["a"; PATTERN_SEGMENTS_MAX + 1].join("/")),
            Err(PatternError::TooManySegments)
        );
    }

    #[test]
    fn prefixes() {
        assert_eq!(literal_prefix("events/*"), "events/");
        assert_eq!(literal_prefix("a/b/**/c"), "a/b/");
        assert_eq!(literal_prefix("**"), "");
        assert_eq!(literal_prefix("a/b"), "a/b");
        assert_eq!(literal_prefix("a/%2A/*"), "a/");
    }
}
