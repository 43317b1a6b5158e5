#!/usr/bin/env bash
# Appends and reads while retention reclaims at full speed, against the same load with
# retention off (BENCHMARKS.md, Retention). Each round starts two fresh nodes in turn on the
# same machine and runs the same `pico bench` against each; the ratio is on / off.
#
#   scripts/bench-retention.sh [PICO_BINARY] [ROUNDS]
#
# "On": every bench stream gets --default-retention-bytes 1MiB, so with 1 KiB records the
# pass trims each stream about every second, and --gc-interval-ms 200 deletes the emptied
# segments from the bucket as fast as they appear (64 KiB segments, sealed every 50 ms).
set -euo pipefail
bin="${1:-target/release/pico}"
rounds="${2:-3}"
seconds="${BENCH_SEC:-6}"
common=(--cores 1 --segment-size 64KiB --segment-max-age-ms 50 --gc-interval-ms 200)

run() {
    local label="$1"; shift
    local work port pid
    work="$(mktemp -d)"
    port=$((20000 + RANDOM % 12000))
    "$bin" serve --listen "127.0.0.1:$port" --ds-listen off --admin-listen 127.0.0.1:0 \
        --meta-url "sqlite:$work/meta.db" --storage "-2@file://$work/objects" \
        --wal-dir "$work/wal" "${common[@]}" "$@" >"$work/out" 2>"$work/log" &
    pid=$!
    for _ in $(seq 1 100); do
        grep -q "serving on" "$work/out" 2>/dev/null && break
        sleep 0.1
    done
    "$bin" --endpoint "http://127.0.0.1:$port" bench -b 1024 -w 32 --streams 8 -d "$seconds" \
        --interval 0 --output json 2>/dev/null | python3 -c "
import json, sys
r = json.load(sys.stdin)
w, rd = r['write'], r.get('read') or {}
print(f\"$label: write {w['records_per_sec']:.0f} rec/s p99 {w['p99_ms']:.2f} ms, read {rd.get('records_per_sec', 0):.0f} rec/s\")
"
    local segments
    segments=$(find "$work/objects" -name '*.seg' | wc -l)
    echo "$label: $segments segment objects left"
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    rm -rf "$work"
}

for round in $(seq 1 "$rounds"); do
    echo "round $round"
    run off
    run on --default-retention-bytes 1MiB
done
