# shellcheck shell=bash
# Sourced by the side-by-side benchmarks (bench-appends-h1.sh, bench-catch-up.sh,
# bench-live.sh), run from the checkout's root; `start_pinned` and `stop_pinned` below run the
# server under test. `find_servers` sets `PICO_BIN` (as given, else
# a release build of this checkout, built now) and `peer`, the comparison server: `PEER_BIN`
# when set (`none` leaves it out, empty), else `durable-streams-server` on the PATH, else
# /opt/ds-0.1.5/bin/durable-streams-server when it is there.
find_servers() {
  if [ -z "${PICO_BIN:-}" ]; then
    cargo build --release -p pico-cli >/dev/null
    PICO_BIN=target/release/pico
  fi
  peer=${PEER_BIN:-$(command -v durable-streams-server || true)}
  [ "$peer" = none ] && peer=
  if [ -z "${PEER_BIN:-}" ] && [ -z "$peer" ] && [ -x /opt/ds-0.1.5/bin/durable-streams-server ]; then
    peer=/opt/ds-0.1.5/bin/durable-streams-server
  fi
  return 0
}

# The two servers as every side-by-side benchmark runs them (PORT and DIR are substituted by
# `start_pinned`): PicoMQ speaking Durable Streams on the embedded default (SQLite, `file://`,
# acknowledgements after `fdatasync`), and the comparison server with its WAL, likewise.
pico_serve=(serve --protocol ds --listen 127.0.0.1:PORT --no-admin --meta-url sqlite:DIR/meta.db
  --storage -2@file://DIR/objects --wal-dir DIR/wal)
peer_serve=(--host 127.0.0.1 --port PORT --data-dir DIR --durability wal)

# `start_pinned DIR command...` runs a server's command on CPU 0 with PORT (a random one) and
# DIR (its data directory) substituted, its output in DIR/server.log, and waits up to 10 s
# until it answers HTTP. Sets `server_pid` and `server_url` (http://127.0.0.1:PORT).
start_pinned() {
  local dir=$1 port
  shift
  port=$((20000 + RANDOM % 12000))
  local args=("${@//PORT/$port}")
  args=("${args[@]//DIR/$dir}")
  # glommio locks memory for its rings.
  ulimit -l unlimited 2>/dev/null || true
  taskset -c 0 "${args[@]}" >"$dir/server.log" 2>&1 &
  server_pid=$!
  server_url=http://127.0.0.1:$port
  for _ in $(seq 1 100); do
    curl -s -o /dev/null -m 1 "$server_url/" && break
    sleep 0.1
  done
}

# `stop_pinned` stops the server `start_pinned` started last.
stop_pinned() {
  kill "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
}
