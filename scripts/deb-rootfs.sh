#!/usr/bin/env bash
# Prepares what the Debian package check (scripts/deb-check.sh, cli/tests/debian_package.rs)
# needs: installs the tools where they are missing (debootstrap, systemd-nspawn from
# systemd-container, dpkg-shlibdeps from dpkg-dev) and makes a minimal Debian root file
# system with systemd as its init, once, in a cache directory keyed by the suite and the
# packages in it. The check boots a throwaway copy of it; the cached tree is never changed.
#
#   scripts/deb-rootfs.sh                       # prints the directory; the check finds it
#   DEB_CHECK_SUITE=trixie scripts/deb-rootfs.sh
#
# A rerun with everything in place does nothing (no apt-get, no download). The cache is
# $PICOMQ_DEB_CACHE (default /var/cache/picomq-deb); `current-<suite>` in it points at the
# tree the check uses by default. Delete the tree to get newer packages.
set -euo pipefail

cache=${PICOMQ_DEB_CACHE:-/var/cache/picomq-deb}
suite=${DEB_CHECK_SUITE:-bookworm}
mirror=${DEB_CHECK_MIRROR:-http://deb.debian.org/debian}
# systemd as PID 1; adduser and ca-certificates, the package's dependencies that minbase
# lacks (the check's machine has no network to fetch them); curl asks the node's /ready; dbus
# is what a Debian system with systemd has.
packages=systemd,systemd-sysv,dbus,adduser,ca-certificates,curl

updated=
apt_update() {
  if [ -z "$updated" ]; then
    apt-get update -qq
    updated=1
  fi
}
missing=()
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v systemd-nspawn >/dev/null || missing+=(systemd-container)
command -v dpkg-shlibdeps >/dev/null || missing+=(dpkg-dev)
command -v nsenter >/dev/null || missing+=(util-linux)
if [ ${#missing[@]} -gt 0 ]; then
  echo "deb-rootfs: installing ${missing[*]}" >&2
  apt_update
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

key=$(printf '%s\n' "$suite" "$packages" | sha256sum | cut -c1-12)
dir=$cache/$suite-$key
if [ ! -f "$dir/.picomq-ready" ]; then
  echo "deb-rootfs: debootstrap $suite ($packages) into $dir" >&2
  mkdir -p "$cache"
  rm -rf "$dir.tmp"
  log=$(mktemp /tmp/picomq-debootstrap.XXXXXX)
  if ! debootstrap --variant=minbase --include="$packages" "$suite" "$dir.tmp" "$mirror" >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    rm -f "$log"
    echo "deb-rootfs: debootstrap failed" >&2
    exit 1
  fi
  rm -f "$log"
  # The booted copies name themselves; no apt lists or downloaded packages are kept.
  echo picomq-deb-check >"$dir.tmp/etc/hostname"
  rm -rf "$dir.tmp"/var/cache/apt/archives/*.deb "$dir.tmp"/var/lib/apt/lists/*
  echo "$suite $packages" >"$dir.tmp/.picomq-ready"
  rm -rf "$dir"
  mv "$dir.tmp" "$dir"
fi
ln -sfn "$dir" "$cache/current-$suite"
echo "deb-rootfs: $suite root file system in $dir" >&2
echo "$dir"
