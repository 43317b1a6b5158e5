//! Runs `pico bench` without the CLI (until it is wired in):
//! `cargo run --release -p pico-bench --example bench -- [--endpoint URL] [--http2] bench -d 10 ...`

use argh::FromArgs;
use pico_bench::{BenchArgs, Connection, Output};

#[derive(FromArgs)]
/// PicoMQ load generator.
struct Top {
    /// server base URL (default http://127.0.0.1:4437)
    #[argh(option, default = "\"http://127.0.0.1:4437\".into()")]
    endpoint: String,
    /// cleartext HTTP/2 with prior knowledge
    #[argh(switch)]
    http2: bool,
    /// bearer token
    #[argh(option)]
    token: Option<String>,
    #[argh(subcommand)]
    bench: BenchArgs,
}

fn main() {
    let top: Top = argh::from_env();
    let conn = Connection {
        endpoint: top.endpoint,
        http2: top.http2,
        token: top.token,
        ..Connection::default()
    };
    match pico_bench::run_blocking(&top.bench, &conn) {
        Ok(summary) => match top.bench.output {
            Output::Text => summary.print_text(),
            Output::Json => println!("{}", summary.to_json()),
        },
        Err(e) => {
            eprintln!("pico: {e}");
            std::process::exit(1);
        }
    }
}
