//! Starting a node: the WAL directory's lock, the metadata log and the object store opened,
//! cluster registration, recovery of the previous run's WAL files, then the streams split
//! across the cores into one [`CoreSeed`] each (started by `CoreHandle::start`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use futures_channel::mpsc;
use pico_meta::{MetaError, MetaStore, MetaUrl};
use pico_s3::{ObjectStore, ObjectStoreOptions, S3Options, StorageUri, StoreError};

use crate::bucket_check::{check_bucket, BucketCheck, ForeignBucket};
use crate::clock::Clock;
use crate::cluster::{start_keeper, Cluster, ClusterConfig};
use crate::config::{Durability, EngineConfig};
use crate::inbox::Message;
use crate::limits::{self, SettingError};
use crate::metrics::{CoreMetrics, NodeMetrics};
use crate::placement::owner_core;
use crate::put_budget::PutBudget;
use crate::recovery::{
    recover_wal_files, store_in_background, sweep_orphans, wait, wal_files, RecoveryBacklog,
    RecoveryError, StorageError,
};
use crate::shard::stream_seeds_by_core;
use crate::shard::StreamSeed;
use crate::wal_witness::{ForeignWalDir, WalWitness};

/// Everything one core needs to start its shard; `Send`, handed to the core's thread.
pub struct CoreSeed {
    pub(crate) core: usize,
    pub(crate) config: EngineConfig,
    pub(crate) meta: MetaStore,
    pub(crate) store: ObjectStore,
    pub(crate) streams: Vec<StreamSeed>,
    pub(crate) inbox: mpsc::Receiver<Message>,
    pub(crate) peers: Vec<mpsc::Sender<Message>>,
    pub(crate) metrics: Arc<CoreMetrics>,
    pub(crate) cluster: Option<Arc<Cluster>>,
    /// The node's object-store PUTs for flushes, shared by its cores.
    pub(crate) put_budget: Arc<PutBudget>,
    /// Where the core reads the time (the node's one clock).
    pub(crate) clock: Clock,
    /// Recovered WAL files the bucket did not take at start, shared by the cores.
    pub(crate) recovery: Arc<RecoveryBacklog>,
}

/// The result of [`boot`]: one seed per core plus the shared handles.
pub struct Boot {
    pub seeds: Vec<CoreSeed>,
    pub meta: MetaStore,
    pub store: ObjectStore,
    /// Facts worth a startup log line.
    pub report: Vec<String>,
    /// Exclusive lock on the WAL directory: keep it for as long as the node runs.
    pub wal_lock: std::fs::File,
    /// Every core's counters, for `/metrics` and the admin API.
    pub metrics: NodeMetrics,
    /// This node's membership, when the metadata log is shared (Postgres): its lease keeper
    /// runs from here on.
    pub cluster: Option<Arc<Cluster>>,
    /// One line per damaged WAL file `--wal-salvage` brought the node up past: the file,
    /// where it is kept and what each stream lost (for `/ready` and `/metrics`).
    pub wal_salvaged: Vec<String>,
    /// Recovered WAL files the bucket did not take at start: served from memory, stored by a
    /// thread of their own (for `/ready` and `/metrics`).
    pub recovery_backlog: Arc<RecoveryBacklog>,
    /// The catalog's witness of this WAL directory (a SQLite file catalog): told after a clean
    /// stop that stored everything.
    pub wal_witness: Option<WalWitness>,
}

/// Why a node could not start; each says what to fix.
#[derive(Debug)]
pub enum BootError {
    /// A setting out of its range (`EngineConfig::check`, `ClusterConfig::check`).
    Setting(SettingError),
    CreateWalDir {
        dir: PathBuf,
        source: std::io::Error,
    },
    /// The WAL directory's lock file could not be opened.
    OpenLock {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Another node holds the WAL directory's lock.
    Locked {
        dir: PathBuf,
        lock: PathBuf,
    },
    /// `--meta-url` is not understood, or the metadata log does not open.
    Meta(MetaError),
    /// `--storage` is not understood, or the object store does not open.
    Store(StoreError),
    /// Registering in the cluster, or reading what this node owns, failed.
    Storage(StorageError),
    Recovery(RecoveryError),
    /// The catalog last ran with another WAL directory, which may hold unstored records.
    ForeignWalDir(ForeignWalDir),
    /// The catalog's witness of the WAL directory could not be written.
    Witness(std::io::Error),
    /// The bucket holds none of the catalog's newest segments.
    ForeignBucket(ForeignBucket),
}

impl std::fmt::Display for BootError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BootError::Setting(e) => e.fmt(f),
            BootError::CreateWalDir { dir, source } => {
                write!(f, "cannot create WAL directory {}: {source}", dir.display())
            }
            BootError::OpenLock { path, source } => {
                write!(f, "cannot open {}: {source}", path.display())
            }
            BootError::Locked { dir, lock } => write!(
                f,
                "{} is in use by another pico serve (lock {}); give each node its own --wal-dir",
                dir.display(),
                lock.display()
            ),
            BootError::Meta(e) => e.fmt(f),
            BootError::Store(e) => e.fmt(f),
            BootError::Storage(e) => e.fmt(f),
            BootError::Recovery(e) => e.fmt(f),
            BootError::ForeignWalDir(e) => e.fmt(f),
            BootError::Witness(e) => write!(f, "cannot write the catalog's WAL witness: {e}"),
            BootError::ForeignBucket(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for BootError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BootError::Setting(e) => Some(e),
            BootError::CreateWalDir { source, .. } | BootError::OpenLock { source, .. } => {
                Some(source)
            }
            BootError::Locked { .. } => None,
            BootError::Meta(e) => Some(e),
            BootError::Store(e) => Some(e),
            BootError::Storage(e) => Some(e),
            BootError::Recovery(e) => Some(e),
            BootError::ForeignWalDir(e) => Some(e),
            BootError::Witness(e) => Some(e),
            BootError::ForeignBucket(e) => Some(e),
        }
    }
}

impl From<SettingError> for BootError {
    fn from(e: SettingError) -> BootError {
        BootError::Setting(e)
    }
}

impl From<StorageError> for BootError {
    fn from(e: StorageError) -> BootError {
        BootError::Storage(e)
    }
}

impl From<RecoveryError> for BootError {
    fn from(e: RecoveryError) -> BootError {
        BootError::Recovery(e)
    }
}

/// Opens the metadata log and the object store, recovers every WAL file left by a previous
/// run (whatever its core count), and splits the streams across `config.cores` cores.
/// Runs on the main thread before any executor starts.
pub fn boot(
    config: EngineConfig,
    meta_url: &str,
    storage: &str,
    cluster: Option<ClusterConfig>,
) -> Result<Boot, BootError> {
    boot_with_clock(config, meta_url, storage, cluster, Clock::real())
}

/// [`boot`] with the clock the node reads: recovery's timestamps, the lease, the PUT budget and
/// every core (a test's simulated one).
pub fn boot_with_clock(
    mut config: EngineConfig,
    meta_url: &str,
    storage: &str,
    cluster: Option<ClusterConfig>,
    clock: Clock,
) -> Result<Boot, BootError> {
    config.check()?;
    if let Some(cluster) = &cluster {
        cluster.check()?;
    }
    std::fs::create_dir_all(&config.wal_dir).map_err(|source| BootError::CreateWalDir {
        dir: config.wal_dir.clone(),
        source,
    })?;
    // Two nodes on one WAL directory would recover (and delete) each other's live files.
    let wal_lock = lock_dir(&config.wal_dir)?;
    let url = MetaUrl::parse(meta_url).map_err(BootError::Meta)?;
    // A cluster node reads the catalog only once it has registered (below): from then on no
    // earlier incarnation of it can commit, and the snapshot holds everything one did commit.
    // Read before, a segment an earlier incarnation was committing meanwhile (still running,
    // frozen, or killed with its COMMIT on the wire) would be acknowledged there and missing
    // here, and this node would hand out its offsets again.
    let (meta, early_snapshot) = if cluster.is_some() {
        (
            MetaStore::open_unloaded(&url).map_err(BootError::Meta)?,
            None,
        )
    } else {
        let (meta, snapshot) = MetaStore::open(&url).map_err(BootError::Meta)?;
        (meta, Some(snapshot))
    };
    // Once the catalog is this node's (its lock taken) and before anything is recovered: a
    // refusal changes nothing.
    let (wal_witness, wal_dir_lost) = WalWitness::check(&url, &config.wal_dir, config.wal_salvage)
        .map_err(BootError::ForeignWalDir)?;
    let uri = StorageUri::parse(storage).map_err(BootError::Store)?;
    // A node with data of its own starts while its bucket cannot be reached, and serves what
    // it holds (reads keep working when writes cannot); a wrong secret or bucket still stops
    // it, as does an unreachable bucket at a first start, where a typo is likelier.
    let has_data = wal_files(&config.wal_dir).is_ok_and(|files| !files.is_empty())
        || early_snapshot
            .as_ref()
            .is_some_and(|snapshot| !snapshot.streams.is_empty());
    let options = ObjectStoreOptions {
        s3: S3Options {
            open_when_unreachable: has_data,
            ..S3Options::default()
        },
        ..ObjectStoreOptions::default()
    };
    let store = ObjectStore::open_with(&uri, options).map_err(BootError::Store)?;
    let mut report = Vec::new();
    if let Some(why) = store.unreachable_at_open() {
        log::warn!(
            "the bucket cannot be reached ({why}); serving what this node holds meanwhile: \
             reads of stored segments fail and uploads retry until it answers"
        );
        report.push("started while the bucket could not be reached".to_string());
    }
    let cluster = match cluster {
        None => None,
        Some(cluster_config) => {
            let node = cluster_config.node_id;
            let state = wait(meta.register_node(
                node,
                cluster_config.node_epoch,
                &cluster_config.address,
                cluster_config.slots,
                cluster_config.lease_ms,
            ))?;
            report.push(format!(
                "cluster {}: node {node} registered at epoch {} as {} with {} slots ({} nodes \
                 known)",
                cluster_config.cluster_id,
                cluster_config.node_epoch,
                cluster_config.address,
                cluster_config.slots,
                state.nodes.len()
            ));
            // The previous incarnation may still run (a replacement started beside it, or it
            // is frozen): it cannot renew its lease any more, and acknowledges nothing once the
            // lease lapses. Until then this one must not acknowledge anything either.
            if state.previous_lease_left_ms > 0 {
                let left = state.previous_lease_left_ms;
                log::warn!(
                    "node {node}: the previous incarnation's lease has {left} ms left; waiting \
                     it out before serving (it may still be running)"
                );
                std::thread::sleep(std::time::Duration::from_millis(left));
                report.push(format!(
                    "waited {left} ms for the previous incarnation's lease to lapse"
                ));
            }
            Some(Cluster::new(cluster_config, state, clock.clone()))
        }
    };
    let mut snapshot = match early_snapshot {
        Some(snapshot) => snapshot,
        None => wait(meta.load_snapshot())?,
    };
    config.catalog_id = snapshot.catalog_id.clone();
    // Before recovery stores anything there: a bucket holding none of the catalog's newest
    // segments is not the one this catalog's node stored to.
    let bucket_reached = store.unreachable_at_open().is_none();
    let mut bucket_lost = None;
    if bucket_reached {
        match check_bucket(&meta, &store, &snapshot) {
            BucketCheck::Holds => {}
            BucketCheck::Lost(missing) => {
                let line = format!(
                    "the bucket holds this catalog's marker but none of its newest segment \
                     objects ({}): they are lost from it, and reads of their records fail \
                     until they are restored",
                    missing.join(", ")
                );
                log::error!("{line}");
                report.push(line);
            }
            BucketCheck::Unanswered(e) => {
                log::warn!("could not check that the bucket holds the catalog's segments: {e}")
            }
            BucketCheck::Foreign(foreign) if config.wal_salvage => {
                bucket_lost = Some(foreign.salvaged())
            }
            BucketCheck::Foreign(foreign) => return Err(BootError::ForeignBucket(foreign)),
        }
    }
    let fence = cluster.as_ref().map(|c| (c.node_id(), c.node_epoch()));
    let recovered = recover_wal_files(
        &config,
        &meta,
        &store,
        &mut snapshot,
        &mut report,
        fence,
        &clock,
    )?;
    let mut wal_salvaged = recovered.salvaged;
    for line in wal_dir_lost.into_iter().chain(bucket_lost) {
        log::error!("{line}");
        report.push(line.clone());
        wal_salvaged.push(line);
    }
    let mut epochs = HashMap::new();
    if let Some(cluster) = &cluster {
        // Only what this node owns; the other nodes' streams are theirs to serve.
        epochs = wait(meta.owned_streams(cluster.node_id()))?;
        snapshot.streams.retain(|row| epochs.contains_key(&row.id));
    }
    config.node_epoch_ms = config.node_epoch_ms.max(recovered.max_epoch_ms + 1);
    // Best effort: an object left behind costs space, not data; the next start tries again.
    let swept = if bucket_reached {
        sweep_orphans(&config, &meta, &store, &snapshot, &recovered.wal_epochs)
    } else {
        Ok(0)
    };
    match swept {
        Ok(0) => {}
        Ok(removed) => report.push(format!(
            "deleted {removed} segment objects that earlier runs stored but never committed"
        )),
        Err(e) => log::warn!("sweeping segment objects that were never committed: {e}"),
    }
    // Its segments are in `snapshot` already, so the sweep above left their objects alone.
    let recovery = store_in_background(recovered.deferred, &meta, &store, fence);
    if recovery.unstored_segments() > 0 {
        report.push(format!(
            "{} recovered WAL files wait for the bucket: served from memory, stored in order \
             before any newer segment",
            recovery.unstored_segments()
        ));
    }
    if let Some(witness) = &wal_witness {
        // From here on the WAL may take appends the catalog does not have yet.
        let unstored = config.durability == Durability::Local || recovery.unstored_segments() > 0;
        witness.open(unstored).map_err(BootError::Witness)?;
    }
    let cores = config.cores;
    let streams_recovered = snapshot.streams.len();
    let mut per_core = stream_seeds_by_core(&mut snapshot, cores, |name| owner_core(name, cores));
    for seed in per_core.iter_mut().flatten() {
        seed.epoch = epochs.get(&seed.id).copied().unwrap_or(0);
    }
    report.push(format!(
        "recovered {streams_recovered} streams and {} segments",
        snapshot.segments.len()
    ));
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..cores)
        .map(|_| mpsc::channel(limits::CROSS_CORE_QUEUE_MAX))
        .unzip();
    let metrics: NodeMetrics = Arc::new(
        (0..config.cores)
            .map(|_| Arc::new(CoreMetrics::default()))
            .collect(),
    );
    // One PUT per core may go at once; beyond that the cores share the node's rate.
    let put_budget = Arc::new(PutBudget::new(
        config.object_puts_per_second,
        config.cores,
        clock.clone(),
    ));
    let seeds = receivers
        .into_iter()
        .zip(per_core)
        .enumerate()
        .map(|(core, (inbox, streams))| CoreSeed {
            core,
            config: config.clone(),
            meta: meta.clone(),
            store: store.clone(),
            streams,
            inbox,
            peers: senders.clone(),
            metrics: metrics[core].clone(),
            cluster: cluster.clone(),
            put_budget: put_budget.clone(),
            clock: clock.clone(),
            recovery: recovery.clone(),
        })
        .collect();
    if let Some(cluster) = &cluster {
        // The thread runs for the life of the process; it stops renewing on shutdown.
        drop(start_keeper(cluster.clone(), meta.clone(), senders));
    }
    Ok(Boot {
        seeds,
        meta,
        store,
        report,
        wal_lock,
        metrics,
        cluster,
        wal_salvaged,
        recovery_backlog: recovery,
        wal_witness,
    })
}

/// Takes an exclusive `flock` on `<dir>/LOCK`, released when the process exits (even by
/// SIGKILL), so a second node on the same directory refuses to start.
fn lock_dir(dir: &std::path::Path) -> Result<std::fs::File, BootError> {
    use std::os::fd::AsRawFd;
    let path = dir.join("LOCK");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| BootError::OpenLock {
            path: path.clone(),
            source,
        })?;
    // SAFETY: flock on a descriptor we own; no memory is involved.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    if !locked {
        return Err(BootError::Locked {
            dir: dir.to_path_buf(),
            lock: path,
        });
    }
    Ok(file)
}
