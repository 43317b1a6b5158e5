//! The `bench` subcommand's flags; their doc text is what `pico bench --help` prints.
//!
//! Every flag's doc text ends with `[env: PICO_<FLAG>]`: the CLI maps environment variables
//! generically from the flag names. Defaults are written in the doc text because argh does
//! not print them.

use argh::{ArgsInfo, FromArgs};

/// Where the summary goes: text on stderr, or one JSON object on stdout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Output {
    #[default]
    Text,
    Json,
}

impl std::str::FromStr for Output {
    type Err = String;

    fn from_str(s: &str) -> Result<Output, String> {
        match s.to_ascii_lowercase().as_str() {
            "text" => Ok(Output::Text),
            "json" => Ok(Output::Json),
            _ => Err(format!("unknown output {s:?}: expected text or json")),
        }
    }
}

/// How the `--live-latency` reader follows the stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LiveMode {
    /// `live=long-poll` with `format=binary`.
    LongPoll,
    /// `live=sse` (records arrive as JSON `data` events).
    #[default]
    Sse,
}

impl LiveMode {
    pub fn name(self) -> &'static str {
        match self {
            LiveMode::LongPoll => "long-poll",
            LiveMode::Sse => "sse",
        }
    }
}

impl std::str::FromStr for LiveMode {
    type Err = String;

    fn from_str(s: &str) -> Result<LiveMode, String> {
        match s.to_ascii_lowercase().as_str() {
            "long-poll" | "longpoll" => Ok(LiveMode::LongPoll),
            "sse" => Ok(LiveMode::Sse),
            _ => Err(format!(
                "unknown live mode {s:?}: expected long-poll or sse"
            )),
        }
    }
}

#[derive(FromArgs, ArgsInfo, Debug, Clone, PartialEq)]
#[argh(
    subcommand,
    name = "bench",
    description = "Load-test a server: create temporary streams, run writers (and one reader per stream) for a fixed time, report throughput and latency."
)]
pub struct BenchArgs {
    /// record size in bytes (default 1024) [env: PICO_RECORD_SIZE]
    #[argh(option, short = 'b', arg_name = "bytes", default = "1024")]
    pub record_size: usize,

    /// measured seconds, at least 1 (default 15) [env: PICO_DURATION]
    #[argh(option, short = 'd', arg_name = "secs", default = "15")]
    pub duration: u64,

    /// concurrent writer tasks, each with one request outstanding (default 32) [env: PICO_IN_FLIGHT]
    #[argh(option, short = 'w', arg_name = "n", default = "32")]
    pub in_flight: usize,

    /// records per append request: one Pico binary batch, or a Durable Streams JSON array (default 1) [env: PICO_BATCH]
    #[argh(option, short = 'n', arg_name = "n", default = "1")]
    pub batch: usize,

    /// offered-load cap in MiB/s, paced on bytes handed to the client; 0 = unlimited (default 0) [env: PICO_TARGET_MIBPS]
    #[argh(option, short = 't', arg_name = "mibps", default = "0.0")]
    pub target_mibps: f64,

    /// number of streams; writers are spread round-robin (default 1) [env: PICO_STREAMS]
    #[argh(option, arg_name = "n", default = "1")]
    pub streams: usize,

    /// number of independent HTTP client pools; writers and readers are spread round-robin (default 1) [env: PICO_CONNECTIONS]
    #[argh(option, arg_name = "n", default = "1")]
    pub connections: usize,

    /// seconds run before measuring; counters and histogram are reset after it (default 0) [env: PICO_WARMUP]
    #[argh(option, arg_name = "secs", default = "0")]
    pub warmup: u64,

    /// seconds between progress lines; 0 = summary only (default 1) [env: PICO_INTERVAL]
    #[argh(option, arg_name = "secs", default = "1.0")]
    pub interval: f64,

    /// run no reader [env: PICO_NO_READ]
    #[argh(switch)]
    pub no_read: bool,

    /// one idempotent producer per stream (Pico only; batch = --batch, queue depth from --in-flight) [env: PICO_PRODUCER]
    #[argh(switch)]
    pub producer: bool,

    /// do not delete the bench streams at the end [env: PICO_KEEP]
    #[argh(switch)]
    pub keep: bool,

    /// summary format: text (stderr) or json (stdout) (default text) [env: PICO_OUTPUT]
    #[argh(option, arg_name = "format", default = "Output::Text")]
    pub output: Output,

    /// measure append-to-delivery latency instead (Pico only): one writer appends a record every 10 ms, one live reader follows the stream; reports send-to-delivered and acknowledged-to-delivered [env: PICO_LIVE_LATENCY]
    #[argh(switch)]
    pub live_latency: bool,

    /// how the --live-latency reader follows the stream: sse or long-poll (default sse) [env: PICO_LIVE_MODE]
    #[argh(option, arg_name = "mode", default = "LiveMode::Sse")]
    pub live_mode: LiveMode,

    /// fan-out instead: N subscribers on one stream, each its own HTTP/1.1 connection following it live (--live-mode), one writer appending a timestamped record every --append-interval-ms for --duration; reports records delivered per subscriber and append-to-delivery latency across all; 0 = off (default 0) [env: PICO_FAN_OUT]
    #[argh(option, arg_name = "n", default = "0")]
    pub fan_out: usize,

    /// milliseconds between two appends of the --fan-out writer (default 100) [env: PICO_APPEND_INTERVAL_MS]
    #[argh(option, arg_name = "ms", default = "100")]
    pub append_interval_ms: u64,

    /// with --fan-out: the server's process id; its RSS growth from connecting the subscribers is reported [env: PICO_SERVER_PID]
    #[argh(option, arg_name = "pid")]
    pub server_pid: Option<u32>,
}

impl Default for BenchArgs {
    /// The documented defaults.
    fn default() -> BenchArgs {
        BenchArgs {
            record_size: 1024,
            duration: 15,
            in_flight: 32,
            batch: 1,
            target_mibps: 0.0,
            streams: 1,
            connections: 1,
            warmup: 0,
            interval: 1.0,
            no_read: false,
            producer: false,
            keep: false,
            output: Output::Text,
            live_latency: false,
            live_mode: LiveMode::Sse,
            fan_out: 0,
            append_interval_ms: 100,
            server_pid: None,
        }
    }
}

impl BenchArgs {
    /// Checks the values argh cannot: ranges and combinations.
    pub fn validate(&self) -> Result<(), String> {
        if self.duration < 1 {
            return Err("--duration must be at least 1 second".into());
        }
        if self.in_flight < 1 {
            return Err("--in-flight must be at least 1".into());
        }
        if self.batch < 1 {
            return Err("--batch must be at least 1".into());
        }
        if self.streams < 1 {
            return Err("--streams must be at least 1".into());
        }
        if self.connections < 1 {
            return Err("--connections must be at least 1".into());
        }
        if !self.target_mibps.is_finite() || self.target_mibps < 0.0 {
            return Err("--target-mibps must be 0 (unlimited) or a positive number".into());
        }
        if !self.interval.is_finite() || self.interval < 0.0 {
            return Err("--interval must be 0 (summary only) or a positive number".into());
        }
        if self.record_size > u32::MAX as usize {
            return Err("--record-size must fit in 32 bits".into());
        }
        if self.batch > u32::MAX as usize {
            return Err("--batch must fit in 32 bits".into());
        }
        if self.producer && self.live_latency {
            return Err("--producer and --live-latency cannot be combined".into());
        }
        if self.fan_out > 0 {
            if self.producer || self.live_latency {
                return Err(
                    "--fan-out cannot be combined with --producer or --live-latency".into(),
                );
            }
            if self.append_interval_ms < 1 {
                return Err("--append-interval-ms must be at least 1".into());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<BenchArgs, String> {
        BenchArgs::from_args(&["bench"], args).map_err(|e| e.output)
    }

    #[test]
    fn defaults_match_the_spec() {
        let parsed = parse(&[]).unwrap();
        assert_eq!(parsed, BenchArgs::default());
        assert!(parsed.validate().is_ok());
    }

    #[test]
    fn short_and_long_flags() {
        let parsed = parse(&[
            "-b",
            "64",
            "-d",
            "3",
            "-w",
            "512",
            "-n",
            "10",
            "-t",
            "12.5",
            "--streams",
            "4",
            "--connections",
            "2",
            "--warmup",
            "1",
            "--interval",
            "0",
            "--no-read",
            "--producer",
            "--keep",
            "--output",
            "json",
            "--live-mode",
            "long-poll",
        ])
        .unwrap();
        assert_eq!(parsed.record_size, 64);
        assert_eq!(parsed.duration, 3);
        assert_eq!(parsed.in_flight, 512);
        assert_eq!(parsed.batch, 10);
        assert_eq!(parsed.target_mibps, 12.5);
        assert_eq!(parsed.streams, 4);
        assert_eq!(parsed.connections, 2);
        assert_eq!(parsed.warmup, 1);
        assert_eq!(parsed.interval, 0.0);
        assert!(parsed.no_read && parsed.producer && parsed.keep);
        assert_eq!(parsed.output, Output::Json);
        assert_eq!(parsed.live_mode, LiveMode::LongPoll);
        assert!(parsed.validate().is_ok());
    }

    #[test]
    fn bad_values() {
        assert!(parse(&["--output", "xml"]).is_err());
        assert!(parse(&["--live-mode", "ws"]).is_err());
        let zero = BenchArgs {
            duration: 0,
            ..BenchArgs::default()
        };
        assert!(zero.validate().unwrap_err().contains("--duration"));
        let negative = BenchArgs {
            target_mibps: -1.0,
            ..BenchArgs::default()
        };
        assert!(negative.validate().is_err());
        let fan_out = parse(&["--fan-out", "50", "--append-interval-ms", "20"]).unwrap();
        assert_eq!((fan_out.fan_out, fan_out.append_interval_ms), (50, 20));
        assert!(fan_out.validate().is_ok());
        let fan_out_producer = BenchArgs {
            producer: true,
            ..fan_out.clone()
        };
        assert!(fan_out_producer
            .validate()
            .unwrap_err()
            .contains("--fan-out"));
        let no_interval = BenchArgs {
            append_interval_ms: 0,
            ..fan_out
        };
        assert!(no_interval.validate().is_err());
    }

    #[test]
    fn every_flag_names_its_environment_variable() {
        let info = <BenchArgs as ArgsInfo>::get_args_info();
        for flag in info.flags {
            if flag.long == "--help" {
                continue;
            }
            let var = format!(
                "[env: PICO_{}]",
                flag.long
                    .trim_start_matches("--")
                    .replace('-', "_")
                    .to_ascii_uppercase()
            );
            assert!(
                flag.description.trim_end().ends_with(&var),
                "{}: {:?} does not end with {var}",
                flag.long,
                flag.description
            );
        }
    }
}
