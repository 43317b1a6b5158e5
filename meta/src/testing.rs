//! Test support, not part of the API: a fresh PostgreSQL database per test, so Postgres tests
//! (this crate's and the end-to-end ones) run in parallel without seeing each other's rows.
//!
//! They are gated by `PICOMQ_PG_URL` ([`pico_testkit::POSTGRES`]), which names a server and a
//! database to connect to as a user that may create databases; the tests are
//! `#[ignore = "needs Postgres: ..."]`, so they run with `--include-ignored` (CI does).

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;

use postgres::NoTls;
use postgres::SimpleQueryMessage;

use crate::MetaUrl;

/// A uniquely named, initially empty database on the server of `$PICOMQ_PG_URL`; dropped (with
/// whatever is still connected to it) when this is dropped.
pub struct PgDatabase {
    /// `$PICOMQ_PG_URL` itself: where databases are created and dropped.
    admin_url: String,
    name: String,
    url: String,
}

impl PgDatabase {
    /// Creates the database, named after `label` (a test's name); `None`, after printing why,
    /// when `$PICOMQ_PG_URL` is unset ([`pico_testkit::require`]: a panic under `CI=true`).
    /// Panics when the server cannot be used: a test that was asked to run against Postgres
    /// must not pass without it.
    pub fn create(label: &str) -> Option<PgDatabase> {
        let admin_url = pico_testkit::require(label, &pico_testkit::POSTGRES)?.remove(0);
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let label: String = label
            .chars()
            .map(|c| c.to_ascii_lowercase())
            .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
            .take(32)
            .collect();
        let name = format!(
            "picomq_t_{label}_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        run(&admin_url, &format!("CREATE DATABASE {name}"));
        let url = with_database(&admin_url, &name);
        Some(PgDatabase {
            admin_url,
            name,
            url,
        })
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The URL of this database (`$PICOMQ_PG_URL` with the database name replaced).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// [`PgDatabase::url`] as a `--meta-url`.
    pub fn meta_url(&self) -> MetaUrl {
        MetaUrl::Postgres(self.url.clone())
    }

    /// Runs statements in this database (to damage rows behind a store's back, say); panics on
    /// an error.
    pub fn execute(&self, sql: &str) {
        run(&self.url, sql);
    }

    /// Runs statements in `$PICOMQ_PG_URL`'s own database (to act on this one: `ALTER
    /// DATABASE`, `pg_terminate_backend`); panics on an error.
    pub fn execute_admin(&self, sql: &str) {
        run(&self.admin_url, sql);
    }

    /// Runs one query in this database; its rows, every value as text (NULL as `None`).
    pub fn query(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        query(&self.url, sql)
    }

    /// [`PgDatabase::query`] in `$PICOMQ_PG_URL`'s own database.
    pub fn query_admin(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        query(&self.admin_url, sql)
    }

    /// Ends every connection to this database (the server closes them) and waits, bounded, until
    /// they are gone.
    pub fn terminate_connections(&self) {
        let name = &self.name;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let left = self.query_admin(&format!(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                 WHERE datname = '{name}' AND pid <> pg_backend_pid()"
            ));
            if left[0][0].as_deref() == Some("0") {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "connections to {name} did not end"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        let drop_it = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        let dropped = postgres::Client::connect(&self.admin_url, NoTls)
            .and_then(|mut client| client.batch_execute(&drop_it));
        if let Err(error) = dropped {
            eprintln!("could not drop test database {}: {error:?}", self.name);
        }
    }
}

/// A new connection to `url`; panics on an error.
fn connect(url: &str) -> postgres::Client {
    postgres::Client::connect(url, NoTls).unwrap_or_else(|error| {
        let shown = MetaUrl::Postgres(url.to_string());
        panic!("connect to {shown}: {error:?}")
    })
}

/// Runs `sql` on a new connection to `url`; panics on an error.
fn run(url: &str, sql: &str) {
    connect(url)
        .batch_execute(sql)
        .unwrap_or_else(|error| panic!("{sql}: {error:?}"));
}

/// Runs one query on a new connection to `url`: its rows, as text.
fn query(url: &str, sql: &str) -> Vec<Vec<Option<String>>> {
    let messages = connect(url)
        .simple_query(sql)
        .unwrap_or_else(|error| panic!("{sql}: {error:?}"));
    messages
        .into_iter()
        .filter_map(|message| match message {
            SimpleQueryMessage::Row(row) => Some(
                (0..row.len())
                    .map(|i| row.get(i).map(str::to_string))
                    .collect(),
            ),
            _ => None,
        })
        .collect()
}

/// `url` with its database replaced by `name`, keeping everything else (query included).
pub fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_start = base.find("://").map_or(0, |at| at + 3);
    let path_start = base[authority_start..]
        .find('/')
        .map_or(base.len(), |at| authority_start + at);
    let mut rewritten = format!("{}/{name}", &base[..path_start]);
    if let Some(query) = query {
        rewritten.push('?');
        rewritten.push_str(query);
    }
    rewritten
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn the_database_is_replaced() {
        assert_eq!(
            with_database("postgres://u:p@127.0.0.1:5432/picomq", "t1"),
            "postgres://u:p@127.0.0.1:5432/t1"
        );
        assert_eq!(with_database("postgres://h", "t1"), "postgres://h/t1");
        assert_eq!(
            with_database("postgresql://h:5432/db?connect_timeout=5", "t1"),
            "postgresql://h:5432/t1?connect_timeout=5"
        );
    }
}
