#!/usr/bin/env bash
# Installs Garage (the S3 server the s3:// tests run against) into ~/.cargo/bin, unless a
# `garage` is already on PATH. A real Garage release, built for tests rather than production:
# the release profile's link-time optimization, single codegen unit and debug info are what
# make `cargo install garage` slow, and none of them changes what the tests check, so they are
# turned off (cargo reads CARGO_PROFILE_RELEASE_* before the crate's own profile).
# Measured on 2 busy cores: see the README's Test section.
#
#   scripts/garage-install.sh
set -euo pipefail

if command -v garage >/dev/null; then
  echo "garage-install: $(command -v garage) is already installed"
  exit 0
fi
# Its own target directory, removed afterwards: the build is 2-3 GB the project never reuses.
target=${GARAGE_TARGET_DIR:-$(mktemp -d /tmp/garage-target.XXXXXX)}
trap 'rm -rf "$target"' EXIT
CARGO_PROFILE_RELEASE_LTO=false \
  CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
  CARGO_PROFILE_RELEASE_OPT_LEVEL=1 \
  CARGO_PROFILE_RELEASE_DEBUG=false \
  CARGO_PROFILE_RELEASE_INCREMENTAL=false \
  CARGO_TARGET_DIR=$target \
  cargo install garage --locked --no-default-features --features bundled-libs,lmdb
