#!/usr/bin/env bash
# Profile a node under load: starts a `pico serve` built for profiling on a fresh data
# directory, waits until its admin listener answers /ready, runs `pico bench` against it,
# records the server with `perf record`, renders a flamegraph and checks that the stacks are
# whole.
#
#   scripts/profile.sh [OUT.svg] [-- extra pico bench flags]
#   e.g. scripts/profile.sh /tmp/append.svg -- --http2 -b 1024 -w 512 --connections 4 --streams 4
#
# Needs perf (Debian: linux-perf), inferno (cargo install inferno) and curl; perf and inferno
# are installed when missing. The profile covers the server only, sampled at 999 Hz with
# frame-pointer call graphs. The server is the `profiling` build (Cargo.toml: the release
# profile with frame pointers forced in Rust and C code, in target/profiling), so that every
# frame finds its caller; a release build has none, and a fifth of its samples lost their
# callers.
#
# The flamegraph's title names the commit profiled (with `-dirty` when the work tree has
# changes) and the bench flags; its subtitle the script's command line, the binary's version
# and the server's flags.
#
# When anything fails (the node does not become ready within PICO_PROFILE_READY_TIMEOUT_SEC,
# default 60, or exits early, the bench fails, perf records nothing), the server's log is kept
# as OUT.server.log next to the flamegraph and its tail is printed.
#
# PICO_BIN names another `pico` to profile instead of building one.
#
# The share of samples with an `[unknown]` frame (a caller the unwinder could not find) must
# stay under PICO_PROFILE_MAX_UNKNOWN_PCT (default 5): the script fails above it, after
# writing the flamegraph.
set -euo pipefail
cd "$(dirname "$0")/.."
command_line="scripts/profile.sh $*"
out=${1:-/tmp/pico-flamegraph.svg}
shift || true
[ "${1:-}" = "--" ] && shift
bench_flags=("$@")
[ ${#bench_flags[@]} -eq 0 ] && bench_flags=(--http2 -b 1024 -w 512 --connections 4 --streams 4)
max_unknown=${PICO_PROFILE_MAX_UNKNOWN_PCT:-5}
ready_timeout_sec=${PICO_PROFILE_READY_TIMEOUT_SEC:-60}
if ! [[ "$ready_timeout_sec" =~ ^[1-9][0-9]{0,5}$ ]]; then
  echo "PICO_PROFILE_READY_TIMEOUT_SEC must be a whole number of seconds, 1 to 999999" >&2
  exit 2
fi
kept_log="${out%.svg}.server.log"

command -v perf >/dev/null || { apt-get update -qq && apt-get install -y -qq linux-perf; }
command -v inferno-flamegraph >/dev/null || cargo install --locked inferno
command -v curl >/dev/null || { apt-get update -qq && apt-get install -y -qq curl; }

commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
if [ "$commit" != unknown ] && ! git diff --quiet HEAD -- 2>/dev/null; then
  commit="$commit-dirty"
fi

if [ -n "${PICO_BIN:-}" ]; then
  # A binary of the caller's (another build to compare; the [unknown] check below tells
  # whether it keeps frame pointers).
  pico=$PICO_BIN
else
  # Frame pointers in the Rust code (all crates) and in the C code of dependencies (SQLite,
  # mimalloc, ring), built by the cc crate, which reads CFLAGS.
  RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }-C force-frame-pointers=yes" \
    CFLAGS="${CFLAGS:+$CFLAGS }-fno-omit-frame-pointer" \
    cargo build --profile profiling -p pico-cli
  pico=${CARGO_TARGET_DIR:-target}/profiling/pico
fi

work=$(mktemp -d /tmp/pico-profile.XXXXXX)
server=""
# On any failure: the server's log is kept beside the flamegraph and its tail printed.
finish() {
  local status=$?
  if [ -n "$server" ]; then
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
  fi
  if [ "$status" -ne 0 ] && [ -f "$work/server.log" ]; then
    cat "$work/server.out" "$work/server.log" >"$kept_log" 2>/dev/null || true
    echo "profile.sh failed (exit $status); the server's log is kept in $kept_log; its end:" >&2
    tail -n 40 "$kept_log" >&2 || true
  fi
  rm -rf "$work"
  exit "$status"
}
trap finish EXIT
fail() {
  echo "profile.sh: $*" >&2
  exit 1
}

# Port 0: the kernel picks free ports, read back from the lines the node prints on stdout.
serve_flags=(--listen 127.0.0.1:0 --ds-listen off --admin-listen 127.0.0.1:0
  --meta-url "sqlite:$work/meta.db" --storage "-2@file://$work/objects" --wal-dir "$work/wal")
# Made before the server starts, so they are there to read whenever it gets to write them.
: >"$work/server.out"
: >"$work/server.log"
"$pico" serve "${serve_flags[@]}" >"$work/server.out" 2>"$work/server.log" &
server=$!

# Ready: the admin listener answers /ready with 200 (every core serves, the WAL is healthy).
# Looked at every 0.1 s, so the timeout is a count of looks.
looks_left=$((ready_timeout_sec * 10))
url="" admin=""
until [ -n "$admin" ] && curl -fsS -o /dev/null --max-time 2 "$admin/ready" 2>/dev/null; do
  if ! kill -0 "$server" 2>/dev/null; then
    status=0
    wait "$server" || status=$?
    server=""
    fail "the server exited (status $status) before it was ready"
  fi
  looks_left=$((looks_left - 1))
  [ "$looks_left" -gt 0 ] || fail "the server was not ready within $ready_timeout_sec s"
  [ -n "$url" ] || url=$(sed -n 's/^serving on \(http:\/\/[^ ]*\).*/\1/p' "$work/server.out" | head -n 1)
  [ -n "$admin" ] || admin=$(sed -n 's/^admin on \(http:\/\/[^ ]*\).*/\1/p' "$work/server.out" | head -n 1)
  sleep 0.1
done
built=$("$pico" --version 2>/dev/null | head -n 1 || true)
echo "server ready: $url (admin $admin), ${built:-pico}, work tree at $commit"

perf record -F 999 --call-graph fp -p "$server" -o "$work/perf.data" -- sleep 12 >/dev/null 2>&1 &
recorder=$!
# Global flags such as --http2 may follow the subcommand.
bench_status=0
"$pico" --endpoint "$url" bench "${bench_flags[@]}" -d 10 || bench_status=$?
wait "$recorder" || true
kill -0 "$server" 2>/dev/null || { server=""; fail "the server exited during the bench"; }
[ "$bench_status" -eq 0 ] || fail "pico bench failed (exit $bench_status)"

perf script -i "$work/perf.data" 2>/dev/null | inferno-collapse-perf >"$work/stacks.folded"
[ -s "$work/stacks.folded" ] || fail "perf recorded no samples"
inferno-flamegraph \
  --title "pico serve @ $commit under pico bench ${bench_flags[*]}" \
  --subtitle "$command_line; ${built:-pico}: serve ${serve_flags[*]//$work/DATA}; perf 999 Hz, frame pointers" \
  <"$work/stacks.folded" >"$out"
echo "flamegraph: $out"

# One folded line per distinct stack: `frame;frame;... WEIGHT` (perf's sample periods, which
# exceed 32-bit integers: the arithmetic stays in awk's floating point).
read -r share samples < <(awk '{ n = $NF; total += n; if (index($0, "[unknown]")) unknown += n }
  END { if (total > 0) printf "%.1f %d\n", 100 * unknown / total, NR; else print "none 0" }' \
  "$work/stacks.folded")
[ "$share" != none ] || fail "perf recorded no samples"
echo "samples with an [unknown] frame: $share% (of $samples distinct stacks)"
if awk -v s="$share" -v m="$max_unknown" 'BEGIN { exit !(s > m) }'; then
  fail "more than $max_unknown% of the stacks are broken: is the server the profiling build?"
fi
