#!/usr/bin/env bash
# Builds the Debian package of PicoMQ, picomq_<version>-1_<arch>.deb: /usr/bin/pico, the
# systemd unit (packaging/systemd/picomq.service), its settings file /etc/default/picomq (a
# conffile) and the maintainer scripts of packaging/debian/ (a picomq system user; the service
# enabled and started on install, stopped on remove; data and user deleted on purge).
#
#   scripts/build-deb.sh                                   # release build of this checkout
#   PICO_BIN=target/debug/pico scripts/build-deb.sh        # package a binary already built
#   DEB_OUT_DIR=/tmp/debs scripts/build-deb.sh             # where the .deb goes
#   DEB_COMPRESSION=none scripts/build-deb.sh              # xz (default), gzip or none
#   DEB_MAINTAINER='Name <address>' scripts/build-deb.sh   # the Maintainer field
#
# Prints the path of the .deb on its last line. Needs dpkg-deb and dpkg-shlibdeps (package
# dpkg-dev), which compute the shared-library dependencies of the binary; the version comes
# from the workspace's Cargo.toml, the architecture from dpkg.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

for tool in dpkg-deb dpkg-shlibdeps dpkg-architecture; do
  command -v "$tool" >/dev/null || {
    echo "build-deb: $tool is missing (apt-get install dpkg-dev)" >&2
    exit 1
  }
done

if [ -z "${PICO_BIN:-}" ]; then
  cargo build --release --locked -p pico-cli >&2
  PICO_BIN=$root/target/release/pico
fi
[ -x "$PICO_BIN" ] || {
  echo "build-deb: $PICO_BIN is not an executable" >&2
  exit 1
}

# The workspace's version (`version = "X"` under [workspace.package]); a pre-release's `-`
# becomes `~`, which Debian sorts before the release (0.3.0~rc.1 < 0.3.0).
upstream=$(awk '
  /^\[/ { section = $0 }
  section == "[workspace.package]" && $1 == "version" { gsub(/"/, "", $3); print $3; exit }
' Cargo.toml)
[[ $upstream =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.]+)?$ ]] || {
  echo "build-deb: no usable version under [workspace.package] in Cargo.toml: '$upstream'" >&2
  exit 1
}
version=${upstream/-/\~}-1
arch=$(dpkg --print-architecture)

out_dir=${DEB_OUT_DIR:-$root/target/debian}
mkdir -p "$out_dir"
work=$(mktemp -d /tmp/picomq-deb-build.XXXXXX)
trap 'rm -rf "$work"' EXIT
pkg=$work/pkg
umask 022

install -D -m 0755 "$PICO_BIN" "$pkg/usr/bin/pico"
# Stripped as Debian ships binaries: a panic still says where (its message carries the file
# and line), a backtrace no longer names functions.
strip --strip-unneeded --remove-section=.comment --remove-section=.note "$pkg/usr/bin/pico"
install -D -m 0644 packaging/systemd/picomq.service "$pkg/lib/systemd/system/picomq.service"
install -D -m 0644 packaging/debian/picomq.default "$pkg/etc/default/picomq"
install -D -m 0644 README.md "$pkg/usr/share/doc/picomq/README.md"
install -D -m 0644 packaging/debian/copyright "$pkg/usr/share/doc/picomq/copyright"
# A changelog of this build only: the project's history is its git log.
date=$(date -R -d "@${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}")
maintainer=${DEB_MAINTAINER:-PicoMQ maintainers <picomq@localhost>}
printf 'picomq (%s) unstable; urgency=medium\n\n  * Built from the PicoMQ workspace %s.\n\n -- %s  %s\n' \
  "$version" "$upstream" "$maintainer" "$date" | gzip -9n >"$work/changelog.Debian.gz"
install -D -m 0644 "$work/changelog.Debian.gz" "$pkg/usr/share/doc/picomq/changelog.Debian.gz"

# The binary's shared-library dependencies (libc6 (>= 2.34), ...), as dpkg-shlibdeps finds
# them from the libraries it links and their packages' symbols files. It reads a
# debian/control, so it runs in a scratch source tree.
mkdir -p "$work/src/debian"
printf 'Source: picomq\n\nPackage: picomq\nArchitecture: any\n' >"$work/src/debian/control"
shlibs=$(cd "$work/src" && dpkg-shlibdeps -O "$pkg/usr/bin/pico" 2>/dev/null |
  sed -n 's/^shlibs:Depends=//p')
[ -n "$shlibs" ] || {
  echo "build-deb: dpkg-shlibdeps found no dependencies for $PICO_BIN" >&2
  exit 1
}

mkdir -p "$pkg/DEBIAN"
install -m 0755 packaging/debian/postinst packaging/debian/prerm packaging/debian/postrm "$pkg/DEBIAN/"
echo /etc/default/picomq >"$pkg/DEBIAN/conffiles"
# ca-certificates: the pico client builds its HTTP client with the system's roots and refuses
# to start without any, plain http:// endpoints included.
installed_kib=$(du -sk --exclude=DEBIAN "$pkg" | cut -f1)
cat >"$pkg/DEBIAN/control" <<EOF
Package: picomq
Version: $version
Architecture: $arch
Maintainer: $maintainer
Installed-Size: $installed_kib
Depends: adduser, ca-certificates, $shlibs
Section: net
Priority: optional
Description: durable, real-time streams over HTTP
 PicoMQ serves streams of records over HTTP: PUT creates a stream, POST appends
 records, GET reads them (catch-up, long-poll or server-sent events). Appends
 are acknowledged once durable; sealed segments move to a directory or an
 S3-compatible bucket. It speaks its own Pico protocol and the Durable Streams
 protocol.
 .
 This package runs a node as the systemd service picomq (user picomq, data in
 /var/lib/picomq, settings in /etc/default/picomq) and installs the pico
 command-line client.
EOF

deb=$out_dir/picomq_${version}_${arch}.deb
dpkg-deb --root-owner-group -Z"${DEB_COMPRESSION:-xz}" --build "$pkg" "$deb" >&2
echo "$deb"
