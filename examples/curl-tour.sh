#!/usr/bin/env bash
# Every Pico protocol operation with curl, against a running node.
# Usage: examples/curl-tour.sh [ENDPOINT]   (default http://127.0.0.1:4437)
set -euo pipefail
base=${1:-http://127.0.0.1:4437}
s="$base/examples/tour-$$"
show() { echo; echo "\$ $*"; "$@"; echo; }

show curl -si -X PUT -H 'Content-Type: text/plain' "$s"
show curl -si -X POST --data 'hello' "$s"
show curl -s -X POST -H 'Content-Type: application/vnd.picomq.batch+json' \
  --data '{"records":[{"headers":{"k":"v"},"body":"two"},{"body":"three"}]}' "$s"
show curl -s "$s?seq=0"
show curl -s "$s?seq=1&count=1&format=raw"
# Idempotent producer: the retry of seq 0 is answered as a duplicate, nothing is written twice.
for _ in 1 2; do
  show curl -si -X POST -H 'Pico-Producer-Id: tour' -H 'Pico-Producer-Epoch: 0' \
    -H 'Pico-Producer-Seq: 0' --data 'once' "$s"
done
show curl -si -X POST -H 'Pico-Match-Seq: 99' --data 'conditional' "$s"
show curl -si -X POST -H 'Pico-Trim-Seq: 1' "$s"
show curl -si "$s?seq=0"
show curl -si "$s?seq=now&live=long-poll" --max-time 30 &
sleep 0.5
curl -s -X POST --data 'wakes the long-poll' "$s" >/dev/null
wait
show curl -sI "$s"
show curl -s "$base/?prefix=/examples/"
show curl -si -X POST -H 'Pico-Closed: true' "$s"
show curl -s -N "$s?seq=0&live=sse"
show curl -si -X DELETE "$s"
