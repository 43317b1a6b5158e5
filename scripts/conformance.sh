#!/usr/bin/env bash
# Runs the official Durable Streams conformance suite (all 338 tests, subscriptions included)
# against a fresh `pico serve --protocol ds` on 127.0.0.1 and prints
# `conformance: N passed, N failed, N skipped`. Exits non-zero when any test fails or is skipped.
#
#   scripts/conformance.sh            # builds the release binary first
#   PICO_BIN=target/debug/pico scripts/conformance.sh -t 'SSE'   # extra args go to vitest
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

# Port 0 by default: the kernel picks a free one, read back from the "serving on" line.
port=${CONFORMANCE_PORT:-0}
if [ -z "${PICO_BIN:-}" ]; then
  cargo build --release --locked -p pico-cli
  PICO_BIN=$root/target/release/pico
fi
# `npm install` follows package-lock.json; `npm ci` trips over an optional Windows-only
# dependency the lock file leaves out (npm 11).
(cd conformance && { [ -d node_modules/@durable-streams/server-conformance-tests ] || npm install --no-audit --no-fund --no-save; })

data=$(mktemp -d /tmp/pico-conformance.XXXXXX)
log=$data/server.log
# glommio needs locked memory for its rings.
ulimit -l unlimited 2>/dev/null || ulimit -l 8192 2>/dev/null || true
"$PICO_BIN" serve --protocol ds --listen "127.0.0.1:$port" --no-admin \
  --meta-url "sqlite:$data/meta.db" --storage "-2@file://$data/objects" --wal-dir "$data/wal" \
  --long-poll-timeout-sec 0.5 --sse-max-duration-sec 5 >"$log" 2>&1 &
pid=$!
cleanup() {
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rm -rf "$data"
}
trap cleanup EXIT
url=""
for _ in $(seq 1 300); do
  url=$(sed -n 's/^serving on \(http:\/\/[^ ]*\).*/\1/p' "$log" | head -n 1)
  [ -n "$url" ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$log"; echo "pico serve exited" >&2; exit 1; }
  sleep 0.1
done
[ -n "$url" ] || { cat "$log"; echo "pico serve did not start in 30 s" >&2; exit 1; }

cd conformance
status=0
CONFORMANCE_TEST_URL="$url" CONFORMANCE_LONG_POLL_TIMEOUT_MS=500 \
  CONFORMANCE_SUBSCRIPTIONS=1 timeout 900 npx --no-install vitest run conformance.test.mjs \
  --reporter=dot --reporter=json --outputFile.json=conformance-results.json "$@" || status=$?
node summarize.mjs conformance-results.json || status=1
if [ "$status" != 0 ]; then
  echo "--- server log (tail)"
  tail -n 30 "$log"
fi
exit "$status"
