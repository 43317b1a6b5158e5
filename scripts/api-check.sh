#!/usr/bin/env bash
# Checks the OpenAPI descriptions in docs/openapi/ against a fresh node with schemathesis, a
# property-based API tester: it sends generated requests (valid ones and broken ones) to every
# operation and fails on any 5xx, any status code the description does not list, and any body
# that does not match its schema.
#
#   scripts/api-check.sh                        # builds target/debug/pico first
#   PICO_BIN=target/debug/pico scripts/api-check.sh
#   API_CHECK_SEED=7 API_CHECK_MAX_EXAMPLES=200 scripts/api-check.sh pico   # one description
#
# Arguments name the descriptions to check (pico, durable-streams, admin; default all three).
# SCHEMATHESIS is the `st` executable (default: PICOMQ_SCHEMATHESIS, else `st` on PATH; install
# with `pip install -r conformance/api/requirements.txt`). The run is reproducible: the seed is
# fixed (API_CHECK_SEED, default 1), so a failure replays with the same seed; the log says which
# seed it used. API_CHECK_MAX_EXAMPLES (default 50) bounds the requests per operation and phase,
# which keeps the whole check under about two minutes on a busy 2-core machine.
# API_CHECK_REPORT_DIR, when set, keeps schemathesis' JUnit report and cassettes there.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

st=${SCHEMATHESIS:-${PICOMQ_SCHEMATHESIS:-st}}
seed=${API_CHECK_SEED:-1}
# No 5xx; every status code, content type, header and body as described; 405 (with Allow) for
# a method a path does not take. API_CHECK_CHECKS replaces the list (`st run --help` has them).
default_checks=not_a_server_error,status_code_conformance,content_type_conformance
default_checks+=,response_schema_conformance,response_headers_conformance,unsupported_method
max_examples=${API_CHECK_MAX_EXAMPLES:-50}
specs=("$@")
[ ${#specs[@]} -gt 0 ] || specs=(pico durable-streams admin)

if ! command -v "$st" >/dev/null; then
  echo "api-check: schemathesis ($st) not found: pip install -r conformance/api/requirements.txt" >&2
  exit 2
fi
if [ -z "${PICO_BIN:-}" ]; then
  cargo build --locked -p pico-cli
  PICO_BIN=${CARGO_TARGET_DIR:-$PWD/target}/debug/pico
fi

node_dir=$(mktemp -d /tmp/pico-api-check.XXXXXX)
node_log=$node_dir/server.log
# glommio needs locked memory for its rings.
ulimit -l unlimited 2>/dev/null || ulimit -l 8192 2>/dev/null || true
# Short live reads: a long-poll answers 204 after 0.2 s and an SSE response ends after 0.5 s,
# so generated live reads finish quickly (the defaults, 25 s and 55 s, would time them out).
"$PICO_BIN" serve --listen 127.0.0.1:0 --ds-listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
  --meta-url "sqlite:$node_dir/meta.db" --storage "-2@file://$node_dir/objects" \
  --wal-dir "$node_dir/wal" --backup-dir "$node_dir/backups" \
  --long-poll-timeout-sec 0.2 --sse-max-duration-sec 0.5 \
  >"$node_log" 2>&1 &
node_pid=$!
stop_node() {
  kill "$node_pid" 2>/dev/null || true
  wait "$node_pid" 2>/dev/null || true
  rm -rf "$node_dir"
}
trap stop_node EXIT

url_of() { sed -n "s/^$1 \(http:\/\/[^ ]*\).*/\1/p" "$node_log" | head -n 1; }
pico_url="" ds_url="" admin_url=""
for _ in $(seq 1 600); do
  pico_url=$(url_of "serving on") ds_url=$(url_of "durable streams on") admin_url=$(url_of "admin on")
  [ -n "$pico_url" ] && [ -n "$ds_url" ] && [ -n "$admin_url" ] && break
  kill -0 "$node_pid" 2>/dev/null || { cat "$node_log"; echo "api-check: pico serve exited" >&2; exit 1; }
  sleep 0.1
done
if [ -z "$pico_url" ] || [ -z "$ds_url" ] || [ -z "$admin_url" ]; then
  cat "$node_log"
  echo "api-check: pico serve did not start in 60 s" >&2
  exit 1
fi
echo "api-check: node at $pico_url (pico), $ds_url (durable streams), $admin_url (admin)"
echo "api-check: seed $seed, at most $max_examples examples per operation ($($st --version))"

status=0
# The descriptions are valid OpenAPI 3.1 first (schemathesis takes some that are not): the
# validator installed next to `st` by conformance/api/requirements.txt, when there is one.
validator=$(dirname "$(command -v "$st")")/openapi-spec-validator
if [ -x "$validator" ]; then
  for spec in "${specs[@]}"; do
    # Its message on an error quotes the whole document: the first lines say enough.
    out=$("$validator" "docs/openapi/$spec.yaml" 2>&1) || status=1
    printf '%s\n' "${out:0:2000}"
  done
else
  echo "api-check: no openapi-spec-validator beside $st: the descriptions' structure is not checked"
fi
for spec in "${specs[@]}"; do
  case $spec in
    pico) url=$pico_url ;;
    durable-streams) url=$ds_url ;;
    admin) url=$admin_url ;;
    *) echo "api-check: unknown description $spec (pico, durable-streams, admin)" >&2; exit 2 ;;
  esac
  report=()
  if [ -n "${API_CHECK_REPORT_DIR:-}" ]; then
    report=(--report junit,vcr --report-dir "$(realpath "$API_CHECK_REPORT_DIR")/$spec")
  fi
  echo "== docs/openapi/$spec.yaml against $url"
  # --workers 1: the machine is small and shared; the seed makes the run repeatable. Run from
  # the node's directory, so schemathesis' own files (.hypothesis/) go away with it.
  if ! (cd "$node_dir" && "$st" run "$repo/docs/openapi/$spec.yaml" --url "$url" \
    --checks "${API_CHECK_CHECKS:-$default_checks}" \
    --max-examples "$max_examples" --seed "$seed" --workers 1 --request-timeout 10 \
    --suppress-health-check all "${report[@]}"); then
    echo "api-check: docs/openapi/$spec.yaml: FAILED (replay: API_CHECK_SEED=$seed scripts/api-check.sh $spec)"
    status=1
  fi
done
if ! kill -0 "$node_pid" 2>/dev/null; then
  echo "api-check: the node died during the check" >&2
  status=1
fi
if [ "$status" != 0 ]; then
  echo "--- server log (tail)"
  tail -n 40 "$node_log"
fi
exit "$status"
