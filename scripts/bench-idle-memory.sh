#!/usr/bin/env bash
# Idle memory, side by side (BENCHMARKS.md, "Idle memory"): each server on a fresh data
# directory, pinned to CPU 0 as in the other side-by-side benchmarks, gets one stream and one
# append, then sits idle for SETTLE_SECONDS; its /proc/PID/status and smaps are read then.
# Prints one Markdown row per server: PicoMQ, and the comparison server when it is installed
# (`cargo install --locked durable-streams@0.1.5`, or PEER_BIN=/path/to/durable-streams-server;
# PEER_BIN=none leaves it out). RSS splits into anonymous memory (the process's own) and
# file-backed pages (the executable's and shared libraries' code and data, shared with every
# process mapping them); "own code" is the part of the latter that is the server's executable.
#
#   scripts/bench-idle-memory.sh [SETTLE_SECONDS]   (default 3)
set -euo pipefail
cd "$(dirname "$0")/.."
settle=${1:-3}
. scripts/lib/side-by-side.sh
find_servers
work=$(mktemp -d /tmp/pico-idle.XXXXXX)
trap 'rm -rf "$work"' EXIT

# `one NAME command...` (PORT and DIR are substituted in the command).
one() {
  local name=$1 dir
  shift
  dir=$(mktemp -d "$work/server.XXXXXX")
  start_pinned "$dir" "$@"
  curl -s -o /dev/null -X PUT -H 'content-type: application/octet-stream' "$server_url/idle/s"
  curl -s -o /dev/null -X POST -H 'content-type: application/octet-stream' --data-binary 'x' \
    "$server_url/idle/s"
  sleep "$settle"
  local exe
  exe=$(readlink "/proc/$server_pid/exe")
  SMAPS="/proc/$server_pid/smaps" EXE="$exe" python3 - "$name" "/proc/$server_pid/status" <<'PY'
import os, re, sys
name, status_path = sys.argv[1], sys.argv[2]
status = {}
for line in open(status_path):
    key, _, value = line.partition(":")
    if value.strip().endswith("kB"):
        status[key] = int(value.split()[0])
# The executable's resident pages, from each of its mappings' Rss.
own, mapping = 0, None
for line in open(os.environ["SMAPS"]):
    if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
        fields = line.split()
        mapping = fields[5] if len(fields) > 5 else ""
    elif line.startswith("Rss:") and mapping == os.environ["EXE"]:
        own += int(line.split()[1])
mib = lambda kib: f"{kib / 1024:.1f} MiB"
print(f"| {name} | {mib(status['VmRSS'])} | {mib(status['RssAnon'])} | {mib(status['RssFile'])}"
      f" | {mib(own)} | {status.get('VmPin', 0)} KiB |")
PY
  stop_pinned
}

echo "| server | RSS | anonymous | file-backed | own code and data | pinned |"
echo "|---|---:|---:|---:|---:|---:|"
one "PicoMQ" "$PICO_BIN" "${pico_serve[@]}"
if [ -n "$peer" ]; then
  one "durable-streams-server 0.1.5" "$peer" "${peer_serve[@]}"
fi
