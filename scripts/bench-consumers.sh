#!/usr/bin/env bash
# What named consumers cost (docs/consumers.md): registers CONSUMERS consumers (default
# 10,000) on a fresh node, then reports the metadata log's bytes and the node's RSS per
# consumer, the time of a registration, of an operator's listing and of a /metrics scrape with
# that many, and the acknowledgements a second one consumer takes from CONNECTIONS h2load
# connections (every acknowledgement a metadata-log transaction, group-committed).
#
#   scripts/bench-consumers.sh                      # builds the release binary first
#   PICO_BIN=target/release/pico CONSUMERS=10000 CONNECTIONS=16 scripts/bench-consumers.sh
#
# Needs python3 and h2load (Debian: nghttp2-client). The node runs pinned to CPU 0 and h2load
# to CPU 1 when the machine has two.
set -euo pipefail
cd "$(dirname "$0")/.."
consumers=${CONSUMERS:-10000}
connections=${CONNECTIONS:-16}
if [ -z "${PICO_BIN:-}" ]; then
  cargo build --release --locked -p pico-cli
  PICO_BIN=${CARGO_TARGET_DIR:-$PWD/target}/release/pico
fi
command -v h2load >/dev/null || { echo "bench-consumers: h2load not found (nghttp2-client)" >&2; exit 2; }

work=$(mktemp -d /tmp/pico-bench-consumers.XXXXXX)
ulimit -l unlimited 2>/dev/null || ulimit -l 8192 2>/dev/null || true
pin_node=() pin_client=()
if [ "$(nproc)" -ge 2 ]; then pin_node=(taskset -c 0) pin_client=(taskset -c 1); fi
"${pin_node[@]}" "$PICO_BIN" serve --listen 127.0.0.1:0 --ds-listen off --admin-listen 127.0.0.1:0 \
  --cores 1 --meta-url "sqlite:$work/meta.db" --storage "-2@file://$work/objects" \
  --wal-dir "$work/wal" >"$work/server.out" 2>"$work/server.log" &
node=$!
trap 'kill "$node" 2>/dev/null || true; wait "$node" 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 1 200); do grep -q "^admin on" "$work/server.out" 2>/dev/null && break; sleep 0.05; done
url=$(sed -n 's/^serving on \(http:\/\/[^ ]*\).*/\1/p' "$work/server.out" | head -1)
admin=$(sed -n 's/.*admin on \(http:\/\/[^ ]*\).*/\1/p' "$work/server.out" | head -1)
if [ -z "$url" ] || [ -z "$admin" ]; then cat "$work/server.out" "$work/server.log" >&2; exit 1; fi
rss_kib() { awk '/^VmRSS/ { print $2 }' "/proc/$node/status"; }
# The catalog's bytes: its pages as a read-only connection sees them, the WAL's included (the
# bench only reads the node's files).
db_bytes() {
  python3 -c 'import sqlite3,sys; c=sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True); print(c.execute("PRAGMA page_count").fetchone()[0] * c.execute("PRAGMA page_size").fetchone()[0])' "$work/meta.db"
}

curl -sf -X PUT -H 'content-type: text/plain' "$url/bench/s" >/dev/null
curl -sf -X POST -H 'content-type: text/plain' --data-binary x "$url/bench/s" >/dev/null
sleep 1
rss_before=$(rss_kib) db_before=$(db_bytes)
python3 - "$url" "$consumers" >"$work/register.txt" <<'EOF'
import http.client, json, sys, time, urllib.parse
url, count = urllib.parse.urlparse(sys.argv[1]), int(sys.argv[2])
conn = http.client.HTTPConnection(url.hostname, url.port)
body = json.dumps({"streams": ["/bench/s"]})
started = time.monotonic()
for i in range(count):
    conn.request("PUT", f"/?consumer=/bench/c{i}", body, {"content-type": "application/json"})
    answer = conn.getresponse()
    answer.read()
    assert answer.status == 201, answer.status
print(f"{(time.monotonic() - started) / count * 1000:.3f}")
EOF
sleep 1
rss_after=$(rss_kib) db_after=$(db_bytes)
register_ms=$(cat "$work/register.txt")
listing_s=$(curl -sf -o /dev/null -w '%{time_total}' "$admin/admin/consumers")
scrape_s=$(curl -sf -o /dev/null -w '%{time_total}' "$admin/metrics")

token=$(curl -sf -X POST "$url/?consumer=/bench/c0&action=acquire" | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
echo '{"offsets":[{"stream":"/bench/s","offset":0}]}' >"$work/ack.json"
"${pin_client[@]}" h2load -n 20000 -c "$connections" -m 1 --h1 -d "$work/ack.json" \
  -H 'content-type: application/json' -H "pico-consumer-token: $token" \
  "$url/?consumer=/bench/c0&action=ack" >"$work/h2load.txt"
acks=$(awk '/^finished in/ { print $4 }' "$work/h2load.txt")
ok=$(awk '/^status codes:/ { print $3 }' "$work/h2load.txt")
latency=$(awk '/^time for request:/ { print $6 " mean, " $5 " max" }' "$work/h2load.txt")

echo "consumers registered:      $consumers ($register_ms ms each, one connection)"
echo "metadata log per consumer: $(( (db_after - db_before) / consumers )) bytes"
echo "node RSS per consumer:     $(( (rss_after - rss_before) * 1024 / consumers )) bytes (RSS $((rss_before / 1024)) -> $((rss_after / 1024)) MiB)"
echo "GET /admin/consumers:      ${listing_s}s   /metrics: ${scrape_s}s (with $consumers consumers)"
echo "acknowledgements:          $acks ($ok of 20000 answered 2xx; $connections connections; request time $latency)"
