#!/usr/bin/env bash
# The disk's raw durability cost: 4 KiB append + fdatasync, COUNT times, in DIR; prints the
# latency percentiles. A WAL acknowledgement cannot be faster: run it beside a single-writer
# bench (`pico bench -b 256 -w 1 --no-read`) in the same session and compare the p50s.
#
#   scripts/fsync-probe.sh [DIR] [COUNT]   (default: ./data, or the current directory; 2000)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-}
if [ -z "$dir" ]; then
  if [ -d data ]; then dir=data; else dir=.; fi
fi
count=${2:-2000}
cargo build --release -q -p pico-bench --example fsync_probe
target/release/examples/fsync_probe "$dir" "$count"
