#!/usr/bin/env bash
# Runs the official Durable Streams conformance suite (all 338 tests, subscriptions included)
# against a fresh `pico serve --protocol ds` on 127.0.0.1 and prints
# `conformance: N passed, N failed, N skipped`. Exits non-zero when any test fails or is skipped.
#
#   scripts/conformance.sh            # builds the release binary first
#   PICO_BIN=target/debug/pico scripts/conformance.sh -t 'SSE'   # extra args go to vitest
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/lib/fresh-node.sh
resolve_pico_bin
# `npm install` follows package-lock.json; `npm ci` trips over an optional Windows-only
# dependency the lock file leaves out (npm 11).
(cd conformance && { [ -d node_modules/@durable-streams/server-conformance-tests ] && [ -d node_modules/@durable-streams/client ] || npm ci --no-audit --no-fund; })

FRESH_NODE_PORT=${CONFORMANCE_PORT:-0} start_fresh_node --protocol ds --long-poll-timeout-sec 0.5 --sse-max-duration-sec 5
url=$node_url
log=$node_log

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
