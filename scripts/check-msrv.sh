#!/usr/bin/env bash
# Fails when the minimum Rust version is stated inconsistently: the workspace's `rust-version`
# (Cargo.toml), the README's "Rust toolchain (X.Y+)" and the highest `rust-version` among the
# packages Cargo.lock pins must all be the same X.Y. Clippy's `incompatible_msrv` lint (on by
# default, run by CI with -D warnings) then keeps the project's own code within it.
#
#   scripts/check-msrv.sh     # prints `msrv: 1.88 (Cargo.toml, README, Cargo.lock agree)`
set -euo pipefail
cd "$(dirname "$0")/.."

# X.Y of a version (1.88.0 and 1.88 are the same minimum).
minor() { printf '%s\n' "$1" | cut -d. -f1,2; }

declared=$(sed -n 's/^rust-version = "\([0-9.]*\)"/\1/p' Cargo.toml | head -n 1)
readme=$(sed -n 's/.*Rust toolchain (\([0-9.]*\)+).*/\1/p' README.md | head -n 1)
# Every package of the lock, whatever the platform: a user on any of them needs this rustc.
# Also the members that do not inherit the workspace's rust-version (cargo and clippy would not
# hold them to it).
metadata=$(cargo metadata --format-version 1 --locked)
locked=$(printf '%s' "$metadata" | python3 -c '
import json, sys
metadata = json.load(sys.stdin)
members = set(metadata["workspace_members"])
versions = [(tuple(int(x) for x in p["rust_version"].split(".")), p["name"])
            for p in metadata["packages"] if p.get("rust_version") and p["id"] not in members]
version, name = max(versions)
print(".".join(map(str, version[:2])), name)
')
locked_version=${locked%% *}
members=$(printf '%s' "$metadata" | python3 -c '
import json, sys
metadata = json.load(sys.stdin)
members = set(metadata["workspace_members"])
for p in metadata["packages"]:
    if p["id"] in members:
        print(p["name"], p.get("rust_version") or "none")
')

status=0
while read -r name version; do
  if [ "$version" != "$declared" ]; then
    echo "msrv: $name has rust-version $version, not the workspace's (rust-version.workspace = true)" >&2
    status=1
  fi
done <<<"$members"
[ -n "$declared" ] || { echo "msrv: no rust-version in Cargo.toml" >&2; status=1; }
[ -n "$readme" ] || { echo "msrv: README does not say \"Rust toolchain (X.Y+)\"" >&2; status=1; }
if [ -n "$declared" ] && [ -n "$readme" ]; then
  if [ "$(minor "$declared")" != "$locked_version" ] || [ "$(minor "$readme")" != "$locked_version" ]; then
    echo "msrv: Cargo.toml says $declared, README says $readme, Cargo.lock needs $locked_version (${locked#* })" >&2
    status=1
  fi
fi
[ "$status" = 0 ] && echo "msrv: $locked_version (Cargo.toml, README, Cargo.lock agree)"
exit "$status"
