//! The throughput benchmark: writers, optional producers, catch-up readers, and the clock
//! that runs warmup, progress lines and the measured window (shared with `--live-latency`).
//!
//! Files: `run` is here; `clock` (the state the tasks share, and the clock), `streams`
//! (creating and deleting the temporary streams), `writer`, `reader` (catch-up readers of both
//! protocols) and `producer` (producer mode).

mod clock;
mod producer;
mod reader;
mod streams;
mod writer;

pub(crate) use clock::{clock, Shared};
use producer::{producer_writer, ProducerTask};
use reader::{ds_reader, reader};
pub(crate) use streams::{create_streams, delete_streams};
use writer::{direct_connections, writer, Transport};

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::args::{BenchArgs, Output};
use crate::pacing::{self, Pacer};
use crate::report::{self, Summary};
use crate::wire::{self, AppendShape, REQUEST_TIMEOUT};
use crate::{Connection, Protocol};

/// The throughput benchmark.
pub(crate) async fn run(args: &BenchArgs, conn: &Connection) -> Result<Summary, String> {
    let base = conn.base()?;
    let clients = (0..args.connections)
        .map(|_| wire::build_client(conn, Some(REQUEST_TIMEOUT)))
        .collect::<Result<Vec<_>, _>>()?;
    let shape = match conn.protocol {
        Protocol::Pico => AppendShape::pico(args.batch, args.record_size),
        Protocol::DurableStreams => AppendShape::ds(args.batch, args.record_size),
    };
    let names = crate::stream_names(args.streams);
    create_streams(&clients[0], &base, &names, shape.stream_type).await?;
    if args.output == Output::Text {
        eprintln!("{}", report::created_line(names.len(), conn.protocol));
    }

    let shared = Shared::new();
    let pacer = pacing::bytes_per_sec(args.target_mibps).map(|rate| Arc::new(Pacer::new(rate)));
    let mut tasks: Vec<JoinHandle<()>> = Vec::new();
    let record_size = args.record_size;

    if args.producer {
        // One producer per stream; writer w feeds producer w % streams.
        let mut senders = Vec::new();
        for (s, name) in names.iter().enumerate() {
            let writers = (0..args.in_flight)
                .filter(|w| w % args.streams == s)
                .count();
            let (tx, rx) = mpsc::unbounded_channel();
            senders.push(tx);
            let producer = ProducerTask {
                client: clients[s % clients.len()].clone(),
                url: format!("{base}{name}"),
                name: name.clone(),
                id: format!("bench-{}-{s}", &name["/bench/".len()..]),
                batch: args.batch,
                record_size,
                max_requests: writers.div_ceil(args.batch).max(1),
                shared: shared.clone(),
            };
            tasks.push(tokio::spawn(producer.run(rx)));
        }
        for w in 0..args.in_flight {
            let tx = senders[w % args.streams].clone();
            tasks.push(tokio::spawn(producer_writer(
                shared.clone(),
                tx,
                record_size as u64,
                pacer.clone(),
            )));
        }
    } else {
        let direct = direct_connections(args, conn, &base, &clients[0], &names).await?;
        for w in 0..args.in_flight {
            let name = &names[w % args.streams];
            let transport = match &direct {
                Some(conns) => Transport::Direct(conns[w % conns.len()].clone()),
                None => Transport::Reqwest(clients[w % clients.len()].clone()),
            };
            tasks.push(tokio::spawn(writer(
                shared.clone(),
                transport,
                format!("{base}{name}"),
                name.clone(),
                shape.clone(),
                args.batch as u64,
                (args.batch * record_size) as u64,
                pacer.clone(),
            )));
        }
    }
    if !args.no_read {
        for (s, name) in names.iter().enumerate() {
            let (client, url) = (clients[s % clients.len()].clone(), format!("{base}{name}"));
            tasks.push(match conn.protocol {
                Protocol::Pico => tokio::spawn(reader(shared.clone(), client, url, name.clone())),
                Protocol::DurableStreams => tokio::spawn(ds_reader(
                    shared.clone(),
                    client,
                    url,
                    name.clone(),
                    shape.stream_type == wire::JSON_TYPE,
                    record_size,
                )),
            });
        }
    }

    let window = clock(&shared, args, false).await;
    for task in tasks {
        if let Err(e) = task.await {
            shared.fail(format!("a bench task failed: {e}"));
        }
    }
    if !args.keep {
        delete_streams(&clients[0], &base, &names).await;
    }
    if let Some(error) = shared.error() {
        return Err(error);
    }
    Ok(Summary {
        protocol: conn.protocol,
        record_size,
        batch: args.batch,
        in_flight: args.in_flight,
        streams: args.streams,
        connections: args.connections,
        elapsed_sec: window.elapsed_sec,
        write: window.counters.write,
        append_latency: window.append_latency,
        read: (!args.no_read).then_some(window.counters.read),
        live: None,
        fan_out: None,
    })
}
