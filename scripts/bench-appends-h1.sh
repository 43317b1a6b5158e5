#!/usr/bin/env bash
# Appends over HTTP/1.1, side by side (BENCHMARKS.md, "W1-W3"): h2load --h1 on CPU 1 against a
# fresh server on CPU 0, Durable Streams protocol, acknowledgements after fdatasync.
#   W1: 256 B POSTs to one stream, 256 connections, one request in flight on each
#   W2: the same spread over 64 streams
#   W3: 64 KiB POSTs to one stream, 64 connections
# Prints one Markdown row per workload and server: PicoMQ (`pico serve --protocol ds`), and the
# comparison server when it is installed (`cargo install --locked durable-streams@0.1.5`, or
# PEER_BIN=/path/to/durable-streams-server; run with `--durability wal`), with requests/s, the
# mean request time, the server's CPU seconds per 100,000 requests and its peak RSS (VmHWM).
#
#   scripts/bench-appends-h1.sh [REQUESTS]      (default 100000 for W1/W2, a tenth for W3)
#   WORKLOADS="W1 W2" picks workloads; PEER_BIN=none leaves the comparison server out.
#   DURATION=10 runs each workload for that many seconds instead of a count of requests (the
#   comparison server's W3 rate falls once its page cache fills: count-bounded runs of a
#   second or two flatter it).
#   RUNS=4 repeats each workload, the servers' order swapped every other run (PicoMQ first in
#   odd runs), and adds a row with the ratio of the two servers' rates of succeeded requests
#   after each run's pair.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v h2load >/dev/null || { echo "appends over HTTP/1.1: skipped (h2load is not installed)"; exit 0; }
requests=${1:-100000}
. scripts/lib/side-by-side.sh
find_servers
work=$(mktemp -d /tmp/pico-appends-h1.XXXXXX)
trap 'rm -rf "$work"' EXIT
head -c 256 /dev/zero | tr '\0' x >"$work/small"
head -c 65536 /dev/urandom >"$work/large"

# `one NAME WORKLOAD server command...` (PORT and DIR are substituted in the command).
one() {
  local name=$1 workload=$2 dir streams=1 body=$work/small n=$requests conns=256
  shift 2
  dir=$(mktemp -d "$work/server.XXXXXX")
  case $workload in
    W2) streams=64 ;;
    W3) body=$work/large n=$((requests / 10)) conns=64 ;;
  esac
  start_pinned "$dir" "$@"
  local pid=$server_pid
  : >"$dir/uris"
  for s in $(seq 1 "$streams"); do
    curl -s -o /dev/null -X PUT -H 'content-type: application/octet-stream' "$server_url/w/s$s"
    echo "$server_url/w/s$s" >>"$dir/uris"
  done
  local before after
  before=$(awk '{ print $14 + $15 }' "/proc/$pid/stat")
  local amount=(-n "$n")
  [ -n "${DURATION:-}" ] && amount=(-D "$DURATION")
  taskset -c 1 h2load --h1 "${amount[@]}" -c "$conns" -m 1 -i "$dir/uris" -d "$body" \
    -H 'content-type: application/octet-stream' >"$dir/h2load.out" 2>&1 || true
  after=$(awk '{ print $14 + $15 }' "/proc/$pid/stat")
  local peak_mib
  peak_mib=$(awk '/^VmHWM:/ { printf "%.0f", $2 / 1024 }' "/proc/$pid/status")
  stop_pinned
  local rate mean ok
  rate=$(sed -n 's/^finished in [^,]*, \([0-9.]*\) req\/s.*/\1/p' "$dir/h2load.out")
  mean=$(awk '/time for request/ { print $6 }' "$dir/h2load.out")
  ok=$(sed -n 's/.* \([0-9]*\) succeeded.*/\1/p' "$dir/h2load.out")
  # With a duration, the requests made are what h2load counted ("requests: N total, ...").
  [ -n "${DURATION:-}" ] && n=$(sed -n 's/^requests: \([0-9]*\) total.*/\1/p' "$dir/h2load.out")
  [ "${n:-0}" -gt 0 ] || n=1
  local ticks=$((after - before)) hz
  hz=$(getconf CLK_TCK)
  # Hundredths zero-padded: 1.02 s printed as "1.2 s" before.
  local cpu
  printf -v cpu '%d.%02d' $((ticks * 100000 / hz / n)) $(((ticks * 100000 * 100 / hz / n) % 100))
  echo "| $workload | $name | $rate | $mean | $cpu s | $peak_mib MiB | $ok of $n |"
  # The ratio compares answered appends: a failed request (a full disk) counts for nothing.
  last_rate=$(awk -v r="${rate:-0}" -v ok="${ok:-0}" -v n="$n" 'BEGIN { printf "%.2f", r * ok / n }')
  # Ten seconds of W3 writes gigabytes: each server's data goes before the next one starts.
  rm -rf "$dir"
}

pico_one() {
  one "PicoMQ" "$1" "$PICO_BIN" "${pico_serve[@]}"
  pico_rate=$last_rate
}

peer_one() {
  one "durable-streams-server 0.1.5" "$1" "$peer" "${peer_serve[@]}"
  peer_rate=$last_rate
}

echo "| workload | server | requests/s | mean | server CPU per 100k requests | peak RSS | succeeded |"
echo "|---|---|---:|---:|---:|---:|---:|"
runs=${RUNS:-1}
for run in $(seq 1 "$runs"); do
  for workload in ${WORKLOADS:-W1 W2 W3}; do
    if [ -z "$peer" ]; then
      pico_one "$workload"
      continue
    fi
    if [ $((run % 2)) -eq 1 ]; then
      pico_one "$workload"
      peer_one "$workload"
    else
      peer_one "$workload"
      pico_one "$workload"
    fi
    ratio=$(awk -v a="$pico_rate" -v b="$peer_rate" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }')
    echo "| $workload | ratio, run $run of $runs | $ratio | | | | |"
  done
done
