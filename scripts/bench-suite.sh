#!/usr/bin/env bash
# The standard benchmark set (BENCHMARKS.md): each case on a fresh release node and data
# directory, client and server on this machine, durability local (fdatasync'd acks).
# Prints a Markdown table; also runs the fsync probe for the single-writer comparison.
#
#   scripts/bench-suite.sh [DURATION_SEC]   (default 10)
#   PICO_BIN=/path/to/pico scripts/bench-suite.sh 6   # another build, e.g. before/after a change
#   PICO_SUITE_FAN_OUT=10000 scripts/bench-suite.sh     # also N SSE and N long-poll subscribers
#                                                       # on one stream (heavy: off by default);
#   PICO_SUITE_FAN_OUT_DS=1 adds the same against durable-streams-server 0.1.5 when installed
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-10}
if [ -z "${PICO_BIN:-}" ]; then
  cargo build --release -p pico-cli >/dev/null
  cargo build --release -p pico-bench --example fsync_probe >/dev/null 2>&1 ||
    cargo build --release -p pico-bench --examples
  PICO_BIN=target/release/pico
fi

run_case() { # name, pico global flags, bench flags...
  local name=$1 globals=$2
  shift 2
  local work port server json problem=""
  work=$(mktemp -d /tmp/pico-suite.XXXXXX)
  # Below the kernel's ephemeral range (32768+), where the previous case's client sockets live.
  port=$((20000 + RANDOM % 12000))
  # A Durable Streams client case needs a node that speaks it (`serve --protocol ds`): the
  # default node answers Pico, and the DS fan-out rows measured that before.
  local serve_protocol=()
  [[ " $globals " == *" --protocol ds "* ]] && serve_protocol=(--protocol ds)
  "$PICO_BIN" serve "${serve_protocol[@]}" --listen "127.0.0.1:$port" --ds-listen off --admin-listen "127.0.0.1:$((port + 1))" \
    --meta-url "sqlite:$work/meta.db" --storage "${SUITE_STORAGE:-"-2@file://$work/objects"}" \
    --wal-dir "$work/wal" >"$work/server.out" 2>"$work/server.log" &
  server=$!
  for _ in $(seq 1 100); do
    grep -q "serving on" "$work/server.out" 2>/dev/null && break
    kill -0 "$server" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$server" 2>/dev/null; then
    # shellcheck disable=SC2086
    json=$("$PICO_BIN" --endpoint "http://127.0.0.1:$port" $globals bench "$@" --server-pid "$server" -d "$duration" \
      --interval 0 --output json 2>"$work/bench.err" || echo '{}')
    problem=$(tail -n 1 "$work/bench.err")
  else
    json='{}'
    problem="server did not start: $(tail -n 1 "$work/server.log")"
  fi
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  rm -rf "$work"
  PROBLEM=$problem python3 - "$name" "$json" <<'PY'
import json, sys
name, raw = sys.argv[1], sys.argv[2]
try:
    r = json.loads(raw)
    w, rd = r["write"], r["read"]
    live = r.get("live") or {}
    fan = r.get("fan_out")
    if fan:
        print(f"| {name} | {fan['complete']:,} of {fan['subscribers']:,} complete, {fan['records']} records, missed {fan['missed']} |"
              f" | {fan['p50_ms']:.2f} | {fan['p99_ms']:.2f} | | max {fan['max_ms']:.2f} ms, client CPU {fan['client_cpu_percent']:.0f}%,"
              f" server RSS +{(fan['server_rss_growth_bytes'] or 0) / 1024 / max(fan['subscribers'], 1):.2f} KiB/subscriber")
        sys.exit(0)
    extra = (f" live p99 {live['after_ack']['p99_ms']:.2f} ms acknowledged → delivered,"
             f" {live['p99_ms']:.2f} ms send → delivered") if live else ""
    print(f"| {name} | {w['records_per_sec']:,.0f} | {w['mib_per_sec']:.1f} | {w['p50_ms']:.2f} | {w['p99_ms']:.2f} | {rd['mib_per_sec']:.1f} |{extra}")
except Exception as e:  # a failed case still gets its row, with what went wrong
    import os
    why = os.environ.get("PROBLEM") or repr(e)
    print(f"| {name} | failed: {why} | | | | |")
PY
}

echo "| case | write rec/s | write MiB/s | p50 ms | p99 ms | read MiB/s |"
echo "|---|---:|---:|---:|---:|---:|"
run_case "README bench (Pico, h2, 1 KiB, 512 in flight, 4 conns, 4 streams)" --http2 -b 1024 -w 512 --connections 4 --streams 4
run_case "same over HTTP/1.1" "" -b 1024 -w 512 --connections 4 --streams 4
run_case "batched writes (-n 100, 1 KiB, --no-read)" --http2 -b 1024 -n 100 -w 64 --connections 4 --streams 4 --no-read
run_case "256 B appends, 4 h2 conns × 64, 1 stream" --http2 -b 256 -w 256 --connections 4 --streams 1 --no-read
run_case "256 B appends, 4 h2 conns × 64, 64 streams" --http2 -b 256 -w 256 --connections 4 --streams 64 --no-read
run_case "64 KiB appends, 4 h2 conns × 64" --http2 -b 65536 -w 256 --connections 4 --streams 4 --no-read
run_case "one writer, one request in flight (256 B)" "" -b 256 -w 1 --no-read
run_case "producer sessions (-n 32)" --http2 -b 1024 -w 512 -n 32 --producer --connections 4 --streams 4
run_case "live delivery (one writer every 10 ms, SSE)" --http2 --live-latency
# Object durability (the default for s3://) on the S3-compatible server the tests use, when
# it is up (scripts/garage-up.sh; PICOMQ_S3_ENDPOINT and AWS_* as in the README).
if [ -n "${PICOMQ_S3_ENDPOINT:-}" ]; then
  SUITE_STORAGE="-2@s3://${PICOMQ_S3_BUCKET:-segments}?region=${PICOMQ_S3_REGION:-garage}&endpoint=$PICOMQ_S3_ENDPOINT&pathStyle=true"
  export SUITE_STORAGE
  run_case "object durability: one writer, one request in flight (256 B)" "" -b 256 -w 1 --no-read
  run_case "object durability: 256 in flight, 256 B, 4 h2 conns, 4 streams" --http2 -b 256 -w 256 --connections 4 --streams 4 --no-read
  unset SUITE_STORAGE
else
  echo "| object durability | skipped: PICOMQ_S3_ENDPOINT is not set | | | | |"
fi
if [ -n "${PICO_SUITE_FAN_OUT:-}" ]; then
  n=$PICO_SUITE_FAN_OUT
  for mode in sse long-poll; do
    run_case "fan-out: $n $mode subscribers, one 64 B append every 100 ms" "" --fan-out "$n" --live-mode "$mode" -b 64
    run_case "same, --protocol ds" "--protocol ds" --fan-out "$n" --live-mode "$mode" -b 64
  done
  ds_server=/opt/ds-0.1.5/bin/durable-streams-server
  if [ -n "${PICO_SUITE_FAN_OUT_DS:-}" ] && [ -x "$ds_server" ]; then
    for mode in sse long-poll; do
      work=$(mktemp -d /tmp/ds-suite.XXXXXX)
      port=$((20000 + RANDOM % 12000))
      "$ds_server" --host 127.0.0.1 --port "$port" --data-dir "$work" --durability wal >/dev/null 2>&1 &
      ds_pid=$!
      sleep 1
      echo "comparison server, $n $mode subscribers:"
      "$PICO_BIN" --endpoint "http://127.0.0.1:$port" --protocol ds bench --fan-out "$n" --live-mode "$mode" \
        -b 64 -d "$duration" --server-pid "$ds_pid" 2>&1 | grep -E '^(Fan-out|Delivered|Append-to-delivery|Client CPU|Server RSS|First error)' || true
      kill "$ds_pid" 2>/dev/null || true
      wait "$ds_pid" 2>/dev/null || true
      rm -rf "$work"
    done
  fi
fi
echo
if [ -x target/release/examples/fsync_probe ]; then
  target/release/examples/fsync_probe /tmp 2000
fi
echo
# Appends over HTTP/1.1 (W1-W3), side by side with the comparison server when it is installed.
PICO_BIN=$PICO_BIN scripts/bench-appends-h1.sh
echo
# Catch-up reads, side by side likewise.
PICO_BIN=$PICO_BIN scripts/bench-catch-up.sh 4
echo
# Live delivery (one writer, one long-poll or SSE reader), side by side likewise.
PICO_BIN=$PICO_BIN scripts/bench-live.sh "$duration"
echo
# An idle node's memory, side by side likewise.
PICO_BIN=$PICO_BIN scripts/bench-idle-memory.sh
echo
# User-space instructions per small append (callgrind; skipped without valgrind).
PICO_BIN=$PICO_BIN scripts/bench-instructions.sh
echo
# The segment catalog's size and the metadata bytes written per MiB of segments (SQLite, and
# Postgres when PICOMQ_PG_URL is set).
PICO_BIN=$PICO_BIN scripts/bench-catalog.sh "$duration"

# Many streams (BENCHMARKS.md, "A million streams"): creates of unique names, the RSS per
# stream, a restart and appends to 1 % of them, on a fresh node with the embedded SQLite
# metadata log. PICO_SUITE_STREAMS sets the count (1000000 for the issue's million).
echo
PICO_BIN=$PICO_BIN scripts/bench-streams.sh "${PICO_SUITE_STREAMS:-100000}"
