#!/usr/bin/env bash
# Writes cli/hot-code.ld, the linker script that places the functions a node runs next to each
# other at the start of the release binary's code, so that an idle node maps megabytes less of
# it (docs/decisions/2026-12-hot-code-layout.md; cli/build.rs passes the script to the linker
# of release builds).
#
# It runs a release build of this checkout under callgrind (valgrind) through two phases: what
# an idle node has run (its start, appends and reads in both protocols over HTTP/1.1, sealing,
# uploading and recording a segment while idle), then what a working node runs besides (h2c,
# long-poll and SSE readers, load, the admin port). It lists every function of the binary that
# ran, the first phase's first, each phase hottest (own instructions) first, and writes one
# input-section pattern per function with the parts of its name that change between builds
# (symbol hashes, crate disambiguators, clone suffixes) replaced by `*`: the script keeps
# working across toolchain and dependency updates, and a function renamed or new since it was
# written is only placed with the rest of the code.
#
#   scripts/hot-code.sh            (about two minutes: the release build, then the workload)
#   PICO_BIN=path scripts/hot-code.sh     (a release binary built already)
#
# Run it again when BENCHMARKS.md's idle memory ("own code") grows.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "hot-code: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
if [ -z "${PICO_BIN:-}" ]; then
  cargo build --release -p pico-cli >/dev/null
  PICO_BIN=target/release/pico
fi
bin=$(realpath "$PICO_BIN")
work=$(mktemp -d /tmp/pico-hot-code.XXXXXX)
node_pid=
cleanup() {
  if [ -n "$node_pid" ]; then
    kill -9 "$node_pid" 2>/dev/null
    wait "$node_pid" 2>/dev/null
  fi
  rm -rf "$work"
}
trap cleanup EXIT

port=$((20000 + RANDOM % 10000))
pico_url=http://127.0.0.1:$port
ds_url=http://127.0.0.1:$((port + 1))
admin_url=http://127.0.0.1:$((port + 2))
# The embedded default (SQLite, file://), both protocols and the admin port, segments sealed
# by age after a second so that the idle part of the run seals, uploads and records one.
valgrind --tool=callgrind --demangle=no --callgrind-out-file="$work/callgrind.out" \
  "$bin" serve --cores 1 --listen "127.0.0.1:$port" --ds-listen "127.0.0.1:$((port + 1))" \
  --admin-listen "127.0.0.1:$((port + 2))" --meta-url "sqlite:$work/meta.db" \
  --storage "-2@file://$work/objects" --wal-dir "$work/wal" --segment-max-age-ms 1000 \
  >"$work/node.log" 2>&1 &
node_pid=$!
for _ in $(seq 1 120); do
  curl -sf -o /dev/null -m 1 "$admin_url/ready" && break
  sleep 0.5
done
curl -sf -o /dev/null "$admin_url/ready" || { cat "$work/node.log" >&2; exit 1; }

pico() { "$bin" "$@"; }
lines() { seq 1 "$1" | sed 's/^/record /'; }
# `dump N` writes callgrind's counts since the last dump to callgrind.out.N.
dump() {
  callgrind_control -d "$node_pid" >/dev/null 2>&1
  for _ in $(seq 1 60); do
    [ -s "$work/callgrind.out.$1" ] && break
    sleep 0.5
  done
  sleep 1
}

# Phase 1, what an idle node has run: its start, a few appends and reads in each protocol over
# HTTP/1.1, then idle seconds in which it seals, uploads and records its segments.
pico --endpoint "$pico_url" create train/pico 2>/dev/null
lines 200 | pico --endpoint "$pico_url" append train/pico 2>/dev/null
pico --endpoint "$pico_url" read train/pico >/dev/null
pico --endpoint "$pico_url" head train/pico >/dev/null
pico --endpoint "$ds_url" --protocol ds create train/ds 2>/dev/null
lines 200 | pico --endpoint "$ds_url" --protocol ds append train/ds 2>/dev/null
pico --endpoint "$ds_url" --protocol ds read train/ds >/dev/null
sleep 15
dump 1

# Phase 2, what a working node runs besides: h2c, live readers (long-poll, SSE) answered by
# appends, a few seconds of load in each protocol, the admin port.
for protocol in pico ds; do
  url=$pico_url
  [ "$protocol" = ds ] && url=$ds_url
  pico --endpoint "$url" --protocol "$protocol" --http2 create "train/h2$protocol" 2>/dev/null
  lines 200 | pico --endpoint "$url" --protocol "$protocol" --http2 append "train/h2$protocol" \
    2>/dev/null
  pico --endpoint "$url" --protocol "$protocol" --http2 read "train/h2$protocol" >/dev/null
done
timeout 10 "$bin" --endpoint "$pico_url" tail train/pico >/dev/null 2>&1 &
reader=$!
curl -s -m 8 -o /dev/null "$ds_url/train/ds?offset=-1&live=sse" &
sse=$!
curl -s -m 8 -o /dev/null "$ds_url/train/ds?offset=now&live=long-poll" &
long_poll=$!
sleep 2
lines 3 | pico --endpoint "$pico_url" append train/pico 2>/dev/null
curl -s -o /dev/null -X POST -H 'content-type: text/plain' --data-binary x "$ds_url/train/ds"
wait "$reader" "$sse" "$long_poll" || true
pico --endpoint "$pico_url" bench -d 2 -w 8 -b 256 --interval 0 >/dev/null 2>&1 || true
pico --endpoint "$ds_url" --protocol ds bench -d 2 -w 8 -b 256 --interval 0 >/dev/null 2>&1 || true
curl -s -o /dev/null "$admin_url/metrics"
curl -s -o /dev/null "$admin_url/health"
sleep 3
dump 2

python3 - "$bin" "$work/callgrind.out.1" "$work/callgrind.out.2" >"$work/hot-code.ld" <<'PY'
import re, subprocess, sys
binary, dumps = sys.argv[1], sys.argv[2:]
# Own instructions (Ir) of each function of the binary in each phase, from callgrind's
# compressed format:
# `ob=`/`fn=` name the object and function of the cost lines that follow, `(id) name` defines
# an id; the cost line after a `calls=` line is the call's inclusive cost, not the caller's.
cost = []
for dump in dumps:
    cost.append({})
    names, objects, obj, fn, after_call = {}, {}, None, None, False
    for line in open(dump):
        m = re.match(r"^(c?ob|c?fn)=\((\d+)\)(?: (.*))?$", line.rstrip("\n"))
        if m:
            kind, ident, name = m.groups()
            if name:
                (objects if kind.endswith("ob") else names)[ident] = name
            if kind == "ob":
                obj = objects.get(ident)
            elif kind == "fn":
                # valgrind names the object of code outside `.text` (the `.text.hot` this
                # script lays out, in a build that has it) "???"; the symbol check below keeps
                # the binary's own functions.
                fn = names.get(ident) if obj in (binary, "???") else None
                if fn:
                    cost[-1].setdefault(fn, 0)
            continue
        if line.startswith("calls="):
            after_call = True
            continue
        fields = line.split()
        if fn and fields and re.match(r"^[+\-*0-9]", fields[0]):
            if after_call:
                after_call = False
            elif len(fields) > 1:
                cost[-1][fn] += int(fields[1])
# Only functions that are symbols of the binary (callgrind names recursion levels `'2`).
symbols = set()
for line in subprocess.run(["nm", "--defined-only", binary], capture_output=True, text=True).stdout.splitlines():
    parts = line.split()
    if len(parts) == 3 and parts[1] in "tTwW":
        symbols.add(parts[2])
# Phase by phase: what an idle node ran comes first, and is all an idle node maps.
ran = {}
for phase, phase_cost in enumerate(cost):
    for name, ir in phase_cost.items():
        name = re.sub(r"'\d+$", "", name)
        if name in symbols:
            first_phase, total = ran.get(name, (phase, 0))
            ran[name] = (first_phase, total + ir)

# A node runs well over a thousand of its functions in this workload; far fewer means the
# profile did not see the binary's code, and the script in place is kept.
RAN_FUNCTIONS_MIN = 500
if len(ran) < RAN_FUNCTIONS_MIN:
    sys.exit(f"hot-code: only {len(ran)} of the binary's functions seen running; cli/hot-code.ld kept")

def pattern(name):
    # Legacy Rust symbols end in a hash of the instance (`17h` + 16 hex digits + `E`); v0
    # symbols carry crate disambiguators (`Cs...`) and back-references by byte offset (`B..._`)
    # that move with them; LLVM and GCC add numbered suffixes to local clones.
    name = re.sub(r"17h[0-9a-f]{16}E", "17h*", name)
    if name.startswith("_R"):
        name = re.sub(r"Cs[0-9A-Za-z]*_", "Cs*_", name)
        name = re.sub(r"B[0-9A-Za-z]*_", "B*_", name)
    return re.sub(r"\.(llvm\.)?[0-9]+$", ".*", name)

seen, patterns = set(), [[] for _ in dumps]
for name, (phase, _) in sorted(ran.items(), key=lambda kv: (kv[1][0], -kv[1][1], kv[0])):
    p = pattern(name)
    if p not in seen:
        seen.add(p)
        patterns[phase].append(p)
print("/* Generated by scripts/hot-code.sh: the functions a node ran in its workload, those an idle")
print("   node ran first, then those of a working node, each part hottest first; placed ahead of the")
print("   rest of the code (docs/decisions/2026-12-hot-code-layout.md).")
print(f"   {len(seen)} patterns for {len(ran)} functions. */")
print("SECTIONS\n{\n  .text.hot :\n  {")
for phase, title in enumerate(["An idle node's functions.", "A working node's other functions."]):
    print(f"    /* {title} */")
    for p in patterns[phase]:
        print(f"    *(.text.{p} .text.unlikely.{p})")
print("  }\n}\nINSERT BEFORE .text;")
PY
# Replaced only once the script is whole.
mv "$work/hot-code.ld" cli/hot-code.ld
echo "hot-code: $(grep -c '^    \*(' cli/hot-code.ld) patterns in cli/hot-code.ld" >&2
