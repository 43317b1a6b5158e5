#!/usr/bin/env bash
# Restart after a crash with many streams (BENCHMARKS.md, "Restart after a crash"): on a fresh
# node with the embedded default (SQLite + file://), N creates of unique names and one append
# to each (h2load, one h2c connection, 64 in flight; segments seal only after ten minutes, so
# every record is in the WAL), then `kill -9`, a start on the same directories, and the time
# until the stream created last serves its record. That start recovers the WAL and checks each
# stream's records against its tail in the catalog. Prints Markdown rows.
#
#   scripts/bench-crash-restart.sh [N] [pico serve flags...]     (default N = 100000)
#   PICO_BIN=/path/to/pico scripts/bench-crash-restart.sh 200000
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-100000}
shift || true
command -v h2load >/dev/null || { echo "crash restart: skipped (h2load is not installed)"; exit 0; }
source scripts/lib/fresh-node.sh
resolve_pico_bin

now_ms() { date +%s%3N; }

port=$((20000 + RANDOM % 12000))
FRESH_NODE_PORT=$port start_fresh_node --segment-max-age-ms 600000 "$@"
base=$node_url/m/s
seq 0 $((n - 1)) | sed "s|^|$base|" >"$node_dir/uris"
h2load -n "$n" -c 1 -m 64 -i "$node_dir/uris" -H ':method: PUT' -H 'Content-Type: text/plain' \
  >"$node_dir/creates.out" 2>&1
grep -q "$n succeeded" "$node_dir/creates.out" || { cat "$node_dir/creates.out"; exit 1; }
printf 'a record of 32 bytes, not more.\n' >"$node_dir/body"
h2load -n "$n" -c 1 -m 64 -i "$node_dir/uris" -d "$node_dir/body" \
  >"$node_dir/appends.out" 2>&1
grep -q "$n succeeded" "$node_dir/appends.out" || { cat "$node_dir/appends.out"; exit 1; }
wal_bytes=$(du -sb "$node_dir/wal" | cut -f1)

kill -KILL "$node_pid"
wait "$node_pid" 2>/dev/null || true
began=$(now_ms)
"$PICO_BIN" serve --listen "127.0.0.1:$port" --ds-listen off --no-admin \
  --meta-url "sqlite:$node_dir/meta.db" --storage "-2@file://$node_dir/objects" \
  --wal-dir "$node_dir/wal" --segment-max-age-ms 600000 "$@" >>"$node_log" 2>&1 &
node_pid=$!
last=$base$((n - 1))
for _ in $(seq 1 12000); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$last?seq=0" || true)" = 200 ] && break
  sleep 0.01
done
took=$(($(now_ms) - began))
[ "$(curl -s "$last?seq=0")" != "" ] || { tail "$node_log"; echo "not served again" >&2; exit 1; }
echo "| $n streams, one record each in the WAL ($((wal_bytes / 1048576)) MiB of WAL files): kill -9, start, until the last stream's record is served | $((took / 1000)).$(((took % 1000) / 10)) s |"
