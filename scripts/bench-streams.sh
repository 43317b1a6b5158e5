#!/usr/bin/env bash
# Many streams (BENCHMARKS.md, "A million streams"): on a fresh node with the embedded default
# (SQLite + file://), N creates of unique names (h2load, one h2c connection, 64 in flight),
# the server's RSS growth per stream, a restart (SIGTERM, start again, until the stream created
# last is served) and the RSS after it, then appends to a random 1 % of the streams. Prints
# Markdown rows.
#
#   scripts/bench-streams.sh [N] [pico serve flags...]     (default N = 100000)
#   PICO_BIN=/path/to/pico scripts/bench-streams.sh 1000000
#
# One connection on purpose: with -i every h2load client walks the URI list from its start, so
# 64 clients would create each name 64 times (idempotent re-creates, answered from memory).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-100000}
shift || true
command -v h2load >/dev/null || { echo "streams: skipped (h2load is not installed)"; exit 0; }
source scripts/lib/fresh-node.sh
resolve_pico_bin

rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }
# Milliseconds since the epoch, for durations measured around a command.
now_ms() { date +%s%3N; }

port=$((20000 + RANDOM % 12000))
FRESH_NODE_PORT=$port start_fresh_node "$@"
base=$node_url/m/s
# Settled: the node has served a request.
curl -s -o /dev/null -X PUT -H 'content-type: text/plain' "$node_url/m/warm"
before=$(rss_kib "$node_pid")
seq 0 $((n - 1)) | sed "s|^|$base|" >"$node_dir/uris"
began=$(now_ms)
h2load -n "$n" -c 1 -m 64 -i "$node_dir/uris" -H ':method: PUT' -H 'Content-Type: text/plain' \
  >"$node_dir/creates.out" 2>&1
took=$(($(now_ms) - began))
grep -q "$n succeeded" "$node_dir/creates.out" || { cat "$node_dir/creates.out"; exit 1; }
after=$(rss_kib "$node_pid")
sleep 3
after_settled=$(rss_kib "$node_pid")
echo "| $n creates (h2load -c 1 -m 64, unique names) | $((took / 1000)).$(((took % 1000) / 100)) s, $((n * 1000 / (took > 0 ? took : 1)))/s |"
echo "| RSS growth per stream after the creates, at once / 3 s later | $(((after - before) * 1024 / n)) B / $(((after_settled - before) * 1024 / n)) B ($((after / 1024)) / $((after_settled / 1024)) MiB in all) |"

# Restart: what the metadata log and the WAL hold is served again.
kill -TERM "$node_pid"
wait "$node_pid" 2>/dev/null || true
began=$(now_ms)
"$PICO_BIN" serve --listen "127.0.0.1:$port" --ds-listen off --no-admin \
  --meta-url "sqlite:$node_dir/meta.db" --storage "-2@file://$node_dir/objects" \
  --wal-dir "$node_dir/wal" "$@" >>"$node_log" 2>&1 &
node_pid=$!
last=$base$((n - 1))
for _ in $(seq 1 6000); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$last?seq=-1" || true)" = 200 ] && break
  sleep 0.01
done
took=$(($(now_ms) - began))
[ "$(curl -s -o /dev/null -w '%{http_code}' "$last?seq=-1")" = 200 ] ||
  { tail "$node_log"; echo "not served again in 60 s" >&2; exit 1; }
restarted=$(rss_kib "$node_pid")
# And once the node has been idle a few seconds (the allocator hands freed memory back late).
sleep 3
settled=$(rss_kib "$node_pid")
echo "| restart to serving (SIGTERM, start, until the last stream answers) | $((took / 1000)).$(((took % 1000) / 10)) s |"
echo "| RSS per stream after the restart (over the first node's before the creates), at once / 3 s later | $(((restarted - before) * 1024 / n)) B / $(((settled - before) * 1024 / n)) B ($((restarted / 1024)) / $((settled / 1024)) MiB in all) |"

# Appends to a random 1 % of the streams, 256 B bodies, 4 in flight on each of 64 connections.
head -c 256 /dev/zero | tr '\0' x >"$node_dir/body"
shuf -i 0-$((n - 1)) -n $(((n + 99) / 100)) | sed "s|^|$base|" >"$node_dir/some"
appends=$((n * 2 > 200000 ? 200000 : n * 2))
h2load -n "$appends" -c 64 -m 4 -i "$node_dir/some" -d "$node_dir/body" \
  -H 'Content-Type: text/plain' >"$node_dir/appends.out" 2>&1
rate=$(sed -n 's/^finished in .*, \([0-9.]*\) req\/s.*/\1/p' "$node_dir/appends.out")
grep -q "$appends succeeded" "$node_dir/appends.out" || { cat "$node_dir/appends.out"; exit 1; }
echo "| appends to a random 1 % ($(((n + 99) / 100)) streams, 256 B, h2load -c 64 -m 4) | $rate req/s, RSS $(($(rss_kib "$node_pid") / 1024)) MiB |"

