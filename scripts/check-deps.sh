#!/usr/bin/env bash
# Keeps the dependency tree lean and its licenses compatible with Apache-2.0 (what
# `cargo deny check licenses bans` would do, without building cargo-deny in CI):
# - every crate version of Cargo.lock that Linux builds use carries a license from ALLOWED below
#   (an SPDX expression passes when one of its OR alternatives is made of allowed licenses);
# - no crate is in the lock in two versions unless DUPLICATES below names it, with the reason
#   no version bump of ours removes it. A new duplicate fails until it is removed or explained.
#
#   scripts/check-deps.sh     # prints `deps: N crates, licenses ok, duplicates: ...`
set -euo pipefail
cd "$(dirname "$0")/.."

metadata=$(mktemp)
trap 'rm -f "$metadata"' EXIT
cargo metadata --format-version 1 --locked --filter-platform x86_64-unknown-linux-gnu >"$metadata"
python3 - "$metadata" <<'PY'
import collections, json, re, sys

ALLOWED = {
    "MIT", "Apache-2.0", "Apache-2.0 WITH LLVM-exception", "BSD-2-Clause", "BSD-3-Clause",
    "ISC", "Zlib", "Unicode-3.0", "Unlicense", "0BSD", "BSL-1.0", "CC0-1.0",
    # File-level copyleft: using the crate unmodified asks nothing of the rest of the binary.
    "MPL-2.0",
}
# name -> why we cannot remove the second version ourselves.
DUPLICATES = {
    "base64": "postgres-protocol pins 0.22, reqwest and hyper-util use 0.23",
    "fallible-iterator": "rusqlite uses 0.3, the postgres crates 0.2",
    "fastrand": "glommio 0.9 pulls futures-lite 1, which uses fastrand 1",
    "futures-lite": "glommio 0.9 uses futures-lite 1",
    "getrandom": "ring and glommio (nanorand, ahash) use 0.2; tempfile and rand (postgres) 0.4",
    "hashbrown": "rusqlite (hashlink) uses 0.15, indexmap (h2) 0.17",
    "socket2": "glommio 0.9 uses socket2 0.4",
    "syn": "argh_derive, zerocopy-derive and tracing-attributes are still on syn 2; serde_derive and tokio-macros on 3",
    "synstructure": "follows syn: 0.13 for syn 2, 0.14 for syn 3",
}

metadata = json.load(open(sys.argv[1]))
used = {node["id"] for node in metadata["resolve"]["nodes"]}
packages = [p for p in metadata["packages"] if p["id"] in used and p["source"]]

def allowed(expression):
    # `MIT/Apache-2.0` is an old spelling of `MIT OR Apache-2.0`.
    expression = expression.replace("/", " OR ").replace("(", " ").replace(")", " ")
    for alternative in re.split(r"\s+OR\s+", expression.strip()):
        licenses = [l.strip().rstrip("+") for l in re.split(r"\s+AND\s+", alternative)]
        if all(l in ALLOWED for l in licenses):
            return True
    return False

problems = []
for p in packages:
    if not p.get("license"):
        problems.append(f"{p['name']} {p['version']}: no SPDX license in its manifest")
    elif not allowed(p["license"]):
        problems.append(f"{p['name']} {p['version']}: license {p['license']!r} is not allowed")

versions = collections.defaultdict(set)
for p in packages:
    versions[p["name"]].add(p["version"])
duplicates = {name: sorted(v) for name, v in versions.items() if len(v) > 1}
for name, v in sorted(duplicates.items()):
    if name not in DUPLICATES:
        problems.append(f"{name} is in the lock twice ({', '.join(v)}): remove one, or say in scripts/check-deps.sh why it stays")
for name in sorted(set(DUPLICATES) - set(duplicates)):
    problems.append(f"{name} is no longer duplicated: drop it from DUPLICATES in scripts/check-deps.sh")

if problems:
    print("\n".join("check-deps: " + p for p in problems))
    sys.exit(1)
print(f"deps: {len(packages)} crates, licenses ok, duplicates: {', '.join(sorted(duplicates)) or 'none'} (each explained)")
PY
