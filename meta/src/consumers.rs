//! Named consumers' documents: the metadata log stores each consumer as one opaque JSON
//! document (its format and rules are the net crate's, `net/src/consumers`), read, decided on
//! and rewritten in one transaction of the metadata thread, so every change is atomic and, in
//! a cluster, serialized by the row lock of the consumer it changes.

use std::collections::BTreeMap;

use crate::backend::Backend;
use crate::MetaError;
use crate::MetaStore;
use crate::Reply;

/// What a decision does to the document it read.
#[derive(Debug, PartialEq, Eq)]
pub enum ConsumerWrite {
    /// Nothing changes (a read, a refused request, an idempotent repeat).
    Keep,
    /// The document becomes this one (made when there was none); the wake stays as read.
    Put(String),
    /// The document becomes this one and the wake this one (`None`: no wake webhook).
    PutWithWake(String, Option<String>),
    /// The consumer is deleted.
    Delete,
}

/// What a decision is given: the stored document (`None`: no such consumer), the clock every
/// node of the metadata log agrees on (the database's for Postgres, this node's for SQLite),
/// how many consumers the scope has (counted only when there is no document, where a
/// create needs it), and which incarnation of each followed stream lives now.
#[derive(Debug)]
pub struct ConsumerRead {
    pub document: Option<String>,
    /// The consumer's wake webhook (JSON, the net crate's format), if it has one.
    pub wake: Option<String>,
    pub now_ms: i64,
    pub scope_count: u64,
    /// The id of the live stream by each name the decision follows (a name without one: no
    /// live stream by that name now). Ids are never reused, so a stream deleted and created
    /// again has a new one: a position counted in the old stream means nothing in the new.
    pub incarnations: BTreeMap<String, u64>,
}

/// One stored consumer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredConsumer {
    pub scope: String,
    pub id: String,
    pub document: String,
    pub wake: Option<String>,
}

/// Every consumer, and the clock of the read.
#[derive(Clone, Debug)]
pub struct ConsumerList {
    pub consumers: Vec<StoredConsumer>,
    pub now_ms: i64,
}

impl MetaStore {
    /// [`MetaStore::change_consumer_following`], given no stream's incarnation.
    pub fn change_consumer<T: Send + 'static>(
        &self,
        scope: String,
        id: String,
        decide: impl FnOnce(ConsumerRead) -> (ConsumerWrite, T) + Send + 'static,
    ) -> Reply<T> {
        self.change_consumer_following(scope, id, |_| Vec::new(), decide)
    }

    /// Reads consumer `id` of `scope`, lets `decide` say what becomes of it and what to
    /// answer, and applies that write in the same transaction. `followed` names the streams
    /// whose live incarnations the decision is given, from the stored document (`None`:
    /// there is none). The answer arrives once the transaction committed (a decision whose
    /// write did not commit answers an error).
    pub fn change_consumer_following<T: Send + 'static>(
        &self,
        scope: String,
        id: String,
        followed: impl FnOnce(Option<&str>) -> Vec<String> + Send + 'static,
        decide: impl FnOnce(ConsumerRead) -> (ConsumerWrite, T) + Send + 'static,
    ) -> Reply<T> {
        self.job(move |db| {
            let (document, wake) = db.consumer(&scope, &id)?.unzip();
            let wake = wake.flatten();
            let names = followed(document.as_deref());
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let incarnations = db
                .find_streams(&names)?
                .into_iter()
                .filter(|row| !row.soft_deleted)
                .map(|row| (row.name, row.id as u64))
                .collect();
            let now_ms = clock_ms(db)?;
            let scope_count = match document {
                Some(_) => 0,
                None => db.consumer_count(&scope)?,
            };
            let (write, answer) = decide(ConsumerRead {
                document,
                wake: wake.clone(),
                now_ms,
                scope_count,
                incarnations,
            });
            match write {
                ConsumerWrite::Keep => {}
                ConsumerWrite::Put(document) => {
                    db.put_consumer(&scope, &id, &document, wake.as_deref(), now_ms)?
                }
                ConsumerWrite::PutWithWake(document, wake) => {
                    db.put_consumer(&scope, &id, &document, wake.as_deref(), now_ms)?
                }
                ConsumerWrite::Delete => {
                    db.delete_consumer(&scope, &id)?;
                }
            }
            Ok(answer)
        })
    }

    /// Every consumer, by scope then id, with the clock they were read at.
    pub fn consumers(&self) -> Reply<ConsumerList> {
        self.list_consumers(false)
    }

    /// The consumers with a wake webhook, by scope then id, with the clock of the read.
    pub fn waking_consumers(&self) -> Reply<ConsumerList> {
        self.list_consumers(true)
    }

    /// At most `limit` consumers after `(scope, id)` (from the first without it), by scope
    /// then id, and how many there are in all: a page of a report.
    pub fn consumer_page(
        &self,
        after: Option<(String, String)>,
        limit: u32,
    ) -> Reply<(Vec<StoredConsumer>, u64)> {
        self.job(move |db| {
            let after = after.as_ref().map(|(s, i)| (s.as_str(), i.as_str()));
            let page = db
                .consumers_after(after, limit)?
                .into_iter()
                .map(stored)
                .collect();
            Ok((page, db.consumer_total()?))
        })
    }

    fn list_consumers(&self, waking_only: bool) -> Reply<ConsumerList> {
        self.job(move |db| {
            let consumers = db.consumers(waking_only)?.into_iter().map(stored).collect();
            Ok(ConsumerList {
                consumers,
                now_ms: clock_ms(db)?,
            })
        })
    }
}

/// The clock leases are judged by: the database's in a cluster, so nodes with skewed clocks
/// agree; this node's otherwise.
fn stored((scope, id, document, wake): crate::backend::ConsumerColumns) -> StoredConsumer {
    StoredConsumer {
        scope,
        id,
        document,
        wake,
    }
}

fn clock_ms(db: &mut dyn Backend) -> Result<i64, MetaError> {
    match db.cluster() {
        Some(cluster) => cluster.clock_ms(),
        None => Ok(std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))),
    }
}
