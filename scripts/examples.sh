#!/usr/bin/env bash
# Runs every script in examples/ against a fresh node, as a reader of the README would (`pico`
# on PATH, the node's endpoint as the argument), and fails when one of them fails.
#
#   scripts/examples.sh                          # builds the release binary first
#   PICO_BIN=target/debug/pico scripts/examples.sh
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/lib/fresh-node.sh
resolve_pico_bin
PATH=$(dirname "$(realpath "$PICO_BIN")"):$PATH

start_fresh_node

status=0
for example in examples/*.sh; do
  echo "== $example"
  # Each example stops at its first failing step (set -e; the curl tour also checks statuses).
  bash "$example" "$node_url" || { echo "examples: $example failed" >&2; status=1; }
done
if [ "$status" != 0 ]; then
  echo "--- server log (tail)"
  tail -n 30 "$node_log"
fi
exit "$status"
