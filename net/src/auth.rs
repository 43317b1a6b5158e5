//! Bearer-token authorization (`--auth required`, `--auth-tokens FILE`).
//!
//! The token file has one grant per line, `#` comments and blank lines ignored:
//!
//! ```text
//! # token                        stream-name prefix   permissions (read, append, admin)
//! s3cr3t-reader                  /logs/               read
//! s3cr3t-writer                  /                    read,append
//! s3cr3t-operator                /                    read,append,admin
//! ```
//!
//! A request needs `Authorization: Bearer <token>`: missing or unknown → `401` with
//! `WWW-Authenticate: Bearer`; known but not granted this operation on this stream → `403`.
//! Tokens are compared in constant time and never logged. The table is reloaded on SIGHUP:
//! the signal thread publishes a new table and bumps a generation counter; each core swaps its
//! own copy when it sees the counter move, so a request takes no lock.

use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// What a request wants to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Permission {
    /// GET, HEAD, listings.
    Read,
    /// PUT, POST (appends, close, trim), DELETE.
    Append,
    /// The admin API and metrics.
    Admin,
}

impl Permission {
    /// What a stream request's method needs (both protocols); `None` for a CORS preflight,
    /// which needs no token.
    pub fn for_method(method: &str) -> Option<Permission> {
        match method {
            "OPTIONS" => None,
            "GET" | "HEAD" => Some(Permission::Read),
            _ => Some(Permission::Append),
        }
    }

    fn bit(self) -> u8 {
        match self {
            Permission::Read => 1,
            Permission::Append => 2,
            Permission::Admin => 4,
        }
    }
}

#[derive(Clone, Debug)]
struct Grant {
    token: Vec<u8>,
    prefix: String,
    permissions: u8,
}

/// The parsed token file.
#[derive(Clone, Debug, Default)]
pub struct TokenTable {
    grants: Vec<Grant>,
}

/// Why a request is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Denied {
    /// No bearer token, or one the table does not know: `401`.
    Unauthenticated,
    /// A known token without this permission on this name: `403`.
    Forbidden,
}

/// What is wrong with one line of a token file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LineProblem {
    /// Not three fields.
    Fields,
    /// A permission other than `read`, `append`, `admin`.
    Permission(String),
    /// A token with a character other than visible ASCII.
    Token,
    /// A prefix that does not start with `/`.
    Prefix,
}

/// A token file line that is not a grant (`line` counts from 1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenLineError {
    pub line: usize,
    pub problem: LineProblem,
}

impl std::fmt::Display for TokenLineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: ", self.line)?;
        match &self.problem {
            LineProblem::Fields => f.write_str("expected `token prefix permissions`"),
            LineProblem::Permission(other) => write!(
                f,
                "unknown permission {other:?} (expected read, append, admin)"
            ),
            LineProblem::Token => {
                f.write_str("the token holds a character other than visible ASCII")
            }
            LineProblem::Prefix => f.write_str("the prefix must start with /"),
        }
    }
}

impl std::error::Error for TokenLineError {}

/// Why `--auth-tokens` could not be loaded.
#[derive(Debug)]
pub enum TokenFileError {
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    Invalid {
        path: PathBuf,
        source: TokenLineError,
    },
}

impl std::fmt::Display for TokenFileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenFileError::Read { path, source } => {
                write!(f, "cannot read --auth-tokens {}: {source}", path.display())
            }
            TokenFileError::Invalid { path, source } => {
                write!(f, "--auth-tokens {}: {source}", path.display())
            }
        }
    }
}

impl std::error::Error for TokenFileError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TokenFileError::Read { source, .. } => Some(source),
            TokenFileError::Invalid { source, .. } => Some(source),
        }
    }
}

impl TokenTable {
    /// Parses the token file format (module docs); errors name the line.
    pub fn parse(text: &str) -> Result<TokenTable, TokenLineError> {
        let mut grants = Vec::new();
        // Editors that save "UTF-8 with BOM" put U+FEFF before the first token.
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        for (number, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let refused = |problem| TokenLineError {
                line: number + 1,
                problem,
            };
            let [token, prefix, permissions] = fields[..] else {
                return Err(refused(LineProblem::Fields));
            };
            let mut bits = 0;
            for permission in permissions.split(',') {
                bits |= match permission.trim() {
                    "read" => Permission::Read.bit(),
                    "append" => Permission::Append.bit(),
                    "admin" => Permission::Admin.bit(),
                    other => return Err(refused(LineProblem::Permission(other.to_string()))),
                };
            }
            // A bearer token is visible ASCII (RFC 6750); anything else could never match
            // what a client sends, and would fail every request silently.
            if !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(refused(LineProblem::Token));
            }
            if !prefix.starts_with('/') {
                return Err(refused(LineProblem::Prefix));
            }
            grants.push(Grant {
                token: token.as_bytes().to_vec(),
                prefix: prefix.to_string(),
                permissions: bits,
            });
        }
        Ok(TokenTable { grants })
    }

    pub fn load(path: &Path) -> Result<TokenTable, TokenFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokenFileError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        TokenTable::parse(&text).map_err(|source| TokenFileError::Invalid {
            path: path.to_path_buf(),
            source,
        })
    }

    pub fn len(&self) -> usize {
        self.grants.len()
    }

    /// Decides a request for `permission` on `name` (a stream name or listing prefix).
    pub fn check(
        &self,
        token: Option<&[u8]>,
        permission: Permission,
        name: &str,
    ) -> Result<(), Denied> {
        let token = token.ok_or(Denied::Unauthenticated)?;
        let mut known = false;
        let mut allowed = false;
        // Every grant is compared, in constant time each, so the answer's timing says nothing
        // about which token (or how much of one) matched.
        for grant in &self.grants {
            let matches = constant_time_eq(&grant.token, token);
            known |= matches;
            allowed |= matches
                && grant.permissions & permission.bit() != 0
                && name.starts_with(&grant.prefix);
        }
        match (known, allowed) {
            (_, true) => Ok(()),
            (true, false) => Err(Denied::Forbidden),
            (false, false) => Err(Denied::Unauthenticated),
        }
    }
}

impl TokenTable {
    /// The shortest prefix of `token`'s grants of `permission` that covers `name`: the scope a
    /// request it allows counts against (per-tenant limits). `None` when none covers it.
    pub fn scope(&self, token: &[u8], permission: Permission, name: &str) -> Option<&str> {
        self.grants
            .iter()
            .filter(|grant| {
                constant_time_eq(&grant.token, token)
                    && grant.permissions & permission.bit() != 0
                    && name.starts_with(&grant.prefix)
            })
            .map(|grant| grant.prefix.as_str())
            .min_by_key(|prefix| prefix.len())
    }
}

/// Equal-length comparison that does not stop at the first difference.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The `Authorization: Bearer <token>` value, if any.
pub fn bearer(header: Option<&str>) -> Option<&[u8]> {
    let value = header?.trim();
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().as_bytes())
        .filter(|t| !t.is_empty())
}

/// Token tables this process loaded again (SIGHUP). A live response started before a reload
/// ends at its next read (`live::LiveCursor`): its client reconnects and is checked against
/// the new table, so a revoked token stops getting records within one keep-alive round.
static TABLE_RELOADS: AtomicU64 = AtomicU64::new(0);

/// How many times a token table was reloaded in this process.
pub fn table_reloads() -> u64 {
    TABLE_RELOADS.load(Ordering::Acquire)
}

/// The table shared by all cores, replaced on SIGHUP.
pub struct SharedTokens {
    path: PathBuf,
    table: Mutex<Arc<TokenTable>>,
    generation: AtomicU64,
}

impl SharedTokens {
    pub fn load(path: &Path) -> Result<Arc<SharedTokens>, TokenFileError> {
        let table = TokenTable::load(path)?;
        Ok(Arc::new(SharedTokens {
            path: path.to_path_buf(),
            table: Mutex::new(Arc::new(table)),
            generation: AtomicU64::new(0),
        }))
    }

    /// Re-reads the file; a bad file keeps the previous table (and says why).
    pub fn reload(&self) -> Result<usize, TokenFileError> {
        let table = TokenTable::load(&self.path)?;
        let count = table.len();
        *self.table.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(table);
        self.generation.fetch_add(1, Ordering::Release);
        TABLE_RELOADS.fetch_add(1, Ordering::Release);
        Ok(count)
    }

    /// Grants in the table now.
    pub fn current_len(&self) -> usize {
        self.current().len()
    }

    fn current(&self) -> Arc<TokenTable> {
        self.table.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// A core's view of the table: one atomic load per request, a lock only after a reload.
pub struct CoreTokens {
    shared: Arc<SharedTokens>,
    seen: Cell<u64>,
    table: RefCell<Arc<TokenTable>>,
}

impl CoreTokens {
    pub fn new(shared: Arc<SharedTokens>) -> Rc<CoreTokens> {
        let table = shared.current();
        let seen = shared.generation.load(Ordering::Acquire);
        Rc::new(CoreTokens {
            shared,
            seen: Cell::new(seen),
            table: RefCell::new(table),
        })
    }

    pub fn check(
        &self,
        token: Option<&[u8]>,
        permission: Permission,
        name: &str,
    ) -> Result<(), Denied> {
        let generation = self.shared.generation.load(Ordering::Acquire);
        if generation != self.seen.get() {
            *self.table.borrow_mut() = self.shared.current();
            self.seen.set(generation);
        }
        self.table.borrow().check(token, permission, name)
    }

    /// [`TokenTable::scope`] of the table as of the last [`CoreTokens::check`].
    pub fn scope(&self, token: &[u8], permission: Permission, name: &str) -> Option<String> {
        self.table
            .borrow()
            .scope(token, permission, name)
            .map(str::to_string)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_matrix() {
        let table = TokenTable::parse(
            "# comment\nreader /logs/ read\nwriter / read,append\n\nop / read,append,admin # all\n",
        )
        .unwrap();
        assert_eq!(table.len(), 3);
        let check = |token: Option<&str>, permission, name| {
            table.check(token.map(str::as_bytes), permission, name)
        };
        assert_eq!(
            check(None, Permission::Read, "/logs/a"),
            Err(Denied::Unauthenticated)
        );
        assert_eq!(
            check(Some("nope"), Permission::Read, "/logs/a"),
            Err(Denied::Unauthenticated)
        );
        assert_eq!(check(Some("reader"), Permission::Read, "/logs/a"), Ok(()));
        assert_eq!(
            check(Some("reader"), Permission::Read, "/other"),
            Err(Denied::Forbidden)
        );
        assert_eq!(
            check(Some("reader"), Permission::Append, "/logs/a"),
            Err(Denied::Forbidden)
        );
        assert_eq!(check(Some("writer"), Permission::Append, "/x"), Ok(()));
        assert_eq!(
            check(Some("writer"), Permission::Admin, "/x"),
            Err(Denied::Forbidden)
        );
        assert_eq!(check(Some("op"), Permission::Admin, "/"), Ok(()));
        assert_eq!(
            check(Some("reade"), Permission::Read, "/logs/a"),
            Err(Denied::Unauthenticated)
        );
    }

    #[test]
    fn bad_files_name_the_line() {
        assert!(TokenTable::parse("t /\n")
            .unwrap_err()
            .to_string()
            .contains("line 1"));
        let unknown = TokenTable::parse("t / read\nu / write\n").unwrap_err();
        assert_eq!(
            unknown.problem,
            LineProblem::Permission("write".into()),
            "{unknown}"
        );
        assert!(unknown.to_string().contains("line 2"));
        assert!(TokenTable::parse("t logs read\n")
            .unwrap_err()
            .to_string()
            .contains("must start with /"));
    }

    proptest::proptest! {
        #![proptest_config(crate::fuzzing::config())]
        #[test]
        fn fuzz_tokens(file in crate::fuzzing::inputs("tokens")) {
            let _ = TokenTable::parse(&String::from_utf8_lossy(&file));
        }
    }

    #[test]
    fn bearer_header() {
        assert_eq!(bearer(Some("Bearer abc")), Some(&b"abc"[..]));
        assert_eq!(bearer(Some("bearer  abc ")), Some(&b"abc"[..]));
        assert_eq!(bearer(Some("Basic abc")), None);
        assert_eq!(bearer(Some("Bearer ")), None);
        assert_eq!(bearer(None), None);
    }
}
