#!/usr/bin/env bash
# Installs Garage (the S3 server the s3:// tests run against) into ~/.cargo/bin, unless a
# `garage` is already on PATH. A real Garage release, built for tests rather than production:
# opt-level 1 instead of the release profile's 3 takes most of the optimizer's time out of the
# build and changes nothing the tests check. Garage's published manifest sets no profile of its
# own today; the other overrides (no cross-crate LTO, 16 codegen units, no debug info) keep it cheap
# should a release add one (CARGO_PROFILE_RELEASE_* win over a manifest's profile).
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
