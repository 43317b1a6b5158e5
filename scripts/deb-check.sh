#!/usr/bin/env bash
# shellcheck disable=SC2016 # the single-quoted $ fields are awk's, in the machine
# Installs the Debian package into a real Debian system running systemd and checks the service
# end to end: a throwaway copy of the cached root file system of scripts/deb-rootfs.sh boots
# under systemd-nspawn (its own network namespace, loopback only), and inside it:
#
#   dpkg -i        the service is enabled and started by the package, and /ready answers;
#                  it runs as the user picomq with LimitMEMLOCK=infinity in force, its data
#                  under /var/lib/picomq; `systemd-analyze verify` is clean and `security`
#                  rates it below $DEB_CHECK_EXPOSURE_MAX
#   pico           the installed /usr/bin/pico creates, appends to and reads a stream
#   restart        with a setting from /etc/default/picomq (another admin port): a new
#                  process, the records read back
#   reload         SIGHUP, same process; kill -9: Restart=on-failure brings it back
#   dpkg -i again  an upgrade restarts it, keeping the edited settings and the records
#   dpkg -r        stops it, keeps data, user and /etc/default/picomq
#   dpkg --purge   removes data, user, group and the settings file
#
#   scripts/deb-rootfs.sh                                   # once: the tools and the tree
#   PICO_BIN=target/debug/pico scripts/deb-check.sh         # packages that binary first
#   scripts/deb-check.sh target/debian/picomq_0.2.0-1_amd64.deb
#
# Needs root (mounts, namespaces). Every wait is bounded; on exit (an error or a signal
# included) the machine is stopped and its copy removed. Prints `deb-check: ok` at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS

suite=${DEB_CHECK_SUITE:-bookworm}
rootfs=${PICOMQ_DEB_ROOTFS:-${PICOMQ_DEB_CACHE:-/var/cache/picomq-deb}/current-$suite}
# systemd-analyze's exposure rating of the unit; 1.2 when this was written ("OK" is below 2).
exposure_max=${DEB_CHECK_EXPOSURE_MAX:-2.0}

say() { echo "deb-check: $*" >&2; }
fail() {
  say "FAILED: $*"
  exit 1
}

[ "$(id -u)" = 0 ] || fail "needs root (mounts and namespaces)"
[ -f "$rootfs/.picomq-ready" ] || fail "no root file system in $rootfs: run scripts/deb-rootfs.sh"
for tool in systemd-nspawn nsenter; do
  command -v "$tool" >/dev/null || fail "$tool is missing: run scripts/deb-rootfs.sh"
done

# `guest CMD...` runs CMD inside the machine (all of its namespaces) with a clean environment.
guest() {
  nsenter --target "$init_pid" --all -- env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
    LANG=C.UTF-8 "$@"
}

work=$(mktemp -d /tmp/picomq-deb-check.XXXXXX)
machine=picomq-deb-$$
holder_pid=
nspawn_pid=

stop_machine() {
  [ -n "$holder_pid" ] || return 0
  # SIGTERM asks the container's systemd to halt; when it has not within 30 s, the holder
  # goes, and the machine with it.
  if [ -n "$nspawn_pid" ]; then
    kill -TERM "$nspawn_pid" 2>/dev/null || true
  fi
  local tries=0
  while kill -0 "$holder_pid" 2>/dev/null && [ $tries -lt 300 ]; do
    sleep 0.1
    tries=$((tries + 1))
  done
  kill -KILL "$holder_pid" 2>/dev/null || true
  wait "$holder_pid" 2>/dev/null || true
  holder_pid=
}
cleanup() {
  local status=$?
  if [ "$status" != 0 ] && [ -n "$holder_pid" ] && [ -n "${init_pid:-}" ]; then
    say "the service's journal (tail):"
    guest journalctl -u picomq --no-pager -n 40 >&2 2>/dev/null || true
  fi
  stop_machine
  if [ "$status" != 0 ] && [ -f "$work/console.log" ]; then
    say "the machine's console (tail):"
    tail -n 30 "$work/console.log" >&2 || true
  fi
  rm -rf "$work"
  # nspawn leaves this empty directory behind where /run is not a tmpfs.
  rmdir "/run/systemd/nspawn/propagate/$machine" 2>/dev/null || true
  exit "$status"
}
trap cleanup EXIT
# A command that fails outside a check of its own says which one it was.
trap 'say "FAILED: line $LINENO: $BASH_COMMAND"' ERR
trap 'exit 130' INT
trap 'exit 143' TERM

deb=${1:-}
if [ -z "$deb" ]; then
  deb=$(DEB_OUT_DIR=$work/deb DEB_COMPRESSION=none scripts/build-deb.sh | tail -1)
fi
[ -f "$deb" ] || fail "no package at $deb"
say "package $(basename "$deb"); root file system $(readlink -f "$rootfs")"

mkdir -p "$work/upper" "$work/overlay-work" "$work/root"
# The container gets the locked-memory limit this process has: as high as root may raise it.
ulimit -l unlimited 2>/dev/null || true
# The machine runs in a mount and PID namespace of its own, held by unshare: when the holder
# goes, killed outright included, nspawn gets SIGKILL (--kill-child) and the kernel ends every
# process in the namespace and drops its mounts. Inside, the cached tree is the lower layer of
# an overlay, so a run never changes it (a copy where overlayfs cannot be mounted).
# --keep-unit --register=no: no systemd on the host to ask for a scope or a registration.
unshare --mount --pid --fork --kill-child -- bash -c '
  mount -t overlay overlay -o "lowerdir=$1,upperdir=$2/upper,workdir=$2/overlay-work" "$2/root" ||
    { echo "deb-check: overlayfs unavailable: copying the tree" >&2; cp -a "$1/." "$2/root/"; }
  exec systemd-nspawn --quiet --directory="$2/root" --machine="$3" --boot \
    --private-network --keep-unit --register=no --console=pipe --bind-ro="$4:/root/picomq.deb"
' deb-check-machine "$(readlink -f "$rootfs")" "$work" "$machine" "$deb" </dev/null >"$work/console.log" 2>&1 &
holder_pid=$!

# `child_of PID`: the first child of PID, if any.
child_of() { cat /proc/"$1"/task/*/children 2>/dev/null | tr ' ' '\n' | grep -m1 . || true; }
# nspawn is the holder's child, the container's systemd nspawn's.
init_pid=
for _ in $(seq 1 200); do
  nspawn_pid=$(child_of "$holder_pid")
  [ -n "$nspawn_pid" ] && [ "$(cat "/proc/$nspawn_pid/comm" 2>/dev/null)" = systemd-nspawn ] &&
    init_pid=$(child_of "$nspawn_pid")
  [ -n "$init_pid" ] && [ "$(cat "/proc/$init_pid/comm" 2>/dev/null)" = systemd ] && break
  init_pid=
  kill -0 "$holder_pid" 2>/dev/null || fail "systemd-nspawn exited"
  sleep 0.1
done
[ -n "$init_pid" ] || fail "no systemd in the container within 20 s"

# Until systemd listens on its socket, systemctl cannot ask it anything, --wait included.
state=
for _ in $(seq 1 300); do
  state=$(guest systemctl is-system-running 2>/dev/null || true)
  case $state in
    running | degraded) break ;;
  esac
  kill -0 "$holder_pid" 2>/dev/null || fail "systemd-nspawn exited"
  sleep 0.2
done
case $state in
  running | degraded) ;;
  *) fail "the machine did not boot within 60 s: '$state'" ;;
esac
say "booted ($state) in $((SECONDS - started)) s"

expect_eq() {
  [ "$2" = "$3" ] || fail "$1: got '$2', want '$3'"
}
# `wait_ready PORT`: /ready on the admin listener answers 200 within 30 s.
wait_ready() {
  local tries=0
  until guest curl -fsS -m 2 -o /dev/null "http://127.0.0.1:$1/ready" 2>/dev/null; do
    tries=$((tries + 1))
    [ $tries -lt 150 ] || fail "/ready on 127.0.0.1:$1 did not answer 200 within 30 s"
    sleep 0.2
  done
}
main_pid() { guest systemctl show picomq -p MainPID --value; }
# `wait_new_main_pid OLD`: prints the service's main PID once it is running and not OLD.
wait_new_main_pid() {
  local tries=0 pid
  while :; do
    pid=$(main_pid)
    [ "$pid" != 0 ] && [ "$pid" != "$1" ] &&
      [ "$(guest systemctl is-active picomq || true)" = active ] && break
    tries=$((tries + 1))
    [ $tries -lt 150 ] || fail "no new main process (old $1) within 30 s"
    sleep 0.2
  done
  echo "$pid"
}
expected_records=$(printf '0\tone\n1\ttwo\n2\tthree')

say "dpkg -i"
guest dpkg -i /root/picomq.deb >"$work/dpkg-install.log" 2>&1 ||
  { cat "$work/dpkg-install.log" >&2; fail "dpkg -i"; }
expect_eq "enabled by the package" "$(guest systemctl is-enabled picomq || true)" enabled
expect_eq "started by the package" "$(guest systemctl is-active picomq || true)" active
wait_ready 9090

pid=$(main_pid)
[ "$pid" -gt 0 ] || fail "no main process"
expect_eq "User=" "$(guest systemctl show picomq -p User --value)" picomq
uid=$(guest id -u picomq)
[ "$uid" != 0 ] || fail "picomq is uid 0"
process_uid=$(guest awk '/^Uid:/ { print $3 }' "/proc/$pid/status")
expect_eq "effective uid of the main process" "$process_uid" "$uid"
expect_eq "LimitMEMLOCK=" "$(guest systemctl show picomq -p LimitMEMLOCK --value)" infinity
# systemd sets it as high as its own hard limit allows: unlimited on a machine, the
# container's hard limit where the host caps it (an unprivileged sandbox).
memlock_of() { guest awk '/^Max locked memory/ { print $4, $5 }' "/proc/$1/limits"; }
manager_memlock_max=$(guest awk '/^Max locked memory/ { print $5 }' /proc/1/limits)
expect_eq "locked-memory limit (soft hard) of the node" "$(memlock_of "$pid")" \
  "$manager_memlock_max $manager_memlock_max"
[ "$manager_memlock_max" = unlimited ] ||
  say "note: the host caps locked memory at $manager_memlock_max bytes; the node runs with that"
guest systemd-analyze verify picomq.service >"$work/verify.log" 2>&1 ||
  { cat "$work/verify.log" >&2; fail "systemd-analyze verify picomq.service"; }
[ ! -s "$work/verify.log" ] || { cat "$work/verify.log" >&2; fail "systemd-analyze verify has warnings"; }
exposure=$(guest systemd-analyze security picomq --no-pager |
  sed -n 's/.*Overall exposure level for picomq.service: \([0-9.]*\).*/\1/p')
[ -n "$exposure" ] || fail "no exposure level from systemd-analyze security"
awk -v e="$exposure" -v max="$exposure_max" 'BEGIN { exit !(e < max) }' ||
  fail "systemd-analyze security rates the unit $exposure, want below $exposure_max"
say "running as picomq (uid $uid), memlock $manager_memlock_max, exposure $exposure"

say "pico create, append, read"
guest pico create /deb/check --content-type text/plain
printf 'one\ntwo\nthree\n' | guest pico append /deb/check --batch 3
expect_eq "records read back" "$(guest pico read /deb/check)" "$expected_records"
expect_eq "owner of the metadata" "$(guest stat -c %U /var/lib/picomq/data/meta.db)" picomq
expect_eq "owner of the WAL directory" "$(guest stat -c %U /var/lib/picomq/data/wal)" picomq
[ -n "$(guest find /var/lib/picomq/data/wal -type f -size +0)" ] || fail "no WAL file under /var/lib/picomq"
foreign=$(guest find /var/lib/picomq ! -user picomq)
[ -z "$foreign" ] || fail "files under /var/lib/picomq not owned by picomq: $foreign"
guest journalctl -u picomq --no-pager | grep -q 'serving on http://127.0.0.1:4437' ||
  fail "the journal has no 'serving on' line of the node"

say "restart with PICO_ADMIN_LISTEN from /etc/default/picomq"
guest sh -c 'echo PICO_ADMIN_LISTEN=127.0.0.1:9191 >>/etc/default/picomq'
guest systemctl restart picomq
pid2=$(wait_new_main_pid "$pid")
wait_ready 9191
! guest curl -fsS -m 2 -o /dev/null http://127.0.0.1:9090/ready 2>/dev/null ||
  fail "the admin listener is still on 9090"
expect_eq "records after a restart" "$(guest pico read /deb/check)" "$expected_records"

say "reload (SIGHUP), then kill -9 (Restart=on-failure)"
guest systemctl reload picomq
expect_eq "main process after a reload" "$(main_pid)" "$pid2"
guest journalctl -u picomq --no-pager | grep -q 'SIGHUP' || fail "the node did not log the SIGHUP"
# The shell's kill: the machine has no /bin/kill.
guest sh -c "kill -KILL $pid2"
wait_new_main_pid "$pid2" >/dev/null
wait_ready 9191
expect_eq "records after kill -9" "$(guest pico read /deb/check)" "$expected_records"

say "dpkg -i again (an upgrade)"
pid3=$(main_pid)
guest dpkg -i /root/picomq.deb >"$work/dpkg-upgrade.log" 2>&1 ||
  { cat "$work/dpkg-upgrade.log" >&2; fail "dpkg -i over the installed package"; }
wait_new_main_pid "$pid3" >/dev/null
# The admin's edit of the conffile survives, so the admin port is still 9191.
wait_ready 9191
expect_eq "records after an upgrade" "$(guest pico read /deb/check)" "$expected_records"

say "dpkg -r"
guest dpkg -r picomq >"$work/dpkg-remove.log" 2>&1 || { cat "$work/dpkg-remove.log" >&2; fail "dpkg -r"; }
expect_eq "state after dpkg -r" "$(guest systemctl is-active picomq || true)" inactive
expect_eq "main process after dpkg -r" "$(main_pid)" 0
left=$(guest sh -c "grep -l '^Uid:[[:space:]]*${uid}[[:space:]]' /proc/[0-9]*/status 2>/dev/null || true")
[ -z "$left" ] || fail "processes of picomq left after dpkg -r: $left"
! guest test -e /usr/bin/pico || fail "/usr/bin/pico is still there after dpkg -r"
guest test -f /var/lib/picomq/data/meta.db || fail "dpkg -r removed the data"
guest test -f /etc/default/picomq || fail "dpkg -r removed /etc/default/picomq"
guest id picomq >/dev/null || fail "dpkg -r removed the user"

say "dpkg --purge"
guest dpkg --purge picomq >"$work/dpkg-purge.log" 2>&1 || { cat "$work/dpkg-purge.log" >&2; fail "dpkg --purge"; }
! guest getent passwd picomq >/dev/null || fail "the user picomq is still there after purge"
! guest getent group picomq >/dev/null || fail "the group picomq is still there after purge"
! guest test -e /var/lib/picomq || fail "/var/lib/picomq is still there after purge"
! guest test -e /etc/default/picomq || fail "/etc/default/picomq is still there after purge"
if grep -qv -E '^(\(Reading database|Purging configuration files)' "$work/dpkg-purge.log"; then
  cat "$work/dpkg-purge.log" >&2
  fail "dpkg --purge printed more than dpkg's own lines"
fi

stop_machine
say "ok ($((SECONDS - started)) s)"
