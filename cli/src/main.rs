//! `pico`: the PicoMQ server (`pico serve`) and command-line client.
//!
//! Flow: argv → `argv::normalize` (global flags, `-`-values, `PICO_*` variables) → for `serve`,
//! its `--config-file` (`serve_config`) → argh → profile resolution for the connection flags →
//! the command. Exit codes: 0 success, 1 fatal error (`pico: <message>` on stderr), 2 usage
//! error (a bad config file included).

/// Every core allocates and frees per request (h2 header maps, response buffers): mimalloc's
/// per-thread free lists serve that faster than glibc's malloc
/// (docs/decisions/2026-12-mimalloc.md).
#[global_allocator]
static ALLOCATOR: Allocator = Allocator;

/// mimalloc, asked through its plain `mi_malloc` family for the layouts every one of its
/// blocks meets (alignment at most 8), and through the aligned family, as the `mimalloc`
/// crate asks for all of them, otherwise.
///
/// Why not the crate's allocator alone: when `mi_malloc_aligned` misses its fast path (a
/// block over 1 KiB, or a size class whose free list must be refilled), it serves a size that
/// is not a power of two by over-allocating (`size + alignment - 1`, from the next size class,
/// through the slow path) rather than by `mi_malloc`. That was 3.8 of the 27 allocations of a
/// small HTTP/1.1 append, and 4 % of its instructions (docs/decisions/2026-12-mimalloc.md).
struct Allocator;

/// Every mimalloc block is aligned to at least a word: its smallest size class is one word,
/// and its pages start aligned.
const PLAIN_ALIGN_MAX: usize = 8;

extern "C" {
    /// mimalloc's `void* mi_malloc(size_t size)`.
    fn mi_malloc(size: usize) -> *mut std::ffi::c_void;
    /// mimalloc's `void* mi_zalloc(size_t size)`.
    fn mi_zalloc(size: usize) -> *mut std::ffi::c_void;
    /// mimalloc's `void* mi_realloc(void* p, size_t newsize)`.
    fn mi_realloc(p: *mut std::ffi::c_void, newsize: usize) -> *mut std::ffi::c_void;
}

// SAFETY: each method forwards to mimalloc, which returns blocks of at least the asked size
// or null. A layout whose alignment is at most `PLAIN_ALIGN_MAX` gets a plain block (always
// word-aligned); a larger alignment goes to `mimalloc::MiMalloc` (the aligned family).
// `mi_free` frees blocks of either family, and a reallocation keeps the family its layout's
// alignment chose when the block was allocated.
unsafe impl std::alloc::GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        if layout.align() <= PLAIN_ALIGN_MAX {
            // SAFETY: see the impl.
            unsafe { mi_malloc(layout.size()).cast() }
        } else {
            // SAFETY: the caller's contract, passed on.
            unsafe { mimalloc::MiMalloc.alloc(layout) }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        if layout.align() <= PLAIN_ALIGN_MAX {
            // SAFETY: see the impl.
            unsafe { mi_zalloc(layout.size()).cast() }
        } else {
            // SAFETY: the caller's contract, passed on.
            unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: `ptr` came from this allocator; mimalloc frees both families alike.
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= PLAIN_ALIGN_MAX {
            // SAFETY: `ptr` is a live block of this allocator; the new one is word-aligned.
            unsafe { mi_realloc(ptr.cast(), new_size).cast() }
        } else {
            // SAFETY: the caller's contract, passed on.
            unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
        }
    }
}

// First, so that its print macros replace std's in every module below.
#[macro_use]
mod output;
mod admin;
mod append;
mod args;
mod argv;
mod cert;
mod commands;
mod config;
mod consume;
mod logger;
mod profile;
mod progress;
mod serve;
mod serve_config;
mod serve_help;

use std::process::ExitCode;

use argh::{ArgsInfo, FromArgs};
use pico_client::{Client, ClientConfig, Protocol};

use crate::args::{Cli, Command, DEFAULT_ENDPOINT};

/// The release and the commit this binary was built from (`build.rs`).
pub const BUILD: pico_net::BuildInfo = pico_net::BuildInfo {
    version: env!("CARGO_PKG_VERSION"),
    commit: env!("PICO_GIT_COMMIT"),
};

/// `pico --version`: one line, also what `pico -V` prints.
fn version_line() -> String {
    format!("pico {} (commit {})", BUILD.version, BUILD.commit)
}

/// How a command failed, which decides the message and the exit code.
#[derive(Debug)]
pub enum Failure {
    /// Bad command line: exit 2.
    Usage(String),
    /// Anything else: `pico: <message>`, exit 1.
    Fatal(String),
    /// No HTTP answer from the server (refused, unresolvable, TLS mismatch, ...): exit 1, with
    /// what to check and where the endpoint came from added by `run` (`unreachable`).
    Unreachable(String),
    /// stdout was closed by its reader (`pico read ... | head`): not an error.
    BrokenPipe,
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Failure {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            Failure::BrokenPipe
        } else {
            Failure::Fatal(e.to_string())
        }
    }
}

fn main() -> ExitCode {
    let (cli, provenance) = match parse_command_line() {
        Ok(parsed) => parsed,
        Err(code) => return code,
    };
    match run(cli, &provenance) {
        Ok(()) | Err(Failure::BrokenPipe) => ExitCode::SUCCESS,
        Err(Failure::Usage(message)) => {
            eprintln!("pico: {message}");
            ExitCode::from(2)
        }
        Err(Failure::Fatal(message) | Failure::Unreachable(message)) => {
            eprintln!("pico: {message}");
            ExitCode::FAILURE
        }
    }
}

extern "C" {
    /// mimalloc's `void mi_option_set(mi_option_t option, long value)`.
    fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
    /// mimalloc's `long mi_option_get(mi_option_t option)`.
    #[cfg(test)]
    fn mi_option_get(option: std::ffi::c_int) -> std::ffi::c_long;
}

/// `mi_option_arena_eager_commit` in mimalloc's `mi_option_t` (`mimalloc.h`, v2 and v3 alike).
const MI_OPTION_ARENA_EAGER_COMMIT: std::ffi::c_int = 4;

/// mimalloc commits its arenas whole by default on Linux (overcommit is on), and then hands
/// freed pages back with `MADV_FREE`: the kernel takes them only under memory pressure, so
/// they stay in the node's RSS. Committed on demand instead, freed pages are decommitted and
/// leave the RSS: 10,000 parked SSE subscribers grow it by about their heap, 0.45 KiB each,
/// where eager arenas kept 1.0-1.7 KiB (docs/decisions/2026-12-mimalloc.md).
///
/// The option applies to arenas reserved after it is set, and the first is reserved by the
/// first allocation, before `main`: so it is set by an initializer the loader runs before
/// Rust's runtime starts (`.init_array`), which allocates nothing.
extern "C" fn commit_memory_on_demand() {
    // SAFETY: a plain setter of the allocator linked in as the global allocator (above),
    // callable before any allocation.
    unsafe { mi_option_set(MI_OPTION_ARENA_EAGER_COMMIT, 0) };
}

// SAFETY: `.init_array` takes pointers to `extern "C" fn()` that the loader calls once at
// start; this one only sets an allocator option.
#[used]
#[unsafe(link_section = ".init_array")]
static COMMIT_MEMORY_ON_DEMAND: extern "C" fn() = commit_memory_on_demand;

/// argv → `Cli` and where serve's flags came from, or the exit code after printing help (0)
/// or a usage error (2), a bad config file included.
fn parse_command_line() -> Result<(Cli, serve_config::Provenance), ExitCode> {
    let mut args = Vec::new();
    for arg in std::env::args_os().skip(1) {
        match arg.into_string() {
            Ok(arg) => args.push(arg),
            Err(arg) => {
                eprintln!(
                    "pico: argument is not valid UTF-8: {}",
                    arg.to_string_lossy()
                );
                return Err(ExitCode::from(2));
            }
        }
    }
    // argh has no version flag: answered before it parses, as the only word.
    if let [only] = args.as_slice() {
        if only == "--version" || only == "-V" {
            println!("{}", version_line());
            return Err(ExitCode::SUCCESS);
        }
    }
    let env = |name: &str| std::env::var(name).ok();
    let info = Cli::get_args_info();
    let mut normalized = match argv::normalize(&info, &args, &env) {
        Ok(normalized) => normalized,
        Err(error) => {
            eprintln!("pico: {}", error.message);
            print_usage_hint(&error.command_path);
            return Err(ExitCode::from(2));
        }
    };
    let mut provenance = serve_config::Provenance::default();
    if normalized.command_path == ["serve"] && !normalized.help {
        provenance = serve_config::apply(&info, &mut normalized).map_err(|message| {
            eprintln!("pico: {message}");
            ExitCode::from(2)
        })?;
    }
    let words: Vec<&str> = normalized.args.iter().map(String::as_str).collect();
    let cli = Cli::from_args(&["pico"], &words).map_err(|early_exit| match early_exit.status {
        Ok(()) => {
            if normalized.command_path == ["serve"] {
                println!("{}", serve_help::regroup(&early_exit.output));
            } else {
                println!("{}", early_exit.output);
            }
            ExitCode::SUCCESS
        }
        Err(()) => {
            eprint!("pico: {}", early_exit.output);
            if !early_exit.output.ends_with('\n') {
                eprintln!();
            }
            print_usage_hint(&normalized.command_path);
            ExitCode::from(2)
        }
    })?;
    Ok((cli, provenance))
}

/// The `Usage:` line of the command (argh's own text) and where to get more.
fn print_usage_hint(command_path: &[String]) {
    let mut words: Vec<&str> = command_path.iter().map(String::as_str).collect();
    words.push("--help");
    if let Err(help) = Cli::from_args(&["pico"], &words) {
        if let Some(usage) = help.output.lines().find(|l| l.starts_with("Usage:")) {
            eprintln!("{usage}");
        }
    }
    let path: String = command_path.iter().map(|w| format!(" {w}")).collect();
    eprintln!("Run pico{path} --help for more information.");
}

fn run(cli: Cli, provenance: &serve_config::Provenance) -> Result<(), Failure> {
    // `config` edits the file the profiles come from: it must work even if the file is
    // broken or names a missing profile, so it does not resolve one.
    if let Command::Config(args) = &cli.command {
        return config::run(&cli, args);
    }
    if let Command::Cert(args) = &cli.command {
        return cert::run(args);
    }
    // Admin commands talk to the admin listener, which no profile describes (README.md,
    // "Admin commands").
    if let Command::Admin(args) = &cli.command {
        let ca_cert = read_ca_cert(cli.ca_cert.as_deref())?;
        return admin::run(args, cli.token.as_deref(), ca_cert.as_deref());
    }
    // Flag and environment are already in `cli`; the profile comes next, then the defaults.
    let resolved = profile::resolve(cli.profile.as_deref()).map_err(Failure::Fatal)?;
    let profile = resolved.profile.clone();
    let protocol = cli.protocol.or(profile.protocol).unwrap_or(Protocol::Pico);
    if let Command::Serve(args) = &cli.command {
        let protocol_source = match (provenance.source("--protocol"), &resolved.name) {
            (serve_config::Source::Default, Some(name)) if profile.protocol.is_some() => {
                serve_config::Source::Profile(name.clone())
            }
            (source, _) => source,
        };
        if args.print_config {
            return serve::print_config(args, (protocol, protocol_source), provenance);
        }
        logger::init(args.log_format);
        return serve::run(args, protocol, provenance);
    }

    let source = EndpointSource::of(&cli, &resolved);
    let endpoint = cli
        .endpoint
        .clone()
        .or(profile.endpoint)
        .unwrap_or_else(|| DEFAULT_ENDPOINT.into());
    let mut config = ClientConfig::new(endpoint.clone());
    config.protocol = protocol;
    // A profile can only turn http2 on: a bare switch cannot say "off".
    config.http2_prior_knowledge = cli.http2 || profile.http2 == Some(true);
    config.token = cli.token.clone().or(profile.token);
    config.ca_cert_pem = read_ca_cert(cli.ca_cert.as_deref().or(profile.ca_cert.as_deref()))?;
    let explain = |failure: Failure| match failure {
        Failure::Unreachable(message) => Failure::Fatal(unreachable(&message, &endpoint, &source)),
        other => other,
    };
    if let Command::Bench(args) = &cli.command {
        return bench(args, &config).map_err(explain);
    }
    let client = Client::new(config).map_err(|e| Failure::Usage(e.to_string()))?;

    // Client commands make one request at a time: a single-threaded runtime is enough.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::Fatal(format!("cannot start the async runtime: {e}")))?;
    let result = runtime.block_on(async {
        match &cli.command {
            Command::Serve(_)
            | Command::Config(_)
            | Command::Bench(_)
            | Command::Admin(_)
            | Command::Cert(_) => {
                unreachable!("handled above")
            }
            Command::Create(args) => commands::create(&client, args).await,
            Command::Head(args) => commands::head(&client, args).await,
            Command::Append(args) => append::append(&client, args).await,
            Command::Read(args) => commands::read(&client, args).await,
            Command::Tail(args) => commands::tail(&client, args).await,
            Command::Consume(args) => consume::consume(&client, args).await,
            Command::Ls(args) => commands::ls(&client, args).await,
            Command::Close(args) => commands::close(&client, args).await,
            Command::Delete(args) => commands::delete(&client, args).await,
            Command::Trim(args) => commands::trim(&client, args).await,
            Command::Retention(args) => commands::retention(&client, args).await,
        }
    });
    result.map_err(explain)
}

/// Where a client command's endpoint came from, to name it when the server cannot be reached.
enum EndpointSource {
    /// `--endpoint` or `PICO_ENDPOINT`.
    Given,
    /// A saved profile: its name, and whether it was the default one (no `--profile`).
    Profile { name: String, by_default: bool },
    /// The built-in default.
    BuiltIn,
}

impl EndpointSource {
    fn of(cli: &Cli, resolved: &profile::Resolved) -> EndpointSource {
        match (&cli.endpoint, &resolved.name, &resolved.profile.endpoint) {
            (Some(_), _, _) => EndpointSource::Given,
            (None, Some(name), Some(_)) => EndpointSource::Profile {
                name: name.clone(),
                by_default: resolved.by_default,
            },
            _ => EndpointSource::BuiltIn,
        }
    }
}

/// A transport error made useful: what it likely means and what to do (a refused connection,
/// plain HTTP to a TLS listener and the reverse), then where the endpoint came from, naming
/// the profile (README.md, "Use it").
fn unreachable(message: &str, endpoint: &str, source: &EndpointSource) -> String {
    let lower = message.to_ascii_lowercase();
    let https = endpoint.starts_with("https://");
    let advice = if lower.contains("connection refused") {
        format!("is `pico serve` running at {endpoint}? (nothing accepts connections there)")
    } else if https
        && (lower.contains("invalidcontenttype")
            || lower.contains("corrupt message")
            || lower.contains("wrong version number")
            || lower.contains("record overflow"))
    {
        format!(
            "{endpoint} answered in plain HTTP, not TLS: use http://{}",
            endpoint.trim_start_matches("https://")
        )
    } else if !https
        && (lower.contains("connection closed before message completed")
            || lower.contains("invalid http version")
            || lower.contains("connection reset")
            || lower.contains("unexpected eof")
            || lower.contains("incompletemessage"))
    {
        format!(
            "if the node serves TLS (pico serve --tls-cert), use https://{}",
            endpoint.trim_start_matches("http://")
        )
    } else if lower.contains("dns error") || lower.contains("failed to lookup") {
        format!("the host of {endpoint} does not resolve")
    } else {
        String::new()
    };
    let origin = match source {
        EndpointSource::Given => "--endpoint (or PICO_ENDPOINT)".to_string(),
        EndpointSource::Profile { name, by_default } => format!(
            "profile {name:?}{}; another with --profile NAME or --endpoint URL, \
             the list with pico config ls",
            if *by_default {
                ", the default profile"
            } else {
                ""
            }
        ),
        EndpointSource::BuiltIn => "the built-in default; another with --endpoint URL".to_string(),
    };
    let mut text = format!("cannot reach {endpoint}: {message}");
    if !advice.is_empty() {
        text.push_str(&format!("; {advice}"));
    }
    text.push_str(&format!(" [endpoint from {origin}]"));
    text
}

/// The PEM of `--ca-cert`, if given.
fn read_ca_cert(path: Option<&std::path::Path>) -> Result<Option<Vec<u8>>, Failure> {
    let Some(path) = path else {
        return Ok(None);
    };
    std::fs::read(path)
        .map(Some)
        .map_err(|e| Failure::Fatal(format!("cannot read --ca-cert {}: {e}", path.display())))
}

/// `pico bench`: the load generator runs on its own multi-threaded runtime (the client
/// commands' single-threaded one would cap it at one core).
fn bench(args: &pico_bench::BenchArgs, config: &ClientConfig) -> Result<(), Failure> {
    args.validate().map_err(Failure::Usage)?;
    let connection = pico_bench::Connection {
        endpoint: config.endpoint.clone(),
        protocol: config.protocol,
        http2: config.http2_prior_knowledge,
        token: config.token.clone(),
        ca_cert_pem: config.ca_cert_pem.clone(),
    };
    let summary = pico_bench::run_blocking(args, &connection).map_err(Failure::Fatal)?;
    match args.output {
        pico_bench::Output::Text => summary.print_text(),
        pico_bench::Output::Json => println!("{}", summary.to_json()),
    }
    Ok(())
}

#[cfg(test)]
mod allocator_tests {
    /// The initializer ran before anything allocated: the arenas are committed on demand
    /// (mimalloc's default is 2, "eagerly where the system overcommits").
    #[test]
    fn arenas_are_committed_on_demand() {
        // SAFETY: a plain getter of the allocator linked in as the global allocator.
        let eager = unsafe { super::mi_option_get(super::MI_OPTION_ARENA_EAGER_COMMIT) };
        assert_eq!(eager, 0);
    }

    /// Every layout gets a block aligned as asked that holds its bytes through growing and
    /// shrinking, through both of mimalloc's families (plain up to a word's alignment, aligned
    /// above), and zeroed allocations are zero.
    #[test]
    fn blocks_meet_their_layouts_through_both_families() {
        use std::alloc::{GlobalAlloc, Layout};
        let allocator = super::Allocator;
        for align in [1usize, 2, 4, 8, 16, 32, 64, 128, 4096] {
            for size in [
                1usize, 7, 8, 24, 40, 96, 100, 1000, 1304, 1784, 5000, 70_000,
            ] {
                let size = size.next_multiple_of(align);
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: a non-zero size; every block is freed with its layout below.
                unsafe {
                    let zeroed = allocator.alloc_zeroed(layout);
                    assert!(!zeroed.is_null());
                    assert_eq!(zeroed as usize % align, 0, "zeroed {size} aligned {align}");
                    assert!(std::slice::from_raw_parts(zeroed, size)
                        .iter()
                        .all(|&b| b == 0));
                    allocator.dealloc(zeroed, layout);

                    let block = allocator.alloc(layout);
                    assert_eq!(block as usize % align, 0, "{size} aligned {align}");
                    for i in 0..size {
                        *block.add(i) = i as u8;
                    }
                    let grown_size = size * 3;
                    let grown = allocator.realloc(block, layout, grown_size);
                    assert_eq!(grown as usize % align, 0, "{size} grown, aligned {align}");
                    for i in 0..size {
                        assert_eq!(*grown.add(i), i as u8, "{size} grown, aligned {align}");
                    }
                    let shrunk_size = size.div_ceil(2).next_multiple_of(align);
                    let grown_layout = Layout::from_size_align(grown_size, align).unwrap();
                    let shrunk = allocator.realloc(grown, grown_layout, shrunk_size);
                    assert_eq!(shrunk as usize % align, 0, "{size} shrunk, aligned {align}");
                    for i in 0..shrunk_size.min(size) {
                        assert_eq!(*shrunk.add(i), i as u8, "{size} shrunk, aligned {align}");
                    }
                    allocator.dealloc(shrunk, Layout::from_size_align(shrunk_size, align).unwrap());
                }
            }
        }
    }
}
