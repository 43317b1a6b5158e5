#!/usr/bin/env bash
# User-space instructions per request (BENCHMARKS.md, "Instructions per request"): a node on
# one core under valgrind's callgrind takes small appends over HTTP/1.1 (`h2load --h1`, 16
# connections, one request in flight on each), and the instructions all of its threads ran
# while it answered them are divided by their count. Unlike requests/s, the figure barely
# moves with the machine's load or a virtual CPU's neighbours (run to run by under 1 % on an
# idle machine, 1.5 % beside a build), so it shows what a change to the request path costs or
# saves; it leaves out the kernel's share (half of a small append's CPU time, see W1) and says
# nothing of waiting.
#
#   scripts/bench-instructions.sh [REQUESTS]      (default 20000, after 2,000 to warm up)
#   PICO_BIN=/path/to/pico compares another build (default: a release build of this checkout).
#
# Workloads: `ds-append` (256 B Durable Streams appends to one stream, as W1) and
# `pico-append` (the same through the Pico protocol). Needs valgrind, h2load and curl; skips
# when one is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in valgrind callgrind_control callgrind_annotate h2load curl; do
  command -v "$tool" >/dev/null || { echo "instructions per request: skipped ($tool is not installed)"; exit 0; }
done
requests=${1:-20000}
. scripts/lib/side-by-side.sh
PEER_BIN=none find_servers
work=$(mktemp -d /tmp/pico-instructions.XXXXXX)
server=
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
head -c 256 /dev/zero | tr '\0' x >"$work/record"
ulimit -l unlimited 2>/dev/null || true

# `one WORKLOAD PROTOCOL`: prints the workload's row.
one() {
  local workload=$1 protocol=$2 dir port
  dir=$(mktemp -d "$work/$workload.XXXXXX")
  port=$((20000 + RANDOM % 12000))
  valgrind --tool=callgrind --callgrind-out-file="$dir/callgrind.out" "$PICO_BIN" serve \
    --protocol "$protocol" --cores 1 --listen "127.0.0.1:$port" --no-admin \
    --meta-url "sqlite:$dir/meta.db" --storage "-2@file://$dir/objects" --wal-dir "$dir/wal" \
    >"$dir/server.log" 2>&1 &
  server=$!
  local url=http://127.0.0.1:$port
  # Under valgrind a node takes a few seconds to start.
  for _ in $(seq 1 120); do
    curl -s -o /dev/null -m 1 "$url/" && break
    sleep 0.5
  done
  curl -s -o /dev/null -X PUT -H 'content-type: application/octet-stream' "$url/s"
  echo "$url/s" >"$dir/uris"
  local load=(h2load --h1 -c 16 -m 1 -i "$dir/uris" -d "$work/record"
    -H 'content-type: application/octet-stream')
  "${load[@]}" -n 2000 >"$dir/warm.out" 2>&1 || true
  # Counted from here: zeroed, then dumped once the measured requests are answered.
  callgrind_control -z "$server" >/dev/null 2>&1
  "${load[@]}" -n "$requests" >"$dir/h2load.out" 2>&1 || true
  callgrind_control -d "$server" >/dev/null 2>&1
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  server=
  local ok total
  ok=$(sed -n 's/.* \([0-9]*\) succeeded.*/\1/p' "$dir/h2load.out")
  # The dump asked for above is the first numbered one; the last is the node's exit.
  total=$(callgrind_annotate "$dir/callgrind.out.1" 2>/dev/null |
    awk '/PROGRAM TOTALS/ { gsub(/,/, "", $1); print $1 }')
  local per
  per=$(awk -v t="${total:-0}" -v n="${ok:-0}" 'BEGIN { if (n > 0) printf "%.0f", t / n; else print "-" }')
  echo "| $workload | $per | ${ok:-0} of $requests |"
}

echo "| workload | user-space instructions per request | succeeded |"
echo "|---|---:|---:|"
one ds-append ds
one pico-append pico
