#!/usr/bin/env bash
# Catch-up reads (BENCHMARKS.md, "W4"): a 64 MiB Durable Streams stream (1,024 records of
# 64 KiB), 8 readers reading it whole again and again over HTTP/1.1 (one curl --parallel
# process), the server pinned to CPU 0 and the client to CPU 1, each server on a fresh data
# directory. A whole read follows Stream-Next-Offset from -1 until Stream-Up-To-Date; chunk
# boundaries are stable, so the walk is done once and replayed. Prints one Markdown row per
# server: PicoMQ, and the comparison server when it is installed (`cargo install --locked
# durable-streams@0.1.5`, or PEER_BIN=/path/to/durable-streams-server; PEER_BIN=none leaves it out).
#
#   scripts/bench-catch-up.sh [ROUNDS] [pico serve flags...]   (default 8 rounds per reader)
#   PICO_BIN=/path/to/pico scripts/bench-catch-up.sh 8 --catch-up-read-size 64KiB
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-8}
shift || true
. scripts/lib/side-by-side.sh
find_servers

one_server() { # name, then the server's command line (PORT and DIR are substituted)
  local name=$1 work url next offset headers n start end
  shift
  work=$(mktemp -d /tmp/pico-catch-up.XXXXXX)
  start_pinned "$work" "$@"
  url=$server_url/w4
  curl -s -o /dev/null -X PUT -H 'content-type: application/octet-stream' "$url"
  head -c 65536 /dev/urandom >"$work/record"
  for i in $(seq 1 1024); do
    [ "$i" -gt 1 ] && echo next
    printf 'url = "%s"\ndata-binary = "@%s"\nheader = "content-type: application/octet-stream"\noutput = "/dev/null"\n' \
      "$url" "$work/record"
  done >"$work/appends"
  curl -s --parallel --parallel-max 16 -K "$work/appends" 2>/dev/null
  offset=-1
  : >"$work/walk"
  for _ in $(seq 1 5000); do
    headers=$(curl -s -D - -o /dev/null "$url?offset=$offset" | tr -d '\r')
    printf 'url = "%s?offset=%s"\noutput = "/dev/null"\n' "$url" "$offset" >>"$work/walk"
    echo "$headers" | grep -qi '^stream-up-to-date: true' && break
    next=$(echo "$headers" | awk -F': ' 'tolower($1)=="stream-next-offset"{print $2}')
    [ -n "$next" ] && [ "$next" != "$offset" ] || { echo "no progress at $offset" >&2; break; }
    offset=$next
  done
  n=$(grep -c '^url' "$work/walk")
  for _ in $(seq 1 $((8 * rounds))); do cat "$work/walk"; done |
    awk '/^url/ && NR > 1 {print "next"} {print}' >"$work/reads"
  start=$(date +%s.%N)
  taskset -c 1 curl -s --parallel --parallel-max 8 -K "$work/reads" 2>/dev/null
  end=$(date +%s.%N)
  local peak_mib
  peak_mib=$(awk '/^VmHWM:/ { printf "%.0f", $2 / 1024 }' "/proc/$server_pid/status")
  stop_pinned
  rm -rf "$work"
  python3 -c "
secs = $end - $start
print(f'| $name | $n | {8 * $rounds} | {secs:.2f} | {8 * $rounds * 64 / secs:,.0f} | $peak_mib MiB |')"
}

echo "| server | requests per whole read | whole reads (8 readers) | seconds | MiB/s | peak RSS |"
echo "|---|---:|---:|---:|---:|---:|"
one_server "PicoMQ ${*:-(defaults)}" "$PICO_BIN" serve --protocol ds --cores 1 \
  --listen 127.0.0.1:PORT --admin-listen 127.0.0.1:0 --meta-url sqlite:DIR/meta.db \
  --storage -2@file://DIR/objects --wal-dir DIR/wal --block-cache-size 256MiB "$@"
if [ -n "$peer" ]; then
  one_server "durable-streams-server 0.1.5 (--durability wal)" "$peer" "${peer_serve[@]}"
fi
