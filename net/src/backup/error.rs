//! Why a backup or a restore stopped ([`BackupError`]); each message names the file, object
//! or setting to look at, as `pico admin backup` and `pico admin restore` print it.

use std::path::PathBuf;

use pico_meta::MetaError;
use pico_s3::StoreError;

use super::MANIFEST_FILE;

/// A file operation that failed, as the message names it: "cannot {action} {path}".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileAction {
    Create,
    Read,
    Write,
    Sync,
}

impl FileAction {
    fn verb(self) -> &'static str {
        match self {
            FileAction::Create => "create",
            FileAction::Read => "read",
            FileAction::Write => "write",
            FileAction::Sync => "sync",
        }
    }
}

/// Why a backup or a restore stopped. A backup that stops leaves its directory without a
/// manifest (an incomplete backup restore refuses); a restore that stops leaves its target
/// to be emptied before a retry.
#[derive(Debug)]
pub enum BackupError {
    /// A file or directory operation failed.
    File {
        action: FileAction,
        path: PathBuf,
        source: std::io::Error,
    },
    /// A path could not be made absolute or looked at.
    Path {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A file could not be copied into the restore.
    Copy {
        from: PathBuf,
        to: PathBuf,
        source: std::io::Error,
    },
    /// The subscription state could not be copied (its store's own message).
    Subscriptions(crate::subscriptions::StoreError),
    /// The node's catalog could not be copied.
    CatalogCopy(MetaError),
    /// A catalog copy (the backup's, or the one just made) could not be opened or read.
    Catalog { path: PathBuf, source: MetaError },
    /// The catalog copy's metadata thread stopped before it answered.
    CatalogStopped,
    /// The catalog copy could not say which missing objects are garbage.
    MissingObjects(MetaError),
    /// An object a stream of the catalog copy needs is not in the bucket.
    Needed { key: String },
    /// The backup's deadline came after `copied` of `total` objects.
    OutOfTime { copied: usize, total: usize },
    /// At the asked rate the backup cannot finish before its deadline.
    TooSlow { bytes: u64, rate: u64 },
    /// The node's bucket could not give an object.
    ReadObject { key: String, source: StoreError },
    /// The node's object store is shut down.
    SourceStopped,
    /// An object of the node's bucket holds a frame that fails its checks (its CRC) at byte
    /// `at`.
    DamagedObject {
        key: String,
        at: usize,
        error: String,
    },
    /// An object's size differs from the catalog's.
    SizeMismatch {
        key: String,
        holds: usize,
        catalog: u64,
    },
    /// An object could not be written (`None`: the object store is shut down).
    WriteObject {
        key: String,
        source: Option<StoreError>,
    },
    /// A `file://` bucket directory could not be opened.
    OpenBucket { dir: PathBuf, source: StoreError },
    /// The manifest could not be encoded.
    Encode(serde_json::Error),
    /// The backup directory has no manifest: the backup did not finish.
    Incomplete { dir: PathBuf },
    /// The manifest is not JSON.
    ManifestJson {
        path: PathBuf,
        source: serde_json::Error,
    },
    /// The file is not a PicoMQ backup manifest.
    NotAManifest { path: PathBuf },
    /// The manifest's format is newer than this build reads.
    NewerFormat { path: PathBuf, format: u64 },
    /// The manifest names no format.
    NoFormat { path: PathBuf },
    /// The manifest lists no objects.
    NoObjects,
    /// A manifest object entry lacks its key, size or digest.
    MalformedEntry { entry: String },
    /// The catalog names an object the manifest does not list.
    NotOneBackup { key: String },
    /// The restore's directory holds files.
    NotEmpty { dir: PathBuf },
    /// The restore's `--storage` is not understood.
    StorageUri(StoreError),
    /// The restore's bucket could not be opened or listed (`None`: shut down).
    Bucket {
        uri: String,
        source: Option<StoreError>,
    },
    /// The restore's bucket holds objects already.
    BucketNotEmpty { uri: String, objects: usize },
    /// An object of the backup could not be read (`None`: its store is shut down).
    BackupObject {
        key: String,
        source: Option<StoreError>,
    },
    /// An object of the backup differs from its manifest entry.
    Damaged { key: String },
}

impl std::fmt::Display for BackupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use BackupError as E;
        match self {
            E::File {
                action,
                path,
                source,
            } => write!(f, "cannot {} {}: {source}", action.verb(), path.display()),
            E::Path { path, source } => write!(f, "{}: {source}", path.display()),
            E::Copy { from, to, source } => write!(
                f,
                "cannot copy {} to {}: {source}",
                from.display(),
                to.display()
            ),
            E::Subscriptions(e) => write!(f, "{e}"),
            E::CatalogCopy(e) => write!(f, "catalog copy: {e}"),
            E::Catalog { path, source } => write!(f, "{}: {source}", path.display()),
            E::CatalogStopped => f.write_str("the catalog copy's store stopped"),
            E::MissingObjects(e) => {
                write!(f, "asking the catalog copy about missing objects: {e}")
            }
            E::Needed { key } => write!(
                f,
                "{key} is named by the catalog and needed by a stream, but the bucket does not \
                 have it"
            ),
            E::OutOfTime { copied, total } => write!(
                f,
                "the backup ran out of time after {copied} of {total} objects"
            ),
            E::TooSlow { bytes, rate } => write!(
                f,
                "the backup ran out of time: {bytes} bytes at {rate} bytes per second take longer"
            ),
            E::ReadObject { key, source } => write!(f, "reading {key}: {source}"),
            E::SourceStopped => f.write_str("the node's object store is shut down"),
            E::DamagedObject { key, at, error } => write!(
                f,
                "{key} is damaged: its frame at byte {at} fails its checks ({error}); restore \
                 it from an earlier backup (docs/durability.md)"
            ),
            E::SizeMismatch {
                key,
                holds,
                catalog,
            } => write!(
                f,
                "{key} holds {holds} bytes where the catalog says {catalog}"
            ),
            E::WriteObject { key, source } => match source {
                Some(e) => write!(f, "writing {key}: {e}"),
                None => write!(f, "writing {key}: the object store is shut down"),
            },
            E::OpenBucket { dir, source } => write!(f, "cannot open {}: {source}", dir.display()),
            E::Encode(e) => e.fmt(f),
            E::Incomplete { dir } => write!(
                f,
                "{} has no {MANIFEST_FILE}: not a complete backup (a backup writes its manifest \
                 last; this one did not finish), refused",
                dir.display()
            ),
            E::ManifestJson { path, source } => {
                write!(f, "{}: not valid JSON ({source})", path.display())
            }
            E::NotAManifest { path } => {
                write!(f, "{} is not a PicoMQ backup manifest", path.display())
            }
            E::NewerFormat { path, format } => write!(
                f,
                "{}: backup format {format} is newer than this build reads ({})",
                path.display(),
                super::MANIFEST_FORMAT
            ),
            E::NoFormat { path } => write!(f, "{}: no backup format", path.display()),
            E::NoObjects => f.write_str("the manifest lists no objects"),
            E::MalformedEntry { entry } => {
                write!(f, "a manifest object entry is malformed: {entry}")
            }
            E::NotOneBackup { key } => write!(
                f,
                "the backup's catalog names {key}, which its manifest does not list: the \
                 catalog and the manifest are not of one backup"
            ),
            E::NotEmpty { dir } => write!(
                f,
                "{} is not empty; give a new or empty directory",
                dir.display()
            ),
            E::StorageUri(e) => e.fmt(f),
            E::Bucket { uri, source } => match source {
                Some(e) => write!(f, "{uri}: {e}"),
                None => write!(f, "{uri}: the object store is shut down"),
            },
            E::BucketNotEmpty { uri, objects } => write!(
                f,
                "{uri} holds {objects} objects already; restore into an empty bucket"
            ),
            E::BackupObject { key, source } => match source {
                Some(e) => write!(f, "the backup's {key}: {e}"),
                None => f.write_str("the backup's object store is shut down"),
            },
            E::Damaged { key } => write!(
                f,
                "the backup's {key} does not match its manifest (size or SHA-256): damaged"
            ),
        }
    }
}

impl std::error::Error for BackupError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        use BackupError as E;
        match self {
            E::File { source, .. } | E::Path { source, .. } | E::Copy { source, .. } => {
                Some(source)
            }
            E::CatalogCopy(e) | E::MissingObjects(e) | E::Catalog { source: e, .. } => Some(e),
            E::ReadObject { source, .. } | E::OpenBucket { source, .. } | E::StorageUri(source) => {
                Some(source)
            }
            E::WriteObject { source, .. }
            | E::Bucket { source, .. }
            | E::BackupObject { source, .. } => source.as_ref().map(|e| e as _),
            E::Encode(e) | E::ManifestJson { source: e, .. } => Some(e),
            _ => None,
        }
    }
}

/// `action` on `path` failed with the error it is given.
pub(super) fn file(
    action: FileAction,
    path: &std::path::Path,
) -> impl Fn(std::io::Error) -> BackupError + '_ {
    move |source| BackupError::File {
        action,
        path: path.to_path_buf(),
        source,
    }
}
