#!/usr/bin/env bash
# Profile a node under load: starts a release `pico serve` on a fresh data directory, runs
# `pico bench` against it, records the server with `perf record -g`, and renders a flamegraph.
#
#   scripts/profile.sh [OUT.svg] [-- extra pico bench flags]
#   e.g. scripts/profile.sh /tmp/append.svg -- --http2 -b 1024 -w 512 --connections 4 --streams 4
#
# Needs perf (Debian: linux-perf) and inferno (cargo install inferno); both are installed when
# missing. The profile covers the server only, sampled at 999 Hz with DWARF-free frame-pointer
# call graphs (release builds keep line tables, see Cargo.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/pico-flamegraph.svg}
shift || true
[ "${1:-}" = "--" ] && shift
bench_flags=("$@")
[ ${#bench_flags[@]} -eq 0 ] && bench_flags=(--http2 -b 1024 -w 512 --connections 4 --streams 4)

command -v perf >/dev/null || { apt-get update -qq && apt-get install -y -qq linux-perf; }
command -v inferno-flamegraph >/dev/null || cargo install --locked inferno
cargo build --release -p pico-cli

work=$(mktemp -d /tmp/pico-profile.XXXXXX)
port=$((20000 + RANDOM % 20000))
target/release/pico serve --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$((port + 1))" \
  --meta-url "sqlite:$work/meta.db" --storage "-2@file://$work/objects" --wal-dir "$work/wal" \
  >"$work/server.out" 2>"$work/server.log" &
server=$!
trap 'kill "$server" 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 1 100); do grep -q "serving on" "$work/server.out" 2>/dev/null && break; sleep 0.1; done

perf record -F 999 -g -p "$server" -o "$work/perf.data" -- sleep 12 >/dev/null 2>&1 &
recorder=$!
# Global flags such as --http2 may follow the subcommand.
target/release/pico --endpoint "http://127.0.0.1:$port" bench "${bench_flags[@]}" -d 10 || true
wait "$recorder" || true
perf script -i "$work/perf.data" 2>/dev/null | inferno-collapse-perf | inferno-flamegraph >"$out"
echo "flamegraph: $out"
