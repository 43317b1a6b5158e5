#!/usr/bin/env bash
# Profile a node under load: starts a `pico serve` built for profiling on a fresh data
# directory, runs `pico bench` against it, records the server with `perf record`, renders a
# flamegraph and checks that the stacks are whole.
#
#   scripts/profile.sh [OUT.svg] [-- extra pico bench flags]
#   e.g. scripts/profile.sh /tmp/append.svg -- --http2 -b 1024 -w 512 --connections 4 --streams 4
#
# Needs perf (Debian: linux-perf) and inferno (cargo install inferno); both are installed when
# missing. The profile covers the server only, sampled at 999 Hz with frame-pointer call
# graphs. The server is the `profiling` build (Cargo.toml: the release profile with frame
# pointers forced in Rust and C code, in target/profiling), so that every frame finds its
# caller; a release build has none, and a fifth of its samples lost their callers.
#
# The share of samples with an `[unknown]` frame (a caller the unwinder could not find) must
# stay under PICO_PROFILE_MAX_UNKNOWN_PCT (default 5): the script fails above it, after
# writing the flamegraph.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/pico-flamegraph.svg}
shift || true
[ "${1:-}" = "--" ] && shift
bench_flags=("$@")
[ ${#bench_flags[@]} -eq 0 ] && bench_flags=(--http2 -b 1024 -w 512 --connections 4 --streams 4)
max_unknown=${PICO_PROFILE_MAX_UNKNOWN_PCT:-5}

command -v perf >/dev/null || { apt-get update -qq && apt-get install -y -qq linux-perf; }
command -v inferno-flamegraph >/dev/null || cargo install --locked inferno
# Frame pointers in the Rust code (all crates) and in the C code of dependencies (SQLite,
# mimalloc, ring), built by the cc crate, which reads CFLAGS.
RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }-C force-frame-pointers=yes" \
  CFLAGS="${CFLAGS:+$CFLAGS }-fno-omit-frame-pointer" \
  cargo build --profile profiling -p pico-cli
pico=target/profiling/pico

work=$(mktemp -d /tmp/pico-profile.XXXXXX)
port=$((20000 + RANDOM % 20000))
"$pico" serve --listen "127.0.0.1:$port" --ds-listen off --admin-listen "127.0.0.1:$((port + 1))" \
  --meta-url "sqlite:$work/meta.db" --storage "-2@file://$work/objects" --wal-dir "$work/wal" \
  >"$work/server.out" 2>"$work/server.log" &
server=$!
trap 'kill "$server" 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 1 100); do grep -q "serving on" "$work/server.out" 2>/dev/null && break; sleep 0.1; done

perf record -F 999 --call-graph fp -p "$server" -o "$work/perf.data" -- sleep 12 >/dev/null 2>&1 &
recorder=$!
# Global flags such as --http2 may follow the subcommand.
"$pico" --endpoint "http://127.0.0.1:$port" bench "${bench_flags[@]}" -d 10 || true
wait "$recorder" || true
perf script -i "$work/perf.data" 2>/dev/null | inferno-collapse-perf >"$work/stacks.folded"
inferno-flamegraph <"$work/stacks.folded" >"$out"
echo "flamegraph: $out"

# One folded line per distinct stack: `frame;frame;... WEIGHT` (perf's sample periods, which
# exceed 32-bit integers: the arithmetic stays in awk's floating point).
read -r share samples < <(awk '{ n = $NF; total += n; if (index($0, "[unknown]")) unknown += n }
  END { if (total > 0) printf "%.1f %d\n", 100 * unknown / total, NR; else print "none 0" }' \
  "$work/stacks.folded")
[ "$share" != none ] || { echo "perf recorded no samples" >&2; exit 1; }
echo "samples with an [unknown] frame: $share% (of $samples distinct stacks)"
if awk -v s="$share" -v m="$max_unknown" 'BEGIN { exit !(s > m) }'; then
  echo "more than $max_unknown% of the stacks are broken: is the server the profiling build?" >&2
  exit 1
fi
