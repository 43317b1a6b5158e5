//! The flags of the operator's command groups: `pico config` (saved profiles) and
//! `pico admin` (checkpoints, backups, quarantine, cluster).

use argh::{ArgsInfo, FromArgs};

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "config")]
/// Manage saved connection profiles (the file at `pico config path`, or $PICO_CONFIG).
pub struct ConfigArgs {
    #[argh(subcommand)]
    pub command: ConfigCommand,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand)]
pub enum ConfigCommand {
    Set(ConfigSetArgs),
    Get(ConfigGetArgs),
    Ls(ConfigLsArgs),
    Rm(ConfigRmArgs),
    Use(ConfigUseArgs),
    Path(ConfigPathArgs),
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "set")]
/// Save the given global flags (--endpoint, --protocol, --http2, --token, --ca-cert) into a profile; plain commands use it only with --profile NAME, or once it is the default (--default here, or pico config use NAME).
pub struct ConfigSetArgs {
    #[argh(positional)]
    /// profile name
    pub name: String,

    /// also make it the default profile, which commands without --profile use [env: PICO_DEFAULT]
    #[argh(switch)]
    pub default: bool,

    /// save http2 = false in the profile [env: PICO_NO_HTTP2]
    #[argh(switch)]
    pub no_http2: bool,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "get")]
/// Print a profile as <name>TAB<endpoint> <protocol> <http2> (- when unset), then token=(saved) and ca_cert=<path> when saved; default: the default profile.
pub struct ConfigGetArgs {
    #[argh(positional)]
    /// profile name
    pub name: Option<String>,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "ls")]
/// List the saved profiles, marking the default one.
pub struct ConfigLsArgs {}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "rm")]
/// Remove a profile.
pub struct ConfigRmArgs {
    #[argh(positional)]
    /// profile name
    pub name: String,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "use")]
/// Make a profile the default.
pub struct ConfigUseArgs {
    #[argh(positional)]
    /// profile name
    pub name: String,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "path")]
/// Print the path of the config file.
pub struct ConfigPathArgs {}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "admin")]
/// Inspect and steer a node through its admin listener; ignores profiles and --endpoint, uses --token and --ca-cert.
pub struct AdminArgs {
    /// admin listener base URL (default http://127.0.0.1:9090) [env: PICO_ADMIN_ENDPOINT]
    #[argh(option, arg_name = "url")]
    pub admin_endpoint: Option<String>,

    /// print the answer as pretty JSON on stdout instead of formatted lines [env: PICO_JSON]
    #[argh(switch)]
    pub json: bool,

    #[argh(subcommand)]
    pub command: AdminCommand,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand)]
pub enum AdminCommand {
    Cluster(AdminClusterArgs),
    Nodes(AdminNodesArgs),
    Stream(AdminStreamArgs),
    Transfer(AdminTransferArgs),
    SetSlots(AdminSetSlotsArgs),
    Quarantine(AdminQuarantineArgs),
    Backup(AdminBackupArgs),
    Verify(AdminVerifyArgs),
    Restore(AdminRestoreArgs),
    Checkpoint(AdminCheckpointArgs),
    GcHold(AdminGcHoldArgs),
    GcRelease(AdminGcReleaseArgs),
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "checkpoint")]
/// Store and commit what only the node's WAL holds (a cluster backup's step, docs/backup.md); prints the time it started and ended.
pub struct AdminCheckpointArgs {
    /// give up after this many seconds (default 3600) [env: PICO_TIMEOUT_SEC]
    #[argh(option, arg_name = "secs")]
    pub timeout_sec: Option<u64>,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "gc-hold")]
/// Hold the node's garbage collector (a cluster backup's step, docs/backup.md): it deletes no object until the hold runs out or gc-release; prints held=true until=<ms>.
pub struct AdminGcHoldArgs {
    /// how long the hold lasts at most, 1 to 86400 seconds [env: PICO_SECONDS]
    #[argh(option, arg_name = "secs")]
    pub seconds: u64,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "gc-release")]
/// Release the hold gc-hold took; prints held=false.
pub struct AdminGcReleaseArgs {}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "backup")]
/// Back the node up while it serves (docs/backup.md): every append acknowledged before the command reached the node, in a new directory under the node's --backup-dir; prints the cut and counts.
pub struct AdminBackupArgs {
    /// the backup's directory, new or empty, under the node's --backup-dir: a name relative to it, or an absolute path inside it [env: PICO_TO]
    #[argh(option, arg_name = "dir")]
    pub to: std::path::PathBuf,

    /// give up (no manifest is written) after this many seconds (default 3600, at most 86400) [env: PICO_TIMEOUT_SEC]
    #[argh(option, arg_name = "secs")]
    pub timeout_sec: Option<u64>,

    /// read objects from the node's bucket at most this fast (default: no limit) [env: PICO_MAX_BYTES_PER_SECOND]
    #[argh(option, arg_name = "n")]
    pub max_bytes_per_second: Option<u64>,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "verify")]
/// Read every stored object a stream still reads and check it as a reader would (size, every frame's CRC, presence), before a reader needs it (docs/durability.md); prints the counts and each damaged object with the records it costs; exits 1 if any is damaged or unreadable.
pub struct AdminVerifyArgs {
    /// give up after this many seconds (default 86400, at most 604800) [env: PICO_TIMEOUT_SEC]
    #[argh(option, arg_name = "secs")]
    pub timeout_sec: Option<u64>,

    /// read objects from the node's bucket at most this fast (default: no limit) [env: PICO_MAX_BYTES_PER_SECOND]
    #[argh(option, arg_name = "n")]
    pub max_bytes_per_second: Option<u64>,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "restore")]
/// Lay a backup out for a new node (runs here, not through the admin listener): checks the manifest and every object, then prints the pico serve flags to start it.
pub struct AdminRestoreArgs {
    /// the backup directory (refused without its manifest.json: an unfinished backup) [env: PICO_FROM]
    #[argh(option, arg_name = "dir")]
    pub from: std::path::PathBuf,

    /// a new or empty directory for the node's catalog (meta.db), WAL directory (wal/) and, without --storage, its bucket (objects/) [env: PICO_TO]
    #[argh(option, arg_name = "dir")]
    pub to: std::path::PathBuf,

    /// put the objects in this bucket instead, --storage's syntax (<id>@file://DIR or <id>@s3://BUCKET?...); it must hold no objects [env: PICO_STORAGE]
    #[argh(option, arg_name = "uri")]
    pub storage: Option<String>,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "quarantine")]
/// Records a segment commit refused after they were acknowledged, kept for an operator.
pub struct AdminQuarantineArgs {
    #[argh(subcommand)]
    pub command: QuarantineCommand,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand)]
pub enum QuarantineCommand {
    Ls(QuarantineLsArgs),
    Export(QuarantineExportArgs),
    Release(QuarantineReleaseArgs),
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "ls")]
/// Print one line per quarantined entry: segment, stream id, offsets, reason.
pub struct QuarantineLsArgs {}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "export")]
/// Print an entry's records, one JSON object per line (offset, timestampMs, headers, body or bodyBase64).
pub struct QuarantineExportArgs {
    #[argh(positional)]
    /// segment key, as `ls` prints it
    pub segment: String,
    #[argh(positional)]
    /// stream id, as `ls` prints it
    pub stream_id: u64,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "release")]
/// Drop an entry (export it first): its segment may then be garbage-collected.
pub struct QuarantineReleaseArgs {
    #[argh(positional)]
    /// segment key, as `ls` prints it
    pub segment: String,
    #[argh(positional)]
    /// stream id, as `ls` prints it
    pub stream_id: u64,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "cluster")]
/// Print the node's view of the cluster: identity, counts and pending transfers.
pub struct AdminClusterArgs {}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "nodes")]
/// Print one line per node ever registered: node=<id> epoch=<incarnation, grows at each start> address=<Pico listener URL> slots=<placement weight> opening=<streams it owns now> placed=<always 0> state=<live: holds its lease; expired: stopped renewing it (killed, paused or cut off), its streams move to live nodes once the lease lapsed; left: stopped cleanly and handed its streams over> lease=<+4.2s: expires in 4.2 s (renewed every third of --lease-ms); -12.3s: lapsed 12.3 s ago; -: none> and (this node) on the node asked. --json adds leaseExpiresAtMs, registeredAtMs and dsAddress.
pub struct AdminNodesArgs {}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "stream")]
/// Print a stream's registry entry: owner, state and committed offsets.
pub struct AdminStreamArgs {
    #[argh(positional)]
    /// stream name
    pub stream: String,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "transfer")]
/// Ask for a stream to move to another node; prints transfer accepted ... on stderr.
pub struct AdminTransferArgs {
    #[argh(positional)]
    /// stream name
    pub stream: String,

    /// id of the node to move the stream to [env: PICO_TO_NODE]
    #[argh(option, arg_name = "id")]
    pub to_node: i32,

    /// wait (up to 30 s) until the transfer has settled on the target node [env: PICO_WAIT]
    #[argh(switch)]
    pub wait: bool,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "set-slots")]
/// Change a node's placement weight; prints node=<id> slots=<n> on stderr.
pub struct AdminSetSlotsArgs {
    #[argh(positional)]
    /// node id
    pub node: i32,

    /// the new placement weight (0 = place no new streams there) [env: PICO_SLOTS]
    #[argh(option, arg_name = "n")]
    pub slots: u64,
}
