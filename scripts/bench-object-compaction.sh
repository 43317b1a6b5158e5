#!/bin/bash
# One object-durability bench against the local Garage, with the PUTs and objects compaction
# left (BENCHMARKS.md, "Compaction of small objects"):
#   scripts/bench-object-compaction.sh <pico binary> <label> <port> -- bench -b 256 -w 1 -d 10 --no-read --keep --interval 0
# Needs the services of scripts/garage-up.sh (PICOMQ_S3_ENDPOINT and AWS_* in the environment).
set -u
BIN=$1; LABEL=$2; PORT=$3; shift 4
DIR=${TMPDIR:-/tmp}/pico-object-bench/$LABEL; rm -rf "$DIR"; mkdir -p "$DIR"
ADMIN=$((PORT+1000))
STORAGE="-2@s3://segments?region=garage&endpoint=$PICOMQ_S3_ENDPOINT&pathStyle=true"
"$BIN" serve --listen 127.0.0.1:$PORT --ds-listen 127.0.0.1:0 --admin-listen 127.0.0.1:$ADMIN \
  --meta-url sqlite:$DIR/meta.db --wal-dir $DIR/wal --storage "$STORAGE" --cores 2 > $DIR/serve.log 2>&1 &
PID=$!
for _ in $(seq 50); do curl -sf http://127.0.0.1:$ADMIN/ready >/dev/null && break; sleep 0.2; done
m() { curl -s http://127.0.0.1:$ADMIN/metrics | awk -v n="$1" '$1 ~ "^"n"({|$)" {s+=$2} END {print s+0}'; }
"$BIN" --endpoint http://127.0.0.1:$PORT "$@" 2> $DIR/bench.txt
echo "== $LABEL: $*"
grep -E "Write:|Append latency" $DIR/bench.txt | tail -3
echo "uploads=$(m pico_uploads_total) compaction_puts=$(m pico_compaction_puts_total)"
# Long enough for the idle merge (COMPACT_IDLE_MS, 10 s) and its PUTs.
sleep 16
U=$(m pico_uploads_total); C=$(m pico_compactions_total); S=$(m pico_compacted_segments_total)
echo "after 16 s idle: uploads=$U compactions=$C compaction_puts=$(m pico_compaction_puts_total) compacted=$S objects=$((U - S + C)) bytes=$(m pico_compacted_bytes_total)"
kill $PID; wait $PID 2>/dev/null
