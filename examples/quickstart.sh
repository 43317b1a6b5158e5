#!/usr/bin/env bash
# The README's usage sequence against a running node (`pico serve` in another terminal).
# Usage: examples/quickstart.sh [ENDPOINT]   (default http://127.0.0.1:4437)
set -euo pipefail
export PICO_ENDPOINT=${1:-${PICO_ENDPOINT:-http://127.0.0.1:4437}}
stream=/examples/orders-$$

pico create "$stream" --content-type text/plain
seq 1 1000 | pico append "$stream"              # batched: one request here
pico read "$stream" | head -3
echo "..."
pico read "$stream" | tail -2

# A follower prints what arrives after it started, until the stream is closed.
pico tail -f "$stream" &
follower=$!
sleep 0.5
printf 'late-1\nlate-2\n' | pico append "$stream"
pico close "$stream"
wait "$follower"
pico delete "$stream"
