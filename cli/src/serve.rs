//! `pico serve`: flags → `pico_net::ServerConfig`, then the server runs on this thread.

use std::io::Write;

use argh::ArgsInfo;
use pico_client::Protocol;
use pico_net::ServerConfig;

use crate::args::{Cli, ServeArgs};
use crate::serve_config::{Provenance, Source};
use crate::Failure;

/// What `--max-chunk-size 0` means.
const DEFAULT_MAX_CHUNK_SIZE: usize = 64 * 1024;

pub fn run(args: &ServeArgs, protocol: Protocol, provenance: &Provenance) -> Result<(), Failure> {
    let config =
        server_config(args, protocol).map_err(|e| Failure::Usage(provenance.locate(&e)))?;
    if let Some(file) = &args.config_file {
        let (keys, overridden) = provenance.file_counts();
        log::info!(
            "config file {}: {keys} settings, {overridden} of them overridden by flags or PICO_* variables",
            file.display()
        );
    }
    for warning in ignored_flag_warnings(args) {
        log::warn!("{warning}");
    }
    // A panic outside a connection ends the node rather than leaving a dead core serving.
    pico_net::install_panic_hook();
    pico_net::run(config).map_err(|e| Failure::Fatal(e.to_string()))
}

/// `pico serve --print-config`: the settings checked as for a start, then printed as a config
/// file with where each came from; nothing starts.
pub fn print_config(
    args: &ServeArgs,
    protocol: (Protocol, Source),
    provenance: &Provenance,
) -> Result<(), Failure> {
    let config =
        server_config(args, protocol.0).map_err(|e| Failure::Usage(provenance.locate(&e)))?;
    pico_net::check(&config).map_err(|e| Failure::Usage(provenance.locate(&e.to_string())))?;
    for warning in ignored_flag_warnings(args) {
        eprintln!("pico: warning: {warning}");
    }
    let text = crate::serve_config::render(
        &Cli::get_args_info(),
        args,
        (protocol.0.name(), protocol.1),
        provenance,
    );
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// The longest pause between two hand-backs of freed memory (`spawn_memory_return`).
const MEMORY_RETURN_INTERVAL_MAX_MS: u64 = 60_000;

extern "C" {
    /// mimalloc's `void mi_collect(bool force)`: frees what the calling thread's heap can;
    /// `force` also returns memory still kept for reuse.
    fn mi_collect(force: bool);
}

/// Once every core serves, on the main thread: the start's memory goes back, and the thread
/// that returns memory from then on starts. Started here, not before the node runs: this
/// thread blocks the stop signals (`pico_net` waits for them on it), and a thread inherits
/// that. Were it started first, with them unblocked, a SIGTERM that came while the main
/// thread was not waiting (reloading tokens on a SIGHUP, say) could go to it and kill the
/// node on the spot, without its shutdown.
fn on_serving() {
    return_start_memory();
    spawn_memory_return();
}

/// Hands what the start freed back to the operating system, on the main thread once every
/// core serves (`ServerConfig::on_serving`). The main thread loaded the snapshot and built the
/// seeds (about a kilobyte per stream), and the cores freed them as they took their streams;
/// in mimalloc, memory freed by other threads goes back only when its owning thread collects,
/// and the main thread does not allocate again. Without this, a restart of a million streams
/// stays at 675 MiB until the periodic collection a few seconds later brings it to 369 MiB
/// (docs/decisions/2026-12-collect-freed-memory.md).
fn return_start_memory() {
    // SAFETY: `mi_collect` is part of the mimalloc library linked in as the global allocator
    // (`main.rs`); it takes a plain bool and is safe to call from any thread.
    unsafe { mi_collect(true) };
}

/// Hands memory the node freed back to the operating system: 1, 2, 4, ... seconds after the
/// start, then once a minute. mimalloc returns free pages only when the thread that owns them
/// allocates again, after a delay: the snapshot and seeds a restart loads (about a kilobyte
/// per stream, freed as soon as the cores hold their streams) would stay resident in an idle
/// node, 1.5 KiB per stream over 300,000 streams where the streams themselves take under
/// 400 B (docs/decisions/2026-12-collect-freed-memory.md). Early and often right after the
/// start, when that happens; rarely later, so a busy node's reused buffers are not handed back
/// and faulted in again every second.
fn spawn_memory_return() {
    let spawned = std::thread::Builder::new()
        .name("pico-memory".into())
        .spawn(|| {
            let mut pause_ms = 1_000;
            loop {
                std::thread::sleep(std::time::Duration::from_millis(pause_ms));
                // SAFETY: as in `return_start_memory`.
                unsafe { mi_collect(false) };
                pause_ms = (pause_ms * 2).min(MEMORY_RETURN_INTERVAL_MAX_MS);
            }
        });
    if let Err(e) = spawned {
        log::warn!("cannot start the memory-return thread: {e}");
    }
}

pub fn server_config(args: &ServeArgs, protocol: Protocol) -> Result<ServerConfig, String> {
    let size = |value: u64, flag: &str| -> Result<usize, String> {
        usize::try_from(value).map_err(|_| format!("{flag} {value} is too large for this machine"))
    };
    let positive = |value: u64, flag: &str| -> Result<u64, String> {
        if value == 0 {
            Err(format!("{flag} must be greater than 0"))
        } else {
            Ok(value)
        }
    };
    let max_chunk_size = match size(args.max_chunk_size, "--max-chunk-size")? {
        0 => DEFAULT_MAX_CHUNK_SIZE,
        n => n,
    };
    let defaults = ServerConfig::default();
    let optional_size = |value: Option<u64>, flag: &str, default: usize| match value {
        None => Ok(default),
        Some(v) => size(positive(v, flag)?, flag),
    };
    let config = ServerConfig {
        listen: args.listen.clone(),
        ds_listen: second_listener(args, protocol)?,
        node_id: match args.node_id {
            None => None,
            Some(id) if id > 0 => Some(id as u32),
            Some(id) => return Err(format!("--node-id must be a positive integer, got {id}")),
        },
        node_epoch: args.node_epoch,
        http_address: match &args.http_address {
            Some(url) if !(url.starts_with("http://") || url.starts_with("https://")) => {
                return Err(format!(
                    "--http-address must be an http:// or https:// URL, got {url:?}"
                ))
            }
            other => other.as_ref().map(|u| u.trim_end_matches('/').to_string()),
        },
        cluster_id: args.cluster_id.clone().unwrap_or_else(|| "picomq".into()),
        routing_local: args.routing.as_deref() == Some("local"),
        slots: u64::from(args.slots.unwrap_or(1)),
        lease_ms: args.lease_ms,
        protocol,
        admin_listen: (!args.no_admin).then(|| args.admin_listen.clone()),
        meta_url: args.meta_url.clone(),
        storage: args.storage.clone(),
        wal_dir: args.wal_dir.clone(),
        backup_dir: args.backup_dir.clone(),
        cores: args.cores,
        durability: args.durability.unwrap_or(default_durability(args)),
        object_puts_per_second: object_puts_per_second(args)?,
        long_poll_timeout_ms: millis(args.long_poll_timeout_sec),
        sse_max_duration_ms: match millis(args.sse_max_duration_sec) {
            0 => return Err("--sse-max-duration-sec must be greater than 0".into()),
            ms => ms,
        },
        max_chunk_size,
        default_retention: default_retention(args)?,
        catch_up_read_size: match size(args.catch_up_read_size, "--catch-up-read-size")? {
            n if n == 0 || n > pico_engine::limits::CATCH_UP_READ_BYTES_MAX => {
                return Err(format!(
                    "--catch-up-read-size must be between 1 byte and {} MiB, got {n}",
                    pico_engine::limits::CATCH_UP_READ_BYTES_MAX >> 20
                ))
            }
            n => n,
        },
        request_timeout_ms: match millis(args.request_timeout_sec) {
            0 => return Err("--request-timeout-sec must be greater than 0".into()),
            ms => ms,
        },
        send_stall_timeout_ms: match millis(args.send_stall_timeout_sec) {
            0 => return Err("--send-stall-timeout-sec must be greater than 0".into()),
            ms => ms,
        },
        max_body_size: match positive(args.max_body_size, "--max-body-size")? {
            // Record lengths on the wire and on disk are u32 (pico_proto::batch).
            n if n > u64::from(u32::MAX) => {
                return Err(format!(
                    "--max-body-size must be below 4 GiB (records carry 32-bit lengths), got {n}"
                ))
            }
            n => size(n, "--max-body-size")?,
        },
        segment_size: size(
            positive(args.segment_size, "--segment-size")?,
            "--segment-size",
        )?,
        segment_max_age_ms: args.segment_max_age_ms,
        backlog: args.backlog,
        cors_origin: args.cors_origin.clone(),
        gc_interval_ms: positive(args.gc_interval_ms, "--gc-interval-ms")?,
        shutdown_drain_ms: args.shutdown_drain_sec.unwrap_or(0).saturating_mul(1000),
        auth_required: args.auth,
        auth_tokens: args.auth_tokens.clone(),
        insecure_allow_remote: args.insecure_allow_remote,
        webhook_allow_loopback: args.webhook_allow_loopback,
        wal_salvage: args.wal_salvage,
        tls_cert: args.tls_cert.clone(),
        tls_key: args.tls_key.clone(),
        on_serving: Some(on_serving),
        build: crate::BUILD,
        in_flight_bytes_max: optional_size(
            args.max_in_flight_bytes,
            "--max-in-flight-bytes",
            defaults.in_flight_bytes_max,
        )?,
        unsent_bytes_max: optional_size(
            args.max_unsent_bytes,
            "--max-unsent-bytes",
            defaults.unsent_bytes_max,
        )?,
        unuploaded_bytes_max: optional_size(
            args.max_unuploaded_bytes,
            "--max-unuploaded-bytes",
            defaults.unuploaded_bytes_max,
        )?,
        producers_max: args.producers_max.unwrap_or(defaults.producers_max),
        producer_idle_expiry_sec: args
            .producer_idle_expiry_sec
            .unwrap_or(defaults.producer_idle_expiry_sec),
        segment_cache_bytes: optional_size(
            args.block_cache_size,
            "--block-cache-size",
            defaults.segment_cache_bytes,
        )?,
    };
    config.check().map_err(|e| e.to_string())?;
    Ok(config)
}

/// `--ds-listen`: the address given, none for `off`, and by default, beside a Pico `--listen`,
/// Durable Streams on the same host at port 4438 (a node listening on every address serves
/// both protocols there; port 0 when `--listen` takes an ephemeral port, as tests do). A
/// `--protocol ds` node speaks Durable Streams on `--listen` and opens no second listener
/// unless asked.
fn second_listener(args: &ServeArgs, protocol: Protocol) -> Result<Option<String>, String> {
    match args.ds_listen.as_deref() {
        Some("off") => return Ok(None),
        Some(addr) => return Ok(Some(addr.to_string())),
        None if protocol == Protocol::DurableStreams => return Ok(None),
        None => {}
    }
    let (host, port) = args
        .listen
        .rsplit_once(':')
        .ok_or_else(|| format!("--listen {} has no port", args.listen))?;
    let ds_port = match port {
        "0" => 0,
        _ => pico_net::DS_LISTEN_PORT_DEFAULT,
    };
    if ds_port != 0 && port == ds_port.to_string() {
        return Err(format!(
            "--listen {} takes port {ds_port}, where Durable Streams listens by default: \
             give --ds-listen ADDR, or --ds-listen off",
            args.listen
        ));
    }
    Ok(Some(format!("{host}:{ds_port}")))
}

/// Whether the node joins a cluster (its metadata log is Postgres).
fn clustered(args: &ServeArgs) -> bool {
    args.meta_url.starts_with("postgres://") || args.meta_url.starts_with("postgresql://")
}

/// `--durability` when not given. An object store is the home of the data, and in a cluster
/// it is the only copy another node can take a stream over from: an append is acknowledged
/// once it is there (a failover then loses nothing acknowledged). A single node on a local
/// directory gains nothing from that wait.
fn default_durability(args: &ServeArgs) -> pico_net::Durability {
    if clustered(args) || args.storage.contains("@s3://") {
        pico_net::Durability::Object
    } else {
        pico_net::Durability::Local
    }
}

/// `--object-puts-per-second`, or the cap an `--object-flush-ms` of earlier scripts stands
/// for: one flush per N ms at most, so 1000/N PUTs per second, never more.
fn object_puts_per_second(args: &ServeArgs) -> Result<u32, String> {
    match (args.object_puts_per_second, args.object_flush_ms) {
        (Some(_), Some(_)) => Err(
            "--object-flush-ms and --object-puts-per-second set the same \
             budget; give only --object-puts-per-second"
                .into(),
        ),
        (Some(n), None) => Ok(n),
        (None, None) => Ok(pico_engine::limits::OBJECT_PUTS_PER_SECOND_DEFAULT),
        (None, Some(ms)) if (1..=1000).contains(&ms) => Ok((1000 / ms) as u32),
        (None, Some(ms)) => Err(format!(
            "--object-flush-ms must be between 1 and 1000 (at most 1000/N PUTs per second), \
             got {ms}; --object-puts-per-second 1 is the smallest budget"
        )),
    }
}

/// Seconds (already checked finite and bounded by the parser) to whole milliseconds.
fn millis(secs: f64) -> u64 {
    (secs * 1000.0).round() as u64
}

/// One warning line per flag that was given but does nothing here: accepted rather than
/// refused, so a command line written for another setup still starts.
pub fn ignored_flag_warnings(args: &ServeArgs) -> Vec<String> {
    let single_node = "has no effect: only a node on a postgres:// --meta-url joins a cluster";
    let clustered = clustered(args);
    let given = [
        (
            "--node-epoch",
            args.node_epoch.is_some() && !clustered,
            single_node,
        ),
        (
            "--http-address",
            args.http_address.is_some() && !clustered,
            single_node,
        ),
        (
            "--routing",
            args.routing.is_some() && !clustered,
            single_node,
        ),
        ("--slots", args.slots.is_some() && !clustered, single_node),
        (
            "--wal",
            args.wal.is_some(),
            "has no effect: the WAL is local, see --wal-dir",
        ),
        (
            "--wal-cache-size",
            args.wal_cache_size.is_some(),
            "has no effect: uploaded segments are cached per --block-cache-size",
        ),
        (
            "--wal-upload-threshold",
            args.wal_upload_threshold.is_some(),
            "has no effect; the closest equivalent is --segment-size",
        ),
        (
            "--object-flush-ms",
            args.object_flush_ms.is_some(),
            "is superseded: flushes go as soon as the previous PUT is done, within \
             --object-puts-per-second, which this value sets to 1000/N",
        ),
        (
            "--wal-upload-interval-ms",
            args.wal_upload_interval_ms.is_some(),
            "has no effect; the closest equivalent is --segment-max-age-ms",
        ),
    ];
    let mut warnings: Vec<String> = given
        .into_iter()
        .filter(|(_, present, _)| *present)
        .map(|(flag, _, why)| format!("{flag} {why}"))
        .collect();
    if clustered && args.durability == Some(pico_net::Durability::Local) {
        warnings.push(
            "--durability local in a cluster: an append is acknowledged once it is in this \
             node's WAL, which no other node can read; if this node is lost, the node that \
             takes its streams over serves them without the appends not yet in the bucket \
             (up to --segment-max-age-ms of them). --durability object (the cluster default) \
             loses none"
                .to_string(),
        );
    }
    warnings
}

/// `--default-retention-*`: each limit, checked against what a stream may have (0: off).
fn default_retention(args: &ServeArgs) -> Result<pico_engine::meta::Retention, String> {
    use pico_engine::limits::{retention_bytes, retention_secs};
    let limit = |policy: fn(u64) -> Result<Option<u64>, u64>, value: u64, flag: &str| {
        policy(value).map_err(|max| format!("{flag} must be at most {max}, got {value}"))
    };
    Ok(pico_engine::meta::Retention {
        age_ms: limit(
            retention_secs,
            args.default_retention_age,
            "--default-retention-age (seconds)",
        )?,
        bytes: limit(
            retention_bytes,
            args.default_retention_bytes,
            "--default-retention-bytes",
        )?,
        delete_on_empty_ms: limit(
            retention_secs,
            args.default_delete_on_empty,
            "--default-delete-on-empty (seconds)",
        )?,
    })
}

#[cfg(test)]
mod tests {
    use argh::FromArgs;

    use super::*;
    use crate::args::{Cli, Command};

    fn serve_args(args: &[&str]) -> ServeArgs {
        let mut all = vec!["serve"];
        all.extend_from_slice(args);
        match Cli::from_args(&["pico"], &all).unwrap().command {
            Command::Serve(s) => s,
            _ => unreachable!("the first word is serve"),
        }
    }

    #[test]
    fn defaults_match_the_server_defaults() {
        let config = server_config(&serve_args(&[]), Protocol::Pico).unwrap();
        // What `pico serve` adds to a library default: freed memory handed back.
        assert!(config.on_serving.is_some());
        let expected = ServerConfig {
            on_serving: config.on_serving,
            build: crate::BUILD,
            ..ServerConfig::default()
        };
        assert_eq!(format!("{config:?}"), format!("{expected:?}"));
    }

    #[test]
    fn flags_map_onto_the_config() {
        let args = serve_args(&[
            "--listen",
            "0.0.0.0:1",
            "--no-admin",
            "--cores",
            "2",
            "--durability",
            "memory",
            "--long-poll-timeout-sec",
            "1",
            "--max-chunk-size",
            "0",
            "--max-body-size",
            "1MiB",
            "--segment-size",
            "65536",
            "--segment-max-age-ms",
            "10",
            "--backlog",
            "8",
            "--wal-dir",
            "/tmp/w",
            "--webhook-allow-loopback",
            "--send-stall-timeout-sec",
            "2.5",
            "--max-unsent-bytes",
            "8MiB",
        ]);
        let config = server_config(&args, Protocol::DurableStreams).unwrap();
        assert!(config.webhook_allow_loopback);
        assert_eq!(config.listen, "0.0.0.0:1");
        assert_eq!(config.admin_listen, None);
        assert_eq!(config.protocol, pico_net::Protocol::DurableStreams);
        assert_eq!(config.cores, 2);
        assert_eq!(config.durability, pico_net::Durability::Memory);
        assert_eq!(config.long_poll_timeout_ms, 1000);
        assert_eq!(config.max_chunk_size, 64 * 1024);
        assert_eq!(config.max_body_size, 1 << 20);
        assert_eq!(config.segment_size, 65536);
        assert_eq!(config.segment_max_age_ms, 10);
        assert_eq!(config.backlog, 8);
        assert_eq!(config.wal_dir, std::path::PathBuf::from("/tmp/w"));
        assert_eq!(config.send_stall_timeout_ms, 2500);
        assert_eq!(config.unsent_bytes_max, 8 << 20);
    }

    /// Durable Streams is served by default beside a Pico `--listen`, on its host
    /// at port 4438 (an ephemeral port beside an ephemeral one), `off` turns it off, and a
    /// `--protocol ds` node opens no second listener unless asked.
    #[test]
    fn durable_streams_listens_beside_the_pico_listener_by_default() {
        let second = |flags: &[&str], protocol| {
            server_config(&serve_args(flags), protocol).map(|c| c.ds_listen)
        };
        let pico = Protocol::Pico;
        assert_eq!(second(&[], pico), Ok(Some("127.0.0.1:4438".into())));
        let everywhere = ["--listen", "0.0.0.0:4437"];
        assert_eq!(second(&everywhere, pico), Ok(Some("0.0.0.0:4438".into())));
        let v6 = ["--listen", "[::1]:7000"];
        assert_eq!(second(&v6, pico), Ok(Some("[::1]:4438".into())));
        let ephemeral = ["--listen", "127.0.0.1:0"];
        assert_eq!(second(&ephemeral, pico), Ok(Some("127.0.0.1:0".into())));
        assert_eq!(second(&["--ds-listen", "off"], pico), Ok(None));
        let given = ["--ds-listen", "10.0.0.1:80"];
        assert_eq!(second(&given, pico), Ok(Some("10.0.0.1:80".into())));
        assert_eq!(second(&[], Protocol::DurableStreams), Ok(None));
        let pico_beside = ["--ds-listen", "127.0.0.1:4436"];
        assert_eq!(
            second(&pico_beside, Protocol::DurableStreams),
            Ok(Some("127.0.0.1:4436".into()))
        );
        let clash = second(&["--listen", "127.0.0.1:4438"], pico).unwrap_err();
        assert!(clash.contains("--ds-listen off"), "{clash}");
        let same = ["--listen", "127.0.0.1:5", "--ds-listen", "127.0.0.1:5"];
        let err = second(&same, pico).unwrap_err();
        assert!(
            err.starts_with("--listen and --ds-listen are both"),
            "{err}"
        );
        let mut all = vec!["serve", "--ds-listen", "of"];
        assert!(Cli::from_args(&["pico"], &all).is_err());
        all[2] = "OFF";
        assert!(Cli::from_args(&["pico"], &all).is_ok());
    }

    #[test]
    fn a_cluster_acknowledges_from_the_bucket_unless_told_otherwise() {
        let durability = |flags: &[&str]| {
            server_config(&serve_args(flags), Protocol::Pico)
                .unwrap()
                .durability
        };
        let pg = ["--meta-url", "postgres://u@127.0.0.1/db"];
        assert_eq!(durability(&pg), pico_net::Durability::Object);
        assert_eq!(durability(&[]), pico_net::Durability::Local);
        let s3 = ["--storage", "-2@s3://bucket"];
        assert_eq!(durability(&s3), pico_net::Durability::Object);
        // Asked for, local stays local in a cluster, with a warning saying what it risks.
        let local = [&pg[..], &["--durability", "local"]].concat();
        assert_eq!(durability(&local), pico_net::Durability::Local);
        let warnings = ignored_flag_warnings(&serve_args(&local));
        assert!(
            warnings
                .iter()
                .any(|w| w.starts_with("--durability local in a cluster")),
            "{warnings:?}"
        );
        assert!(ignored_flag_warnings(&serve_args(&pg)).is_empty());
        let single_local = ignored_flag_warnings(&serve_args(&["--durability", "local"]));
        assert!(single_local.is_empty(), "{single_local:?}");
    }

    #[test]
    fn values_out_of_range_are_refused() {
        let err =
            server_config(&serve_args(&["--max-body-size", "4GiB"]), Protocol::Pico).unwrap_err();
        assert!(
            err.starts_with("--max-body-size must be below 4 GiB"),
            "{err}"
        );
        let err =
            server_config(&serve_args(&["--segment-size", "4KiB"]), Protocol::Pico).unwrap_err();
        assert_eq!(err, "--segment-size must be at least 64 KiB, got 4096");
        let err = server_config(&serve_args(&["--lease-ms", "299"]), Protocol::Pico).unwrap_err();
        assert_eq!(err, "--lease-ms must be at least 300, got 299");
        let err = server_config(&serve_args(&["--segment-size", "0"]), Protocol::Pico).unwrap_err();
        assert_eq!(err, "--segment-size must be greater than 0");
        let flag = "--segment-max-age-ms";
        let err = server_config(&serve_args(&[flag, "0"]), Protocol::Pico).unwrap_err();
        assert_eq!(err, format!("{flag} must be greater than 0"));
        let err = server_config(&serve_args(&[flag, "9"]), Protocol::Pico).unwrap_err();
        assert_eq!(err, format!("{flag} must be at least 10, got 9"));
        for puts in ["0", "3501"] {
            let args = serve_args(&["--object-puts-per-second", puts]);
            let err = server_config(&args, Protocol::Pico).unwrap_err();
            assert_eq!(
                err,
                format!("--object-puts-per-second must be between 1 and 3500, got {puts}")
            );
        }
        for ms in ["0", "1001"] {
            let args = serve_args(&["--object-flush-ms", ms]);
            let err = server_config(&args, Protocol::Pico).unwrap_err();
            assert!(
                err.starts_with(&format!(
                    "--object-flush-ms must be between 1 and 1000 (at most 1000/N PUTs per \
                     second), got {ms}"
                )),
                "{err}"
            );
        }
        let err =
            server_config(&serve_args(&["--gc-interval-ms", "99"]), Protocol::Pico).unwrap_err();
        assert_eq!(err, "--gc-interval-ms must be at least 100, got 99");
    }

    #[test]
    fn an_object_flush_interval_of_earlier_scripts_becomes_the_put_budget() {
        let puts = |args: &[&str]| {
            server_config(&serve_args(args), Protocol::Pico).map(|c| c.object_puts_per_second)
        };
        assert_eq!(
            puts(&[]),
            Ok(pico_engine::limits::OBJECT_PUTS_PER_SECOND_DEFAULT)
        );
        assert_eq!(puts(&["--object-puts-per-second", "80"]), Ok(80));
        // `--object-flush-ms N` promises at most one flush per N ms: 1000/N PUTs per second.
        assert_eq!(puts(&["--object-flush-ms", "20"]), Ok(50));
        assert_eq!(puts(&["--object-flush-ms", "1000"]), Ok(1));
        let both = puts(&["--object-flush-ms", "20", "--object-puts-per-second", "80"]);
        assert!(both
            .unwrap_err()
            .contains("give only --object-puts-per-second"));
        let warnings = ignored_flag_warnings(&serve_args(&["--object-flush-ms", "20"]));
        assert!(
            warnings
                .iter()
                .any(|w| w.starts_with("--object-flush-ms is superseded")),
            "{warnings:?}"
        );
    }

    #[test]
    fn bad_values_are_argh_errors() {
        for args in [
            ["--durability", "disk"],
            ["--listen", "4437"],
            ["--max-body-size", "lots"],
            ["--routing", "random"],
            ["--cores", "-1"],
        ] {
            let mut all = vec!["serve"];
            all.extend_from_slice(&args);
            assert!(Cli::from_args(&["pico"], &all).is_err(), "{args:?}");
        }
    }

    #[test]
    fn reference_flags_are_accepted_with_a_warning() {
        let args = serve_args(&[
            "--node-id",
            "3",
            "--wal",
            "-3@file://./objects",
            "--wal-cache-size",
            "200MiB",
            "--routing",
            "local",
        ]);
        let warnings = ignored_flag_warnings(&args);
        assert_eq!(warnings.len(), 3, "{warnings:?}");
        assert!(warnings[0].starts_with("--routing "), "{warnings:?}");
        // --node-id has an effect: it names this node's segment keys.
        assert_eq!(
            server_config(&args, Protocol::Pico).unwrap().node_id,
            Some(3)
        );
        assert!(ignored_flag_warnings(&serve_args(&[])).is_empty());
    }
}
