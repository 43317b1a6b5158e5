//! What each command does to the database, whichever it is: create (with its checks and the
//! race with another node), delete, update, garbage collection's choice of segments, and the
//! snapshot load. Everything here is backend-neutral; the SQL is behind [`Backend`].

use std::collections::HashMap;

use crate::backend::Backend;
use crate::backend::NewStream;
use crate::backend::NodeId;
use crate::backend::SegmentColumns;
use crate::backend::StreamColumns;
use crate::backend::StreamUpdate;
use crate::command::{pending, Command, Pending};
use crate::fence::Ownership;
use crate::rows::{commit, segment_entry, storable, stream_row, unsigned};
use crate::CreateOutcome;
use crate::ForkRow;
use crate::MetaError;
use crate::Retention;
use crate::SegmentRecord;
use crate::SegmentStreamEntry;
use crate::Snapshot;
use crate::StreamConfig;
use crate::StreamRow;

pub(crate) fn apply_command(db: &mut dyn Backend, command: Command) -> Pending {
    match command {
        // `batch.rs` applies runs of creates through `create_group` itself; a lone one is a
        // group of one.
        Command::Create {
            name,
            config,
            closed,
            fork,
            now_ms,
            owner,
            reply,
        } => {
            let create = CreateArgs {
                name,
                config,
                closed,
                fork,
                now_ms,
                owner,
            };
            let answer = name_group(db, vec![create], &[]).and_then(|(mut answers, _)| {
                answers.pop().unwrap_or_else(|| {
                    Err(MetaError::Storage("a create went unanswered".to_string()))
                })
            });
            pending(reply, answer)
        }
        Command::Lookup { name, reply } => {
            let lookups = std::slice::from_ref(&name);
            let answer = name_group(db, Vec::new(), lookups).and_then(|(_, mut answers)| {
                answers.pop().unwrap_or_else(|| {
                    Err(MetaError::Storage("a look-up went unanswered".to_string()))
                })
            });
            pending(reply, answer)
        }
        Command::Delete { id, fence, reply } => pending(
            reply,
            crate::fence::check_fence(db, id, fence).and_then(|()| delete(db, id)),
        ),
        Command::Update {
            id,
            update: change,
            fence,
            reply,
        } => pending(
            reply,
            crate::fence::check_fence(db, id, fence).and_then(|()| update(db, id, change)),
        ),
        Command::Commit { segment, reply } => pending(reply, commit(db, &segment)),
        Command::Garbage {
            sealed_before_ms,
            reply,
        } => pending(reply, garbage(db, sealed_before_ms)),
        Command::DropSegments { keys, reply } => pending(reply, drop_segments(db, &keys)),
        Command::Job(job) => job.run(db),
        Command::Snapshot { .. } | Command::Shutdown => {
            unreachable!("run() splits the batch at Snapshot and Shutdown")
        }
    }
}

/// A retention policy as its three columns (NULL: off).
pub(crate) fn retention_columns(retention: &Retention) -> Result<[Option<i64>; 3], MetaError> {
    let column = |value: Option<u64>, what: &'static str| {
        value.map(|v| storable(v, || what.to_string())).transpose()
    };
    Ok([
        column(retention.age_ms, "retention age")?,
        column(retention.bytes, "retention bytes")?,
        column(retention.delete_on_empty_ms, "delete-on-empty time")?,
    ])
}

/// One create of a group ([`create_group`]): the fields of a [`Command::Create`] but its reply.
pub(crate) struct CreateArgs {
    pub(crate) name: String,
    pub(crate) config: StreamConfig,
    pub(crate) closed: bool,
    pub(crate) fork: Option<ForkRow>,
    pub(crate) now_ms: i64,
    pub(crate) owner: Option<NodeId>,
}

/// The answer of a create that found `columns` under its name.
fn existing(columns: StreamColumns) -> Result<CreateOutcome, MetaError> {
    let ownership = crate::fence::ownership(&columns);
    Ok(CreateOutcome {
        row: stream_row(columns)?,
        created: false,
        ownership,
    })
}

/// The row a create inserts, or why its config cannot be stored (that create alone fails).
fn new_stream(create: &CreateArgs) -> Result<NewStream<'_>, MetaError> {
    let CreateArgs {
        name,
        config,
        closed,
        fork,
        now_ms,
        owner,
    } = create;
    let ttl_sec = match config.ttl_sec {
        Some(ttl) => Some(storable(ttl, || "ttl_sec".to_string())?),
        None => None,
    };
    let fork_columns = match fork {
        None => (None, None, None, None),
        Some(f) => (
            Some(f.source.as_str()),
            Some(storable(f.source_id, || "fork source id".to_string())?),
            Some(storable(f.offset, || "fork offset".to_string())?),
            Some(storable(f.partial_bytes, || {
                "fork partial bytes".to_string()
            })?),
        ),
    };
    Ok(NewStream {
        name,
        content_type: &config.content_type,
        ttl_sec,
        expires_at_ms: config.expires_at_ms,
        closed: *closed,
        created_ms: *now_ms,
        fork_source: fork_columns.0,
        fork_source_id: fork_columns.1,
        fork_offset: fork_columns.2,
        fork_partial_bytes: fork_columns.3,
        owner_node: owner.map(i64::from),
        retention: retention_columns(&config.retention)?,
    })
}

type CreateAnswer = Result<CreateOutcome, MetaError>;
type LookupAnswer = Result<Option<(StreamRow, Ownership)>, MetaError>;

/// Answers the look-ups of `lookups` (a cluster's) and registers every name of `creates` that
/// no stream has yet, with one look-up statement for all of them and one insert, instead of
/// two statements per create and one per look-up (on Postgres each is a round trip,
/// docs/architecture.md "Metadata"). The names must be distinct: `batch.rs` ends a group
/// before a repeated name, so the repeat sees the first one's row as it would sequentially.
///
/// One answer per command, in order: a create that found its name taken gets that row with
/// `created: false`, one whose config cannot be stored its own error; a look-up on a database
/// without owners (SQLite) is refused. `Err` when a statement failed: then nothing of the group
/// may be kept (the caller rolls its savepoint back) and every command of it fails.
pub(crate) fn name_group(
    db: &mut dyn Backend,
    creates: Vec<CreateArgs>,
    lookups: &[String],
) -> Result<(Vec<CreateAnswer>, Vec<LookupAnswer>), MetaError> {
    let cluster = db.cluster().is_some();
    let mut names: Vec<&str> = creates.iter().map(|create| create.name.as_str()).collect();
    if cluster {
        names.extend(lookups.iter().map(String::as_str));
    }
    let mut found: HashMap<String, StreamColumns> = if names.is_empty() {
        HashMap::new()
    } else {
        db.find_streams(&names)?
            .into_iter()
            .map(|columns| (columns.name.clone(), columns))
            .collect()
    };
    let looked_up = lookups
        .iter()
        .map(|name| {
            crate::fence::sql(db)?;
            found
                .remove(name)
                .map(|columns| {
                    let owner = crate::fence::ownership(&columns);
                    Ok((stream_row(columns)?, owner))
                })
                .transpose()
        })
        .collect();
    let mut answers: Vec<Option<CreateAnswer>> = Vec::new();
    let mut inserted_at = Vec::new();
    let ids = {
        let mut rows = Vec::new();
        for (at, create) in creates.iter().enumerate() {
            if let Some(columns) = found.remove(&create.name) {
                answers.push(Some(existing(columns)));
                continue;
            }
            match new_stream(create) {
                Ok(row) => {
                    rows.push(row);
                    inserted_at.push(at);
                    answers.push(None);
                }
                Err(error) => answers.push(Some(Err(error))),
            }
        }
        if rows.is_empty() {
            Vec::new()
        } else {
            db.insert_streams(&rows)?
        }
    };
    if ids.len() != inserted_at.len() {
        return Err(MetaError::Storage(format!(
            "insert streams: {} answers for {} rows",
            ids.len(),
            inserted_at.len()
        )));
    }
    let mut creates: Vec<Option<CreateArgs>> = creates.into_iter().map(Some).collect();
    for (at, id) in inserted_at.into_iter().zip(ids) {
        let Some(create) = creates[at].take() else {
            unreachable!("each create is inserted at most once");
        };
        answers[at] = Some(match id {
            Some(id) => Ok(created(create, id)),
            None => {
                // Registered since our look-up by someone else sharing the database (another
                // node on the same Postgres): theirs is the row, as if it had been there first.
                let columns = db.find_stream(&create.name)?.ok_or_else(|| {
                    MetaError::Storage(format!(
                        "stream {:?} was registered and is gone again",
                        create.name
                    ))
                })?;
                existing(columns)
            }
        });
    }
    let answers = answers
        .into_iter()
        .map(|answer| answer.expect("every create of the group is answered"))
        .collect();
    Ok((answers, looked_up))
}

/// The answer of a create that inserted its row as `id`.
fn created(create: CreateArgs, id: i64) -> CreateOutcome {
    // Ids start at 1 and only grow (AUTOINCREMENT, an identity column), so they are positive.
    assert!(
        id > 0,
        "stream {:?} got the non-positive id {id}",
        create.name
    );
    let row = StreamRow {
        id: id as u64,
        name: create.name,
        config: create.config,
        closed: create.closed,
        created_ms: create.now_ms,
        start_offset: 0, // the column's default
        last_access_ms: create.now_ms,
        fork: create.fork,
        soft_deleted: false,
    };
    CreateOutcome {
        row,
        created: true,
        ownership: Ownership {
            node: create.owner,
            epoch: 1,
            transfer_to: None,
        },
    }
}

fn delete(db: &mut dyn Backend, id: u64) -> Result<bool, MetaError> {
    let Ok(id) = i64::try_from(id) else {
        return Ok(false); // no row can have an id above i64::MAX
    };
    db.delete_stream(id)
}

/// Close, soft delete, touch: idempotent, and an unknown id is `Ok`.
fn update(db: &mut dyn Backend, id: u64, update: StreamUpdate) -> Result<(), MetaError> {
    let Ok(id) = i64::try_from(id) else {
        return Ok(()); // unknown id
    };
    db.update_stream(id, update)
}

/// The keys of the segments sealed before `sealed_before_ms` that no stream needs (see
/// [`MetaStore::garbage_segments`]). It reads the segments and their entries, then the start
/// of each stream they name, never the whole stream table, which for a node of a million idle
/// streams would be every row loaded on the metadata thread every `--gc-interval-ms`
/// (docs/decisions/2026-12-small-idle-streams.md).
pub(crate) fn garbage(
    db: &mut dyn Backend,
    sealed_before_ms: i64,
) -> Result<Vec<String>, MetaError> {
    let segments = load_segments(db, |columns| columns.created_ms < sealed_before_ms)?;
    // Every stream with a row counts, also those this node does not hold (another node's in a
    // cluster, a soft-deleted one that forks read): a node never collects what one serves.
    // The catalog's start is at most the owning core's (a trim moves the core first), so a
    // segment a trim just emptied waits for the next pass at worst.
    let ids = segments
        .iter()
        .flat_map(|s| &s.streams)
        .map(|e| e.stream_id);
    let starts = stream_starts(db, ids)?;
    // Quarantined records are kept for an operator until released (rare: a refused commit of
    // acknowledged records; the table is empty otherwise).
    let quarantined: std::collections::HashSet<String> =
        db.quarantined()?.into_iter().map(|(key, ..)| key).collect();
    let mut keys = unneeded(&segments, &starts);
    keys.retain(|key| !quarantined.contains(key));
    Ok(keys)
}

/// The first readable offset of each stream of `ids` (repeats allowed) that has a row.
pub(crate) fn stream_starts(
    db: &mut dyn Backend,
    ids: impl Iterator<Item = u64>,
) -> Result<HashMap<u64, u64>, MetaError> {
    let mut ids: Vec<i64> = ids.filter_map(|id| i64::try_from(id).ok()).collect();
    ids.sort_unstable();
    ids.dedup();
    Ok(db
        .stream_starts(&ids)?
        .into_iter()
        .map(|(id, start)| (id as u64, u64::try_from(start).unwrap_or(0)))
        .collect())
}

/// The keys of `segments` that hold nothing a stream of `starts` (id → first readable offset)
/// needs: no readable record, close marker, producer state or writer sequence of a stream with
/// a row.
fn unneeded(segments: &[SegmentRecord], starts: &HashMap<u64, u64>) -> Vec<String> {
    segments
        .iter()
        .filter(|segment| !segment.streams.iter().any(|entry| needed(entry, starts)))
        .map(|segment| segment.key.clone())
        .collect()
}

/// Whether a stream of `starts` (id → first readable offset) needs what `entry` holds: a
/// readable record, its close marker, producer state or writer sequence.
pub(crate) fn needed(entry: &SegmentStreamEntry, starts: &HashMap<u64, u64>) -> bool {
    match starts.get(&entry.stream_id) {
        None => false,
        Some(&start) => {
            let records_readable = entry.runs.iter().any(|run| run.next_offset > start);
            records_readable
                || entry.closed
                || entry.closed_by.is_some()
                || entry.writer_seq.is_some()
                || !entry.producers.is_empty()
        }
    }
}

fn drop_segments(db: &mut dyn Backend, keys: &[String]) -> Result<(), MetaError> {
    // The foreign key cascades to the segment's stream entries.
    keys.iter().try_for_each(|key| db.delete_segment(key))
}

/// Reads everything a node needs at startup: live streams, and every committed segment in
/// commit order with its entries in the order they were given.
pub(crate) fn load_snapshot(db: &mut dyn Backend) -> Result<Snapshot, MetaError> {
    let streams = db
        .streams()?
        .into_iter()
        .map(stream_row)
        .collect::<Result<Vec<_>, _>>()?;
    let segments = load_segments(db, |_| true)?;
    let reached = db.stream_ids_reached()?;
    Ok(Snapshot {
        streams,
        segments,
        stream_ids_reached: u64::try_from(reached).ok(),
        catalog_id: db.catalog_id()?,
    })
}

/// The committed segments `keep` picks, in commit order, each with its entries in the order
/// they were given.
pub(crate) fn load_segments(
    db: &mut dyn Backend,
    keep: impl Fn(&SegmentColumns) -> bool,
) -> Result<Vec<SegmentRecord>, MetaError> {
    let mut segments = Vec::new();
    for columns in db.segments()? {
        if !keep(&columns) {
            continue;
        }
        let key = columns.key;
        let size_bytes = unsigned(Some(columns.size_bytes), || format!("segment {key}: size"))?;
        let segment = SegmentRecord {
            key,
            size_bytes,
            created_ms: columns.created_ms,
            streams: Vec::new(),
        };
        segments.push((columns.seq, segment));
    }
    // Both lists are sorted by seq, so one forward walk pairs every entry with its segment.
    // An entry of a segment not in the list belongs to a segment committed after the first
    // query: at startup both run in one read transaction, so it cannot happen there, but the
    // garbage collector's pass runs them in the batch's READ COMMITTED transaction while other
    // nodes commit (Postgres). Such a segment is left for the next pass: a segment in the list
    // has all its entries (they commit with it), so nothing is taken for garbage too early.
    let mut cursor = 0;
    db.for_each_entry(&mut |seq, columns| {
        while cursor < segments.len() && segments[cursor].0 < seq {
            cursor += 1;
        }
        if cursor == segments.len() || segments[cursor].0 != seq {
            return Ok(());
        }
        let segment = &mut segments[cursor].1;
        let entry = segment_entry(&segment.key, columns)?;
        segment.streams.push(entry);
        Ok(())
    })?;
    Ok(segments.into_iter().map(|(_, segment)| segment).collect())
}
