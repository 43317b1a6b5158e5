//! The disk's raw durability cost: append 4 KiB to a file and `fdatasync` it, many times, and
//! report the latency percentiles. A WAL acknowledgement cannot be faster than this; compare
//! single-writer append latency against it on the same disk, at the same time.
//!
//! `cargo run --release -p pico-bench --example fsync_probe -- [DIR] [COUNT]`
//! (default: the current directory, 2000 rounds).

use std::io::Write;
use std::os::fd::AsRawFd;
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = args.next().unwrap_or_else(|| ".".into());
    let count: usize = args
        .next()
        .map(|c| c.parse().expect("COUNT is a number"))
        .unwrap_or(2000);
    let path = std::path::Path::new(&dir).join(format!(".fsync-probe-{}", std::process::id()));
    let mut file = std::fs::OpenOptions::new()
        .create_new(true)
        .append(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
    let block = [0x5au8; 4096];
    let mut latencies_us = Vec::with_capacity(count);
    for _ in 0..count {
        let started = Instant::now();
        file.write_all(&block).expect("write");
        // SAFETY: fdatasync on a descriptor this function owns.
        let synced = unsafe { libc_fdatasync(file.as_raw_fd()) };
        assert_eq!(synced, 0, "fdatasync failed");
        latencies_us.push(started.elapsed().as_secs_f64() * 1e6);
    }
    drop(file);
    let _ = std::fs::remove_file(&path);
    latencies_us.sort_by(f64::total_cmp);
    let at = |q: f64| latencies_us[((latencies_us.len() - 1) as f64 * q).round() as usize];
    println!(
        "fsync probe ({count} × 4 KiB append + fdatasync in {dir}): p50 {:.0}µs p90 {:.0}µs p99 {:.0}µs max {:.0}µs",
        at(0.50),
        at(0.90),
        at(0.99),
        at(1.0)
    );
}

extern "C" {
    #[link_name = "fdatasync"]
    fn libc_fdatasync(fd: i32) -> i32;
}
