//! The connection to the Postgres server: opening it (with durable commits), losing it,
//! reconnecting with back-off, and the prepared statements every query goes through.

use std::collections::HashMap;
use std::time::Duration;
use std::time::Instant;

use postgres::types::ToSql;
use postgres::Client;
use postgres::NoTls;
use postgres::Row;
use postgres::Statement;

use super::errors::{describe, storage};
use super::migrations::migrate;
use crate::limits::{
    PG_CONNECT_TIMEOUT_SECS, PG_RETRY_FIRST_MS, PG_RETRY_LAST_MS, PG_TCP_USER_TIMEOUT_SECS,
};
use crate::MetaError;
use crate::MetaUrl;

pub(crate) struct Postgres {
    pub(super) config: postgres::Config,
    /// The URL with its password masked, for every message.
    pub(super) url: String,
    /// `None` after the connection was found broken, until a reconnect succeeds.
    pub(super) client: Option<Client>,
    /// Statements prepared on `client`, by SQL text; cleared with it.
    pub(super) statements: HashMap<&'static str, Statement>,
    /// No reconnect is attempted before this instant.
    pub(super) retry_at: Instant,
    pub(super) retry_delay: Duration,
    /// Why the last reconnect failed, repeated to the commands failed until the next one.
    pub(super) last_error: String,
    /// The open batch transaction's id (`txid_current()`), to ask whether it committed when
    /// the answer to its COMMIT is lost.
    pub(super) txid: Option<i64>,
}

impl Postgres {
    /// Connects, migrates the schema and returns the backend; every error names the URL (with
    /// its password masked).
    pub(crate) fn open(url: &MetaUrl) -> Result<Postgres, MetaError> {
        let MetaUrl::Postgres(raw) = url else {
            unreachable!("Postgres::open is only called for postgres:// URLs");
        };
        let shown = url.to_string();
        let mut config: postgres::Config = raw
            .parse()
            .map_err(|error| MetaError::BadUrl(format!("invalid --meta-url {shown}: {error}")))?;
        if config.get_application_name().is_none() {
            config.application_name("pico");
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(PG_CONNECT_TIMEOUT_SECS));
        }
        if config.get_tcp_user_timeout().is_none() {
            config.tcp_user_timeout(Duration::from_secs(PG_TCP_USER_TIMEOUT_SECS));
        }
        let mut client = connect(&config).map_err(|why| {
            MetaError::Storage(format!(
                "cannot connect to metadata database {shown}: {why}"
            ))
        })?;
        migrate(&mut client).map_err(|why| MetaError::Storage(format!("{shown}: {why}")))?;
        Ok(Postgres {
            config,
            url: shown,
            client: Some(client),
            statements: HashMap::new(),
            retry_at: Instant::now(),
            retry_delay: Duration::from_millis(PG_RETRY_FIRST_MS),
            last_error: String::new(),
            txid: None,
        })
    }

    /// The connection, reconnecting first when it was lost (and the back-off allows).
    pub(super) fn connected(&mut self) -> Result<&mut Client, String> {
        if self.client.as_ref().is_some_and(Client::is_closed) {
            self.disconnect();
        }
        if self.client.is_none() {
            let now = Instant::now();
            if now < self.retry_at {
                return Err(format!(
                    "not connected to {} (next attempt in {} ms): {}",
                    self.url,
                    (self.retry_at - now).as_millis(),
                    self.last_error
                ));
            }
            match connect(&self.config) {
                Ok(client) => {
                    log::info!("metadata database {}: reconnected", self.url);
                    self.client = Some(client);
                    self.retry_delay = Duration::from_millis(PG_RETRY_FIRST_MS);
                }
                Err(why) => {
                    self.retry_at = now + self.retry_delay;
                    self.retry_delay =
                        (self.retry_delay * 2).min(Duration::from_millis(PG_RETRY_LAST_MS));
                    let message = format!("cannot reconnect to {}: {why}", self.url);
                    self.last_error = why;
                    return Err(message);
                }
            }
        }
        Ok(self.client.as_mut().expect("connected above"))
    }

    /// Forgets a broken connection (and what was prepared on it).
    pub(super) fn disconnect(&mut self) {
        if self.client.take().is_some() {
            log::warn!("metadata database {}: connection lost", self.url);
        }
        self.statements.clear();
    }

    /// The connection and the prepared form of `sql` on it, for a data statement (inside a
    /// batch, so [`Backend::begin`] connected).
    pub(super) fn prepared(
        &mut self,
        sql: &'static str,
        doing: &str,
    ) -> Result<(&mut Client, Statement), MetaError> {
        let Some(client) = self.client.as_mut() else {
            return Err(MetaError::Storage(format!(
                "{doing}: not connected to {}",
                self.url
            )));
        };
        let statement = match self.statements.get(sql) {
            Some(statement) => statement.clone(),
            None => {
                let statement = client.prepare(sql).map_err(storage(doing))?;
                self.statements.insert(sql, statement.clone());
                statement
            }
        };
        Ok((client, statement))
    }

    pub(super) fn query(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
        doing: &str,
    ) -> Result<Vec<Row>, MetaError> {
        let (client, statement) = self.prepared(sql, doing)?;
        client.query(&statement, params).map_err(storage(doing))
    }

    /// The first column of the one row `sql` answers (an aggregate's).
    pub(super) fn query_value<T: for<'a> postgres::types::FromSql<'a>>(
        &mut self,
        sql: &'static str,
        doing: &str,
    ) -> Result<T, MetaError> {
        let rows = self.query(sql, &[], doing)?;
        let row = rows
            .first()
            .ok_or_else(|| MetaError::Storage(format!("{doing}: no row")))?;
        row.try_get(0).map_err(storage(doing))
    }

    pub(super) fn execute(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
        doing: &str,
    ) -> Result<u64, MetaError> {
        let (client, statement) = self.prepared(sql, doing)?;
        client.execute(&statement, params).map_err(storage(doing))
    }
}

/// Opens one connection and makes sure a commit it reports is durable.
fn connect(config: &postgres::Config) -> Result<Client, String> {
    let mut client = config.connect(NoTls).map_err(|error| describe(&error))?;
    let mode: String = client
        .query_one("SHOW synchronous_commit", &[])
        .map_err(|error| describe(&error))?
        .get(0);
    if mode == "off" {
        // The server's default would acknowledge commits that a crash can still lose.
        client
            .batch_execute("SET synchronous_commit TO on")
            .map_err(|error| describe(&error))?;
    }
    // Plan each execution of a prepared statement for the tables as they are then. A generic
    // plan is made once, early, for the tables as they were: a fresh cluster's look-ups by
    // name (`name = ANY($1)`) would keep the sequential scan planned for an empty `streams`
    // table while it grows to thousands of rows, 8.7 ms a look-up, until autovacuum's first
    // ANALYZE replaces the plan: creates run at 2,700/s or 9,800/s depending on when that
    // comes (docs/decisions/2026-12-create-groups.md). Planning a metadata statement costs
    // microseconds; the metadata thread runs a few per batch. PostgreSQL before 12 has no such
    // setting and keeps its default.
    if let Err(error) = client.batch_execute("SET plan_cache_mode TO force_custom_plan") {
        log::info!(
            "metadata log: PostgreSQL keeps generic plans ({})",
            describe(&error)
        );
    }
    Ok(client)
}
