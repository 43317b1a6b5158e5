# shellcheck shell=bash
# Sourced by the side-by-side benchmarks (bench-appends-h1.sh, bench-catch-up.sh,
# bench-live.sh), run from the checkout's root: `find_servers` sets `PICO_BIN` (as given, else
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
