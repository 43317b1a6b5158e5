#!/usr/bin/env bash
# Starts a single-node Garage S3 server (https://garagehq.deuxfleurs.fr) for the s3:// tests.
#
# Idempotent: if the instance of $GARAGE_DIR is already running and answering, it is reused;
# otherwise it is (re)started on the same data. Writes the server PID to $GARAGE_DIR/pid.
# Stop it with: kill "$(cat "$GARAGE_DIR/pid")"
#
# Settings (environment, all optional):
#   GARAGE_BIN       garage binary                    (default: garage)
#   GARAGE_DIR       config, data, log and pid        (default: /tmp/garage-ci)
#   GARAGE_S3_PORT   S3 API port on 127.0.0.1         (default: 3900)
#   GARAGE_RPC_PORT  internal RPC port on 127.0.0.1   (default: S3 port + 1)
#   S3_AK / S3_SK    access key ("GK" + 24 hex) / secret (64 hex)
#   S3_BUCKET        bucket created at start          (default: segments)
# The region is "garage"; URLs are path-style. Ready when GET / answers 403.
#
# Install Garage once: scripts/garage-install.sh
set -euo pipefail
GARAGE_BIN=${GARAGE_BIN:-garage}
GARAGE_DIR=${GARAGE_DIR:-/tmp/garage-ci}
GARAGE_S3_PORT=${GARAGE_S3_PORT:-3900}
GARAGE_RPC_PORT=${GARAGE_RPC_PORT:-$((GARAGE_S3_PORT + 1))}
export GARAGE_DEFAULT_ACCESS_KEY=${S3_AK:-GK0123456789abcdef01234567}
export GARAGE_DEFAULT_SECRET_KEY=${S3_SK:-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef}
export GARAGE_DEFAULT_BUCKET=${S3_BUCKET:-segments}
url="http://127.0.0.1:$GARAGE_S3_PORT/"

command -v "$GARAGE_BIN" >/dev/null || {
  echo "garage-up: '$GARAGE_BIN' not found; install it with:" >&2
  echo "  scripts/garage-install.sh" >&2
  exit 1
}

answers_403() {
  [ "$(curl -s -o /dev/null -m 2 -w '%{http_code}' "$url" || true)" = 403 ]
}

mkdir -p "$GARAGE_DIR"
if [ -f "$GARAGE_DIR/pid" ] && kill -0 "$(cat "$GARAGE_DIR/pid")" 2>/dev/null && answers_403; then
  echo "garage already up (pid $(cat "$GARAGE_DIR/pid"), $url)"
  exit 0
fi

# The config is rewritten on every start (ports may change); the RPC secret is kept.
secret=$(sed -n 's/^rpc_secret = "\([0-9a-f]*\)"$/\1/p' "$GARAGE_DIR/garage.toml" 2>/dev/null || true)
[ -n "$secret" ] || secret=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
cat >"$GARAGE_DIR/garage.toml" <<CONF
metadata_dir = "$GARAGE_DIR/meta"
data_dir = "$GARAGE_DIR/data"
db_engine = "lmdb"
replication_factor = 1
rpc_bind_addr = "127.0.0.1:$GARAGE_RPC_PORT"
rpc_public_addr = "127.0.0.1:$GARAGE_RPC_PORT"
rpc_secret = "$secret"

[s3_api]
s3_region = "garage"
api_bind_addr = "127.0.0.1:$GARAGE_S3_PORT"
root_domain = ".s3.garage.localhost"
CONF

if answers_403; then
  echo "garage-up: something else already answers on $url" >&2
  exit 1
fi

# Detached from our stdout/stderr so callers capturing this script's output do not hang.
"$GARAGE_BIN" -c "$GARAGE_DIR/garage.toml" server --single-node --default-bucket \
  >"$GARAGE_DIR/log" 2>&1 </dev/null &
echo $! >"$GARAGE_DIR/pid"
for _ in $(seq 1 300); do
  if answers_403; then
    echo "garage up (pid $(cat "$GARAGE_DIR/pid"), $url, bucket $GARAGE_DEFAULT_BUCKET)"
    exit 0
  fi
  if ! kill -0 "$(cat "$GARAGE_DIR/pid")" 2>/dev/null; then
    break
  fi
  sleep 0.1
done
echo "garage did not come up on $url; log:" >&2
tail -20 "$GARAGE_DIR/log" >&2
exit 1
