#!/usr/bin/env bash
# Catalog size and metadata bytes written per MiB of segments (BENCHMARKS.md, "A catalog that
# stays small"): a fixed run of 1 KiB appends on 64 streams, then the segment catalog measured
# against the segment bytes it indexes, on SQLite and (when PICOMQ_PG_URL names a server) on
# Postgres.
#
#   scripts/bench-catalog.sh [DURATION_SEC]   (default 20)
#   PICO_BIN=/path/to/pico scripts/bench-catalog.sh 20   # another build, e.g. before/after
#
# SQLite: bytes the `pico-meta` thread wrote (its `wchar`: WAL appends and checkpoints) and the
# database's size afterwards. Postgres: the catalog tables' size growth in a fresh database of
# its own, and the server's WAL growth (`pg_current_wal_lsn`, server-wide: other databases'
# writes meanwhile count too, so it is an upper bound).
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-20}
PICO_BIN=${PICO_BIN:-target/release/pico}
[ -x "$PICO_BIN" ] || cargo build --release -p pico-cli >/dev/null

meta_wchar() { # server pid → bytes written by its metadata thread so far
  local task
  for task in /proc/"$1"/task/*; do
    if [ "$(cat "$task/comm" 2>/dev/null)" = pico-meta ]; then
      awk '/^wchar:/ {print $2}' "$task/io"
      return
    fi
  done
  echo 0
}

run_catalog_case() { # backend (sqlite|postgres)
  local backend=$1 work port server meta_url wchar_before wchar_after db="" lsn_before=0 rel_before=0
  work=$(mktemp -d /tmp/pico-catalog.XXXXXX)
  port=$((20000 + RANDOM % 12000))
  if [ "$backend" = postgres ]; then
    db="picomq_catalog_$$_$RANDOM"
    psql -q "$PICOMQ_PG_URL" -c "CREATE DATABASE $db" >/dev/null
    meta_url="${PICOMQ_PG_URL%/*}/$db"
  else
    meta_url="sqlite:$work/meta.db"
  fi
  # --durability local on both: the same segments and commit rounds, only the catalog differs.
  "$PICO_BIN" serve --listen "127.0.0.1:$port" --ds-listen off --admin-listen "127.0.0.1:$((port + 1))" \
    --meta-url "$meta_url" --storage "-2@file://$work/objects" --wal-dir "$work/wal" \
    --durability local >"$work/server.out" 2>"$work/server.log" &
  server=$!
  for _ in $(seq 1 300); do
    grep -q "serving on" "$work/server.out" 2>/dev/null && break
    kill -0 "$server" 2>/dev/null || break
    sleep 0.1
  done
  catalog_sql="SELECT count(*), coalesce(sum(length(runs)), 0) FROM segment_streams"
  if [ "$backend" = postgres ]; then
    rel_sql="SELECT pg_total_relation_size('segment_streams') + pg_total_relation_size('segments')"
    rel_before=$(psql -tA "$meta_url" -c "$rel_sql")
    lsn_before=$(psql -tA "$meta_url" -c "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
  fi
  wchar_before=$(meta_wchar "$server")
  "$PICO_BIN" --endpoint "http://127.0.0.1:$port" bench -b 1024 -w 64 --streams 64 \
    --no-read --keep -d "$duration" --interval 0 --output json \
    >"$work/bench.json" 2>"$work/bench.err" || true
  # Segments seal at --segment-max-age-ms (2 s) at the latest: let the last ones commit.
  sleep 4
  wchar_after=$(meta_wchar "$server")
  local rows runs_bytes meta_bytes wal_bytes=""
  if [ "$backend" = postgres ]; then
    read -r rows runs_bytes < <(psql -tA -F ' ' "$meta_url" -c "$catalog_sql")
    meta_bytes=$(($(psql -tA "$meta_url" -c "$rel_sql") - rel_before))
    wal_bytes=$(($(psql -tA "$meta_url" -c "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn" | cut -d. -f1) - ${lsn_before%.*}))
  fi
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  if [ "$backend" = sqlite ]; then
    read -r rows runs_bytes < <(sqlite3 -separator ' ' "$work/meta.db" "$catalog_sql")
    meta_bytes=$(stat -c %s "$work/meta.db")
  fi
  local segment_bytes
  segment_bytes=$(find "$work/objects" -type f -name '*.seg' -printf '%s\n' | awk '{s += $1} END {print s + 0}')
  python3 - "$backend" "$segment_bytes" "$rows" "$runs_bytes" "$meta_bytes" \
    "$((wchar_after - wchar_before))" "$wal_bytes" "$(cat "$work/bench.json")" <<'PY'
import json, sys
backend, seg, rows, runs, meta, wchar, wal, raw = sys.argv[1:]
seg, rows, runs, meta, wchar = int(seg), int(rows), int(runs), int(meta), int(wchar)
mib = seg / 2**20 or 1
try:
    rate = f"{json.loads(raw)['write']['records_per_sec']:,.0f}"
except Exception:
    rate = "?"
avg = runs / rows if rows else 0
if backend == "sqlite":
    written = f"{wchar / mib:,.0f} B written by pico-meta"
    size = f"{meta:,} B database ({100 * meta / (seg or 1):.3f} %)"
else:
    written = f"{int(wal) / mib:,.0f} B WAL (server-wide)"
    size = f"{meta:,} B tables ({100 * meta / (seg or 1):.3f} %)"
print(f"| catalog, {backend} | {rate} rec/s | {seg / 2**20:,.0f} MiB | {rows:,} rows, runs avg {avg:,.0f} B | {size} | {written} per MiB |")
PY
  rm -rf "$work"
  if [ -n "$db" ]; then psql -q "$PICOMQ_PG_URL" -c "DROP DATABASE $db" >/dev/null; fi
}

echo "| case | appends | segments | segment-stream rows | catalog size (share of segments) | metadata written |"
echo "|---|---:|---:|---:|---:|---:|"
run_catalog_case sqlite
if [ -n "${PICOMQ_PG_URL:-}" ]; then
  run_catalog_case postgres
fi
