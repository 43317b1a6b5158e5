#!/usr/bin/env bash
# Builds the node image and runs it under Docker, with no image registry: the base is made here
# from Debian's packages (debootstrap --variant=minbase bookworm, then `docker import`), the
# image is the Dockerfile's runtime-prebuilt target around a pico binary built on this machine,
# and every container runs with host networking, so the checks talk to 127.0.0.1 only.
#
#   scripts/container-check.sh --install-only   # as root: install what is missing, then stop
#   scripts/container-check.sh                  # the check (cli/tests/container_image.rs runs it)
#
# The check:
#   1. the base image picomq-base:bookworm, made once: the rootfs tarball is cached in
#      $PICOMQ_CONTAINER_CACHE (default /var/cache/picomq-container; delete it to refresh) and
#      the import skipped while the daemon has the image;
#   2. the node image from it, with the classic builder (DOCKER_BUILDKIT=0) and, where the
#      client has one, with BuildKit; both builds without network (--network none);
#   3. `docker run` of it as the README says (seccomp=unconfined, memlock unlimited where the
#      machine allows it): it must
#      run as uid 10001 with those limits, become ready and healthy, refuse a request without
#      a token, create/append/read with one, stop cleanly on SIGTERM, and a new container on the
#      same volume must read the records back;
#   4. harness/aio/compose.lite.yml brought up with that image (PICOMQ_IMAGE), host networking
#      and loopback listeners: it must serve, then `down -v` removes it and its volume.
#
# PICO_BIN is the binary put in the image (default target/debug/pico, built by `cargo test`; a
# debug build is enough for these checks and saves a release build, which takes about 11
# minutes cold on a 2-core machine). It must run on bookworm's glibc: build it on bookworm.
#
# The daemon: the one DOCKER_HOST or /var/run/docker.sock answers on, if any (left running);
# otherwise, as root, a dockerd of this script's own (data in /var/lib/picomq-docker, socket,
# pid file and log in /run/picomq-docker), started without a bridge, iptables rules or IP
# forwarding so that it leaves the host's network as it was, and stopped at the end.
#
# Exit status: 0 passed; 77 Docker cannot run here (no root to start dockerd, or dockerd does
# not start: the reason is printed); 78 a tool is missing (--install-only installs it); any
# other: a check failed.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

readonly SKIP_STATUS=77 MISSING_STATUS=78
readonly READY_TIMEOUT_SEC=60 HEALTHY_TIMEOUT_SEC=60 DOCKERD_START_TIMEOUT_SEC=60
readonly STOP_TIMEOUT_SEC=30
base_image=picomq-base:bookworm
image_classic=picomq-check:classic
image_buildkit=picomq-check:buildkit
node_name=picomq-check-node
node_volume=picomq-check-data
compose_project=picomq-lite-check
cache=${PICOMQ_CONTAINER_CACHE:-/var/cache/picomq-container}
mirror=${PICOMQ_DEBIAN_MIRROR:-http://deb.debian.org/debian}
own_state=/var/lib/picomq-docker
own_run=/run/picomq-docker
own_socket=unix://$own_run/docker.sock

say() { echo "container-check: $*"; }
fail() {
  echo "container-check: FAILED: $*" >&2
  exit 1
}
began=$SECONDS
step() { say "[$((SECONDS - began)) s] $*"; }

compose_command() {
  if docker compose version >/dev/null 2>&1; then
    echo "docker compose"
  elif command -v docker-compose >/dev/null; then
    echo docker-compose
  fi
}

# A daemon this script did not start: DOCKER_HOST's, or the one on the default socket.
other_daemon_answers() {
  { [ -n "${DOCKER_HOST:-}" ] || [ -S /var/run/docker.sock ]; } && docker version >/dev/null 2>&1
}

# The Debian packages of the tools this machine lacks (dockerd only when no daemon answers).
missing_packages() {
  local wanted=()
  if ! command -v docker >/dev/null || { ! command -v dockerd >/dev/null && ! other_daemon_answers; }; then
    wanted+=(docker.io)
  fi
  command -v debootstrap >/dev/null || wanted+=(debootstrap)
  [ -n "$(compose_command)" ] || wanted+=(docker-compose)
  command -v curl >/dev/null || wanted+=(curl)
  command -v python3 >/dev/null || wanted+=(python3)
  echo "${wanted[*]}"
}

if [ "${1:-}" = --install-only ]; then
  packages=$(missing_packages)
  if [ -n "$packages" ]; then
    say "installing $packages"
    apt-get update -qq
    # dpkg's progress lines are left out; errors still reach stderr.
    # shellcheck disable=SC2086 # a list of package names
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $packages >/dev/null
  fi
  exit 0
elif [ $# -gt 0 ]; then
  echo "usage: $0 [--install-only]" >&2
  exit 2
fi

packages=$(missing_packages)
if [ -n "$packages" ]; then
  echo "container-check: missing $packages: run $0 --install-only as root" >&2
  exit $MISSING_STATUS
fi
pico=${PICO_BIN:-$repo/target/debug/pico}
[ -x "$pico" ] || fail "no pico binary at $pico (cargo build -p pico-cli, or set PICO_BIN)"
read -r -a compose <<<"$(compose_command)"

work=$(mktemp -d /tmp/picomq-container-check.XXXXXX)
dockerd_pid=
cleanup() {
  local status=$?
  if [ -n "${DOCKER_HOST:-}" ] && docker version >/dev/null 2>&1; then
    docker rm -f "$node_name" >/dev/null 2>&1 || true
    docker volume rm -f "$node_volume" >/dev/null 2>&1 || true
    if [ -f "$work/compose.yml" ]; then
      PICOMQ_IMAGE=$image_classic "${compose[@]}" -p "$compose_project" \
        --project-directory harness/aio -f "$work/compose.yml" -f "$work/override.yml" \
        down -v >/dev/null 2>&1 || true
    fi
  fi
  if [ -n "$dockerd_pid" ]; then
    kill "$dockerd_pid" 2>/dev/null || true
    for _ in $(seq 1 $((STOP_TIMEOUT_SEC * 10))); do
      kill -0 "$dockerd_pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$dockerd_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
# A SIGTERM or SIGINT (a test's timeout) exits through the same cleanup.
trap 'exit 143' TERM
trap 'exit 130' INT

# One check at a time on this machine: they share the daemon, the image names and the volume.
if [ "$(id -u)" = 0 ]; then
  mkdir -p "$own_run"
  lock=$own_run/check.lock
else
  lock=${XDG_RUNTIME_DIR:-/tmp}/picomq-container-check.$(id -u).lock
fi
exec 9>"$lock"
flock -w 900 9 || fail "another container check held $lock for 15 minutes"

# ---- the daemon ----
if [ -z "${DOCKER_HOST:-}" ] && other_daemon_answers; then
  export DOCKER_HOST=unix:///var/run/docker.sock
fi
if [ -n "${DOCKER_HOST:-}" ]; then
  docker version >/dev/null 2>&1 || fail "DOCKER_HOST=$DOCKER_HOST does not answer"
  step "using the Docker daemon at $DOCKER_HOST"
else
  export DOCKER_HOST=$own_socket
  if [ "$(id -u)" != 0 ]; then
    say "SKIP: no Docker daemon answers, and starting one needs root"
    exit $SKIP_STATUS
  fi
  # A dockerd of ours left by a check that was killed: stop it, then start afresh.
  if [ -f "$own_run/dockerd.pid" ]; then
    stale=$(cat "$own_run/dockerd.pid")
    if [ -n "$stale" ] && [ "$(readlink "/proc/$stale/exe" 2>/dev/null)" = "$(command -v dockerd)" ]; then
      kill "$stale" 2>/dev/null || true
      for _ in $(seq 1 $((STOP_TIMEOUT_SEC * 10))); do
        kill -0 "$stale" 2>/dev/null || break
        sleep 0.1
      done
    fi
  fi
  mkdir -p "$own_state"
  # No bridge, iptables rules, masquerading or IP forwarding: every container here uses host
  # networking, and the host's firewall and sysctls stay as they were. The daemon does not
  # inherit the lock (fd 9), so one left running cannot block the next check.
  setsid dockerd --data-root "$own_state/data" --exec-root "$own_run/exec" \
    --pidfile "$own_run/dockerd.pid" -H "$own_socket" \
    --bridge none --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false \
    >"$own_state/dockerd.log" 2>&1 </dev/null 9>&- &
  dockerd_pid=$!
  for _ in $(seq 1 $((DOCKERD_START_TIMEOUT_SEC * 10))); do
    docker version >/dev/null 2>&1 && break
    kill -0 "$dockerd_pid" 2>/dev/null || break
    sleep 0.1
  done
  if ! docker version >/dev/null 2>&1; then
    tail -n 20 "$own_state/dockerd.log" >&2 || true
    say "SKIP: dockerd does not start here (log above, in full in $own_state/dockerd.log)"
    exit $SKIP_STATUS
  fi
  step "started dockerd (pid $dockerd_pid, $own_socket)"
fi
say "docker client $(docker version -f '{{.Client.Version}}'), server $(docker version -f '{{.Server.Version}}'), compose: ${compose[*]}"

# ---- the base image ----
if docker image inspect "$base_image" >/dev/null 2>&1; then
  step "base image $base_image: present"
else
  rootfs_tar=$cache/bookworm-minbase.tar
  if [ ! -s "$rootfs_tar" ]; then
    [ "$(id -u)" = 0 ] || fail "no $base_image yet: debootstrap needs root (run this once as root)"
    step "debootstrap --variant=minbase bookworm (into $cache)"
    mkdir -p "$cache"
    rootfs=$cache/rootfs.tmp
    # What a failed debootstrap left: its mounts first, then the tree (never across a mount).
    unmount_below() {
      awk -v dir="$1/" 'index($2, dir) == 1 { print $2 }' /proc/mounts | sort -r |
        while read -r mount; do umount -l "$mount"; done
    }
    unmount_below "$rootfs"
    rm -rf --one-file-system "$rootfs"
    # ca-certificates in the base: the Dockerfile then installs nothing, and builds offline.
    if ! debootstrap --variant=minbase --include=ca-certificates bookworm "$rootfs" "$mirror" \
      >"$cache/debootstrap.log" 2>&1; then
      tail -n 20 "$cache/debootstrap.log" >&2
      unmount_below "$rootfs"
      fail "debootstrap (log: $cache/debootstrap.log)"
    fi
    # The package cache and lists, and this machine's name and resolver, stay out of the image.
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin \
      "$rootfs"/var/lib/apt/lists/*_* "$rootfs/etc/hostname" "$rootfs/etc/resolv.conf"
    tar --numeric-owner -C "$rootfs" -cf "$rootfs_tar.tmp" .
    mv "$rootfs_tar.tmp" "$rootfs_tar"
    rm -rf --one-file-system "$rootfs"
  fi
  step "docker import $rootfs_tar as $base_image"
  docker import -c 'CMD ["bash"]' "$rootfs_tar" "$base_image" >/dev/null
fi

# ---- the node image ----
# The build context is a directory with the binary alone (the repository's .dockerignore
# leaves target/ out of a context at the root).
mkdir "$work/context"
cp "$pico" "$work/context/pico"
build_args=(--network none --target runtime-prebuilt --build-arg "BASE_IMAGE=$base_image"
  -f "$repo/Dockerfile" "$work/context")
step "docker build (classic builder) -t $image_classic"
DOCKER_BUILDKIT=0 docker build -q "${build_args[@]}" -t "$image_classic" >"$work/build.log" 2>&1 ||
  { cat "$work/build.log" >&2; fail "classic build"; }

# BuildKit: `docker buildx`, or the client's own BuildKit before Docker 23 (Debian's docker.io
# is 20.10); a client of 23 or later without buildx has none.
buildkit=()
if docker buildx version >/dev/null 2>&1; then
  buildkit=(docker buildx build --load)
else
  for client in docker /usr/bin/docker; do
    major=$("$client" version -f '{{.Client.Version}}' 2>/dev/null | cut -d. -f1) || continue
    if [[ "$major" =~ ^[0-9]+$ ]] && [ "$major" -lt 23 ]; then
      buildkit=(env DOCKER_BUILDKIT=1 "$client" build)
      break
    fi
  done
fi
if [ ${#buildkit[@]} -gt 0 ]; then
  step "docker build (BuildKit: ${buildkit[*]}) -t $image_buildkit"
  "${buildkit[@]}" --progress plain "${build_args[@]}" -t "$image_buildkit" >"$work/build.log" 2>&1 ||
    { cat "$work/build.log" >&2; fail "BuildKit build"; }
else
  say "BuildKit build: skipped: docker $(docker version -f '{{.Client.Version}}') has no buildx"
fi

for image in "$image_classic" ${buildkit[@]:+"$image_buildkit"}; do
  version=$(docker run --rm --network none "$image" --version 2>&1) ||
    fail "$image: pico --version: $version (a binary built on a newer glibc than bookworm's?)"
  [ "$version" = "$("$pico" --version)" ] || fail "$image: pico --version says '$version'"
  user=$(docker run --rm --network none --entrypoint id "$image" -u)
  [ "$user" = 10001 ] || fail "$image: runs as uid $user, not 10001"
  [ "$(docker image inspect -f '{{json .Config.Entrypoint}}' "$image")" = '["pico"]' ] ||
    fail "$image: the entrypoint is not pico"
  say "$image: $version, uid $user"
done

# ---- docker run ----
# A client with no profile or PICO_* setting of the caller's.
client() { env -i PATH="$PATH" HOME="$work" "$pico" "$@"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# `ready CONTAINER ADMIN_PORT`: waits for /ready on the admin port, failing early when the
# container stops.
ready() {
  local deadline=$((SECONDS + READY_TIMEOUT_SEC))
  while [ $SECONDS -lt $deadline ]; do
    curl -sf -m 2 -o /dev/null "http://127.0.0.1:$2/ready" && return 0
    if [ "$(docker inspect -f '{{.State.Running}}' "$1")" != true ]; then
      docker logs "$1" 2>&1 | tail -n 30 >&2
      fail "$1 stopped before it was ready"
    fi
    sleep 0.2
  done
  docker logs "$1" 2>&1 | tail -n 30 >&2
  fail "$1 not ready on 127.0.0.1:$2 within $READY_TIMEOUT_SEC s"
}
# `url_in_logs CONTAINER PREFIX`: the URL the node printed after PREFIX ("serving on").
url_in_logs() { docker logs "$1" 2>&1 | sed -n "s/^$2 \(http:\/\/[^ ]*\).*/\1/p" | tail -n 1; }
# `limits_of CONTAINER`: its main process must run as uid 10001, without a seccomp filter, with
# the locked memory asked for (what --security-opt seccomp=unconfined --ulimit memlock=... give).
limits_of() {
  local pid
  pid=$(docker inspect -f '{{.State.Pid}}' "$1")
  [ "$(awk '/^Uid:/ { print $2 }' "/proc/$pid/status")" = 10001 ] ||
    fail "$1: its process runs as $(grep '^Uid:' "/proc/$pid/status")"
  [ "$(awk '/^Seccomp:/ { print $2 }' "/proc/$pid/status")" = 0 ] ||
    fail "$1: a seccomp filter is on: $(grep '^Seccomp:' "/proc/$pid/status")"
  grep -Eq "^Max locked memory +$memlock_shown +$memlock_shown " "/proc/$pid/limits" ||
    fail "$1: $(grep '^Max locked memory' "/proc/$pid/limits"), not $memlock_shown"
  say "$1: pid $pid runs as uid 10001, seccomp off, locked memory $memlock_shown"
}

# Locked memory: unlimited, as the README says, where this machine may raise the limit; where
# it may not (no CAP_SYS_RESOURCE, as in some sandboxes: runc then fails to set a higher one),
# the hard limit it has, which must be the node's minimum of 8 MiB or more.
readonly MIN_MEMLOCK_BYTES=8388608
if (ulimit -H -l unlimited) 2>/dev/null; then
  memlock=-1 memlock_shown=unlimited
else
  hard_kib=$(ulimit -H -l)
  # At most 15 digits: the product in bytes stays far inside bash's 64-bit arithmetic.
  [[ "$hard_kib" =~ ^[0-9]{1,15}$ ]] || fail "ulimit -H -l says '$hard_kib'"
  memlock=$((hard_kib * 1024)) memlock_shown=$((hard_kib * 1024))
  [ "$memlock" -ge $MIN_MEMLOCK_BYTES ] ||
    fail "locked memory is capped at $memlock bytes here, below the node's $MIN_MEMLOCK_BYTES"
  say "locked memory cannot be raised here: the containers get memlock=$memlock, not -1"
fi

token=container-check-token
printf '%s / read,append,admin\n' "$token" >"$work/tokens"
chmod 0644 "$work/tokens"
docker rm -f "$node_name" >/dev/null 2>&1 || true
docker volume rm -f "$node_volume" >/dev/null 2>&1 || true
# `run_node`: the image's node with its default flags but the listeners (loopback, so that
# host networking publishes nothing), auth on, and the data in the named volume. The image's
# healthcheck runs every 2 s instead of 10, so that the check need not wait for it long.
run_node() {
  admin_port=$(free_port)
  docker run -d --name "$node_name" --network host \
    --security-opt seccomp=unconfined --ulimit "memlock=$memlock" --health-interval 2s \
    -v "$node_volume:/var/lib/picomq" -v "$work/tokens:/etc/picomq/tokens:ro" \
    -e PICO_LISTEN=127.0.0.1:0 -e PICO_DS_LISTEN=127.0.0.1:0 \
    -e "PICO_ADMIN_LISTEN=127.0.0.1:$admin_port" \
    "$image_classic" serve --auth required --auth-tokens /etc/picomq/tokens >/dev/null
  ready "$node_name" "$admin_port"
  pico_url=$(url_in_logs "$node_name" "serving on")
  ds_url=$(url_in_logs "$node_name" "durable streams on")
  if [ -z "$pico_url" ] || [ -z "$ds_url" ]; then
    fail "no listener URLs in the node's log"
  fi
}

step "docker run $image_classic (host network, auth required)"
run_node
limits_of "$node_name"
if client --endpoint "$pico_url" read /check/records >/dev/null 2>&1; then
  fail "a read without a token was answered"
fi
client --endpoint "$pico_url" --token "$token" create /check/records 2>/dev/null
printf 'one\ntwo\nthree\n' | client --endpoint "$pico_url" --token "$token" append /check/records 2>/dev/null
expected=$(printf '0\tone\n1\ttwo\n2\tthree')
records=$(client --endpoint "$pico_url" --token "$token" read /check/records)
[ "$records" = "$expected" ] || fail "read back: '$records'"
ds_body=$(client --protocol ds --endpoint "$ds_url" --token "$token" read /check/records | cut -f2)
[ "$ds_body" = onetwothree ] || fail "Durable Streams read: '$ds_body'"
say "created, appended and read 3 records (Pico and Durable Streams listeners)"

step "waiting for the image's healthcheck to say healthy"
deadline=$((SECONDS + HEALTHY_TIMEOUT_SEC))
health=
while [ $SECONDS -lt $deadline ]; do
  health=$(docker inspect -f '{{.State.Health.Status}}' "$node_name")
  [ "$health" = healthy ] && break
  [ "$health" = unhealthy ] && break
  sleep 1
done
[ "$health" = healthy ] || fail "healthcheck: '$health' after $HEALTHY_TIMEOUT_SEC s"

step "docker stop (SIGTERM), then a new container on the same volume"
docker stop -t "$STOP_TIMEOUT_SEC" "$node_name" >/dev/null
exit_code=$(docker inspect -f '{{.State.ExitCode}}' "$node_name")
[ "$exit_code" = 0 ] || { docker logs "$node_name" 2>&1 | tail -n 20 >&2; fail "the node exited with $exit_code on SIGTERM"; }
docker rm "$node_name" >/dev/null
run_node
records=$(client --endpoint "$pico_url" --token "$token" read /check/records)
[ "$records" = "$expected" ] || fail "read back after the restart: '$records'"
echo four | client --endpoint "$pico_url" --token "$token" append /check/records 2>/dev/null
[ "$(client --endpoint "$pico_url" --token "$token" read /check/records | tail -n 1)" = "$(printf '3\tfour')" ] ||
  fail "append after the restart"
say "the records survived the new container, and it appends"
docker rm -f "$node_name" >/dev/null
docker volume rm "$node_volume" >/dev/null

# ---- compose.lite.yml ----
# The file as it is, less two things: its top-level `name:` (docker-compose 1.x, Debian's,
# rejects the key; -p names the project instead) and its `ports:` (host networking publishes
# nothing, and docker-compose 1.x refuses ports with it). The override adds host networking,
# moves the listeners to loopback ports of this check, and sets the locked memory chosen above
# (the file's own -1 where the machine allows it).
step "${compose[*]} -f harness/aio/compose.lite.yml (host network)"
awk '
  /^name:/ { next }
  /^ *ports:/ { skip = match($0, /[^ ]/); next }
  skip && (/^ *$/ || match($0, /[^ ]/) > skip) { next }
  { skip = 0; print }
' harness/aio/compose.lite.yml >"$work/compose.yml"
removed=$(diff harness/aio/compose.lite.yml "$work/compose.yml" | grep -c '^<' || true)
added=$(diff harness/aio/compose.lite.yml "$work/compose.yml" | grep -c '^>' || true)
{ [ "$added" = 0 ] && [ "$removed" -ge 2 ] && ! grep -q 'ports:' "$work/compose.yml"; } ||
  fail "the compose file's copy: $removed lines removed, $added added"
lite_admin_port=$(free_port)
lite_pico_port=$(free_port)
lite_ds_port=$(free_port)
cat >"$work/override.yml" <<EOF
services:
  pico:
    network_mode: host
    ulimits:
      memlock:
        soft: $memlock
        hard: $memlock
    environment:
      PICO_LISTEN: "127.0.0.1:$lite_pico_port"
      PICO_DS_LISTEN: "127.0.0.1:$lite_ds_port"
      PICO_ADMIN_LISTEN: "127.0.0.1:$lite_admin_port"
EOF
lite=("${compose[@]}" -p "$compose_project" --project-directory harness/aio
  -f "$work/compose.yml" -f "$work/override.yml")
PICOMQ_IMAGE=$image_classic "${lite[@]}" up -d --no-build >"$work/compose.log" 2>&1 ||
  { cat "$work/compose.log" >&2; fail "compose up"; }
lite_container=$(PICOMQ_IMAGE=$image_classic "${lite[@]}" ps -q pico)
[ -n "$lite_container" ] || fail "compose started no pico container"
[ "$(docker inspect -f '{{.Config.Image}}' "$lite_container")" = "$image_classic" ] ||
  fail "compose ran $(docker inspect -f '{{.Config.Image}}' "$lite_container"), not PICOMQ_IMAGE"
ready "$lite_container" "$lite_admin_port"
limits_of "$lite_container"
lite_url=http://127.0.0.1:$lite_pico_port
client --endpoint "$lite_url" create /check/lite 2>/dev/null
printf 'lite\n' | client --endpoint "$lite_url" append /check/lite 2>/dev/null
[ "$(client --endpoint "$lite_url" read /check/lite)" = "$(printf '0\tlite')" ] || fail "compose node: read back"
[ "$(client --protocol ds --endpoint "http://127.0.0.1:$lite_ds_port" read /check/lite | cut -f2)" = lite ] ||
  fail "compose node: Durable Streams read"
docker exec "$lite_container" test -s /var/lib/picomq/data/meta.db ||
  fail "compose node: no metadata log in its volume"
say "compose.lite.yml serves (SQLite metadata and the file:// bucket in its volume)"
PICOMQ_IMAGE=$image_classic "${lite[@]}" down -v >"$work/compose.log" 2>&1 ||
  { cat "$work/compose.log" >&2; fail "compose down"; }
if docker volume ls -q | grep -q "^${compose_project}_pico$"; then
  fail "compose down -v left the volume ${compose_project}_pico"
fi
rm "$work/compose.yml"

# The images of earlier runs' binaries, once untagged, and the build cache would pile up in a
# daemon of our own; another's is left as it is.
if [ -n "$dockerd_pid" ]; then
  docker image prune -f >/dev/null
  docker builder prune -af >/dev/null 2>&1 || true
fi

step "passed"
