#!/usr/bin/env bash
# Live delivery, side by side (BENCHMARKS.md, "Live delivery"): one Durable Streams writer
# appends a timestamped record every 10 ms and one live reader (long-poll, then SSE) follows
# the stream over HTTP/1.1 (`pico --protocol ds bench --fan-out 1`, on CPU 1), against a fresh
# server on CPU 0, every acknowledgement after fdatasync. Prints one Markdown row per mode and
# server: PicoMQ, and the comparison server when it is installed (`cargo install --locked
# durable-streams@0.1.5`, or PEER_BIN=/path/to/durable-streams-server; PEER_BIN=none leaves it
# out), with the append latency and the append-to-delivery latency (send to delivered).
#
#   scripts/bench-live.sh [SECONDS] [RECORD_BYTES]      (defaults 10 and 64)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
record_bytes=${2:-64}
. scripts/lib/side-by-side.sh
find_servers
work=$(mktemp -d /tmp/pico-live.XXXXXX)
trap 'rm -rf "$work"' EXIT

# `one NAME MODE server command...` (PORT and DIR are substituted in the command).
one() {
  local name=$1 mode=$2 dir
  shift 2
  dir=$(mktemp -d "$work/server.XXXXXX")
  start_pinned "$dir" "$@"
  taskset -c 1 "$PICO_BIN" --endpoint "$server_url" --protocol ds bench --fan-out 1 \
    --live-mode "$mode" --append-interval-ms 10 -d "$seconds" -b "$record_bytes" --interval 0 \
    >"$dir/bench.out" 2>&1 || true
  stop_pinned
  # "Append latency: p50 0.58ms p90 ... p99 1.14ms ..." and "Append-to-delivery: ..." lines.
  local append delivery
  append=$(awk '/^Append latency:/ { print $4, "/", $8 }' "$dir/bench.out")
  delivery=$(awk '/^Append-to-delivery:/ { print $3, "/", $7 }' "$dir/bench.out")
  echo "| $mode | $name | ${append:-failed} | ${delivery:-failed} |"
}

echo "| mode | server | append p50 / p99 | append-to-delivery p50 / p99 |"
echo "|---|---|---:|---:|"
for mode in long-poll sse; do
  one "PicoMQ" "$mode" "$PICO_BIN" "${pico_serve[@]}"
  if [ -n "$peer" ]; then
    one "durable-streams-server 0.1.5" "$mode" "$peer" "${peer_serve[@]}"
  fi
done
