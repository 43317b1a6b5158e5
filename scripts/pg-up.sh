#!/usr/bin/env bash
# Starts the machine's PostgreSQL cluster on 127.0.0.1:5432 for the Postgres tests (idempotent:
# a cluster that already runs is reused), sets the password of user postgres to "postgres" and
# creates database picomq. Installs Debian's postgresql package first when it is missing.
#
#   scripts/pg-up.sh
#   export PICOMQ_PG_URL=postgres://postgres:postgres@127.0.0.1:5432/picomq
#
# Stop it with: pg_ctlcluster <version> main stop
set -euo pipefail

if ! command -v pg_ctlcluster >/dev/null; then
  apt-get update -qq && apt-get install -y -qq postgresql
fi
version=$(ls /usr/lib/postgresql | sort -n | tail -1)
pg_lsclusters -h | awk '{print $1, $2}' | grep -qx "$version main" || pg_createcluster "$version" main
port=$(pg_lsclusters -h | awk -v v="$version" '$1 == v && $2 == "main" {print $3}')
if [ "$port" != 5432 ]; then
  echo "pg-up: cluster $version/main is configured for port $port, not 5432" >&2
  exit 1
fi
pg_ctlcluster "$version" main status >/dev/null 2>&1 || pg_ctlcluster "$version" main start

# Bounded wait until it accepts connections on 127.0.0.1.
for _ in $(seq 1 60); do
  pg_isready -q -h 127.0.0.1 -p 5432 && break
  sleep 0.5
done
pg_isready -h 127.0.0.1 -p 5432

runuser -u postgres -- psql -qc "ALTER USER postgres PASSWORD 'postgres'"
runuser -u postgres -- psql -tAc "SELECT 1 FROM pg_database WHERE datname = 'picomq'" | grep -q 1 ||
  runuser -u postgres -- createdb picomq
echo "pg-up: postgres://postgres:***@127.0.0.1:5432/picomq is ready"
