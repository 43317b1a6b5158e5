# Sourced by scripts that need a throwaway node: `start_fresh_node ARGS...` runs
# `$PICO_BIN serve ARGS...` on 127.0.0.1 (port $FRESH_NODE_PORT, else one the kernel picks)
# with its data in a new temporary directory, sets `node_url` (e.g. http://127.0.0.1:41234),
# `node_dir` and `node_log`, and stops the node and removes the directory when the script exits.

# `$PICO_BIN` as given, else a release build of this checkout (built now).
resolve_pico_bin() {
  if [ -z "${PICO_BIN:-}" ]; then
    cargo build --release --locked -p pico-cli
    PICO_BIN=$(pwd)/target/release/pico
  fi
}

start_fresh_node() {
  node_dir=$(mktemp -d /tmp/pico-node.XXXXXX)
  node_log=$node_dir/server.log
  # glommio needs locked memory for its rings.
  ulimit -l unlimited 2>/dev/null || ulimit -l 8192 2>/dev/null || true
  # No Durable Streams listener on its default port 4438 unless the caller asks for one.
  local second=(--ds-listen off)
  [[ " $* " == *" --ds-listen "* ]] && second=()
  "$PICO_BIN" serve --listen "127.0.0.1:${FRESH_NODE_PORT:-0}" "${second[@]}" --no-admin \
    --meta-url "sqlite:$node_dir/meta.db" --storage "-2@file://$node_dir/objects" \
    --wal-dir "$node_dir/wal" "$@" >"$node_log" 2>&1 &
  node_pid=$!
  trap stop_fresh_node EXIT
  node_url=""
  # The kernel's port is read back from the "serving on" line.
  for _ in $(seq 1 300); do
    node_url=$(sed -n 's/^serving on \(http:\/\/[^ ]*\).*/\1/p' "$node_log" | head -n 1)
    [ -n "$node_url" ] && return 0
    kill -0 "$node_pid" 2>/dev/null || { cat "$node_log"; echo "pico serve exited" >&2; return 1; }
    sleep 0.1
  done
  cat "$node_log"
  echo "pico serve did not start in 30 s" >&2
  return 1
}

stop_fresh_node() {
  kill "$node_pid" 2>/dev/null || true
  wait "$node_pid" 2>/dev/null || true
  rm -rf "$node_dir"
}
