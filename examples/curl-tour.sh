#!/usr/bin/env bash
# Every Pico protocol operation with curl, against a running node. Each command is printed as
# it can be pasted back into a shell, followed by the server's answer; the script stops with an
# error when an answer's status is not the one the tour expects.
# Usage: examples/curl-tour.sh [ENDPOINT]   (default http://127.0.0.1:4437)
set -euo pipefail
base=${1:-http://127.0.0.1:4437}
s="$base/examples/tour-$$"
# The script's stdout, for curl's output while `show` captures the status.
exec 3>&1

# One argument as a shell word: bare when that is safe, else single-quoted.
quote() {
  if [[ $1 =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
    printf '%s' "$1"
  else
    printf "'%s'" "${1//\'/\'\\\'\'}"
  fi
}

# `show STATUS curl ...`: prints the command, runs it, prints its output and checks that the
# answer's status was STATUS (curl reports it on a side channel, so the printed command is
# the one that ran).
show() {
  local want=$1 word got
  shift
  echo
  printf '$'
  for word in "$@"; do printf ' %s' "$(quote "$word")"; done
  echo
  got=$("$@" --write-out '%{stderr}%{http_code}' 2>&1 1>&3 || true)
  echo
  if [ "$got" != "$want" ]; then
    echo "curl-tour: expected $want, got ${got:-no answer}" >&2
    exit 1
  fi
}

show 201 curl -si -X PUT -H 'Content-Type: text/plain' "$s"
show 200 curl -si -X POST --data 'hello' "$s"
show 200 curl -s -X POST -H 'Content-Type: application/vnd.picomq.batch+json' \
  --data '{"records":[{"headers":{"k":"v"},"body":"two"},{"body":"three"}]}' "$s"
show 200 curl -s "$s?seq=0"
show 200 curl -s "$s?seq=1&count=1&format=raw"
# Idempotent producer: the retry of seq 0 is answered as a duplicate, nothing is written twice.
for _ in 1 2; do
  show 200 curl -si -X POST -H 'Pico-Producer-Id: tour' -H 'Pico-Producer-Epoch: 0' \
    -H 'Pico-Producer-Seq: 0' --data 'once' "$s"
done
show 412 curl -si -X POST -H 'Pico-Match-Seq: 99' --data 'conditional' "$s"
show 200 curl -si -X POST -H 'Pico-Trim-Seq: 1' "$s"
# Below the start is gone: 410.
show 410 curl -si "$s?seq=0"
# A long-poll for the next record: answered as soon as it is appended. It asks for that record
# by number (not `seq=now`), so it gets it even when the append lands first.
next=$(curl -sI "$s" | tr -d '\r' | sed -n 's/^pico-next-seq: //Ip')
show 200 curl -si "$s?seq=$next&live=long-poll" --max-time 30 &
poll=$!
curl -s -X POST --data 'wakes the long-poll' "$s" >/dev/null
wait "$poll"
show 200 curl -sI "$s"
show 200 curl -s "$base/?prefix=/examples/"
show 200 curl -si -X POST -H 'Pico-Closed: true' "$s"
# Server-sent events from the first record still there (the trim above moved the start); the
# stream is closed, so the response ends after the last record.
start=$(curl -sI "$s" | tr -d '\r' | sed -n 's/^pico-start-seq: //Ip')
show 200 curl -s -N "$s?seq=$start&live=sse"
show 204 curl -si -X DELETE "$s"
