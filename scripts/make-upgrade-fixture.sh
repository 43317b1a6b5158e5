#!/usr/bin/env bash
# Writes an upgrade fixture for cli/tests/upgrade.rs: a data directory (SQLite catalog, segment
# objects, WAL files, the Durable Streams subscriptions file) as a crash leaves it, written by
# the `pico` binary given, and manifest.json, what that binary acknowledged, read back through
# it before the kill.
#
#   scripts/make-upgrade-fixture.sh OLD_PICO_BINARY OUT_DIR LABEL
#
# LABEL says which release wrote the fixture (it goes into manifest.json and README.md).
# The fixture of WAL format 1 (cli/tests/fixtures/v0.2-wal-v1) was made with the binary of
# commit 890fc16, the last commit whose WAL files are frames only, with no file header:
#
#   git worktree add /tmp/wt-old 890fc16 --detach
#   (cd /tmp/wt-old && CARGO_TARGET_DIR=/tmp/wt-old/target cargo build -p pico-cli)
#   scripts/make-upgrade-fixture.sh /tmp/wt-old/target/debug/pico \
#       cli/tests/fixtures/v0.2-wal-v1 "commit 890fc16 (pico 0.2.0, WAL format 1)"
#
# The node runs on 127.0.0.1 (ephemeral ports) with 2 cores, local durability and 64 KiB
# segments that seal only by size (a 10-minute age limit): the core of the bulk stream seals
# two segments (uploaded, in the catalog, with whatever that core wrote before them), and
# everything written after them, on either core, is only in the WAL files.
# Then it is killed with SIGKILL. The WAL files are pre-allocated and zero-filled: the fixture
# keeps each one cut just after its last frame (the script checks that only zeros are cut).
# The SQLite catalog is checkpointed into meta.db (SQLite's own -wal file, which a kill leaves
# holding every page written, is 400 KiB; the rows are the same). Needs python3.
set -euo pipefail

if [[ $# -ne 3 ]]; then
    echo "usage: $0 OLD_PICO_BINARY OUT_DIR LABEL" >&2
    exit 2
fi
bin="$(realpath "$1")"
out="$2"
label="$3"
if [[ -e "$out" ]] && [[ -n "$(ls -A "$out" 2>/dev/null)" ]]; then
    echo "$out exists and is not empty" >&2
    exit 2
fi

work="$(mktemp -d)"
pid=""
cleanup() {
    if [[ -n "$pid" ]]; then kill -9 "$pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

# glommio locks memory for its io_uring rings; keep what the environment allows if it cannot
# be raised.
ulimit -l unlimited 2>/dev/null || true

mkdir -p "$work/data"
"$bin" serve --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --ds-listen 127.0.0.1:0 \
    --meta-url "sqlite:$work/data/meta.db" --storage "-2@file://$work/objects" \
    --wal-dir "$work/data/wal" --durability local --cores 2 \
    --segment-size 64KiB --segment-max-age-ms 600000 \
    >"$work/stdout" 2>"$work/server.log" &
pid=$!

pico_addr="" ds_addr=""
for _ in $(seq 1 300); do
    pico_addr="$(sed -n 's|^serving on http://\([^ ]*\).*|\1|p' "$work/stdout")"
    ds_addr="$(sed -n 's|^durable streams on http://\([^ ]*\).*|\1|p' "$work/stdout")"
    [[ -n "$pico_addr" && -n "$ds_addr" ]] && break
    if ! kill -0 "$pid" 2>/dev/null; then
        cat "$work/server.log" >&2
        exit 1
    fi
    sleep 0.1
done
if [[ -z "$pico_addr" || -z "$ds_addr" ]]; then
    echo "the node did not announce its listeners" >&2
    cat "$work/server.log" >&2
    exit 1
fi
echo "pico on $pico_addr, durable streams on $ds_addr"

# Writes the streams, waits for the sealed segments' upload, reads everything back.
python3 - "$pico_addr" "$ds_addr" "$work/manifest.json" "$work/objects" "$label" <<'PY'
import base64, glob, http.client, json, struct, sys, time

pico_addr, ds_addr, manifest_path, objects_dir, label = sys.argv[1:6]


def request(addr, method, path, headers=None, body=b""):
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    if isinstance(body, str):
        body = body.encode()
    conn.request(method, path, body=body, headers=headers or {})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, data


def expect(status, addr, method, path, headers=None, body=b""):
    got, head, data = request(addr, method, path, headers, body)
    if got != status:
        sys.exit(f"{method} {path}: {got} (expected {status}): {data[:300]!r}")
    return head, data


def pico(method, path, status, headers=None, body=b""):
    return expect(status, pico_addr, method, path, headers, body)


def ds(method, path, status, headers=None, body=b""):
    return expect(status, ds_addr, method, path, headers, body)


def batch(records):
    return json.dumps({"records": records})


BATCH = {"content-type": "application/vnd.picomq.batch+json"}
producers = []  # the producer states acknowledged last, per stream and producer id

# Records with headers: single bodies, JSON batches with headers, a binary body, an empty body
# and a body that ends in zero bytes.
pico("PUT", "/fx/headers", 201, {"content-type": "text/plain"})
pico("POST", "/fx/headers", 200, {}, "hello")
pico("POST", "/fx/headers", 200, BATCH, batch([
    {"headers": {"k": "v", "trace": "t-1"}, "body": "with two headers"},
    {"body_b64": base64.b64encode(b"\xff\x00\x01binary").decode()},
    {"headers": {"only": "header"}},
]))
pico("POST", "/fx/headers", 200, {}, "plain again")
pico("POST", "/fx/headers", 200, BATCH, batch([
    {"headers": {"n": 7, "flag": True}, "body": "json header values"},
    {"headers": {"z": ""}, "body_b64": base64.b64encode(b"ends in zeros\x00\x00\x00").decode()},
]))

# A stream closed by its last append, and one created closed.
pico("PUT", "/fx/closed", 201, {"content-type": "text/plain"})
pico("POST", "/fx/closed", 200, {}, "one")
pico("POST", "/fx/closed", 200, BATCH, batch([{"body": "two"}, {"body": "three"}]))
head, _ = pico("POST", "/fx/closed", 200, {"pico-closed": "true"}, "last")
assert head.get("pico-closed") == "true", head
pico("PUT", "/fx/closed-at-create", 201, {"content-type": "text/plain", "pico-closed": "true"})

# The bulk stream of idempotent producers: about 140 KiB, so its core seals two 64 KiB
# segments (uploaded, in the catalog) and keeps the rest in its WAL. Producer p2 appends only
# at the start (its state is in the catalog); p1 appends throughout, retries one request,
# then moves to epoch 1 (its state is in the WAL).
pico("PUT", "/fx/producer", 201, {"content-type": "application/octet-stream"})


def produce(producer, epoch, seq, records, status=200):
    headers = dict(BATCH)
    headers.update({
        "pico-producer-id": producer,
        "pico-producer-epoch": str(epoch),
        "pico-producer-seq": str(seq),
    })
    return pico("POST", "/fx/producer", status, headers, batch(records))


def bulk(producer, epoch, seq):
    return [
        {"headers": {"producer": producer, "epoch": str(epoch), "seq": str(seq), "i": str(i)},
         "body": f"{producer}/{epoch}/{seq}/{i} " + "abcdefghijklmnopqrstuvwxyz0123456789" * 22}
        for i in range(4)
    ]


for seq in range(3):
    produce("p2", 0, seq, bulk("p2", 0, seq))
for seq in range(37):
    head, _ = produce("p1", 0, seq, bulk("p1", 0, seq))
    assert "pico-start-seq" in head, head
    if seq == 10:
        # A retry of an applied request: a duplicate, nothing written.
        head, _ = produce("p1", 0, seq, bulk("p1", 0, seq))
        assert "pico-start-seq" not in head, head
for seq in range(3):
    produce("p1", 1, seq, [{"body": f"p1 epoch 1 seq {seq}"}])
producers += [
    {"stream": "/fx/producer", "protocol": "pico", "id": "p1", "epoch": 1, "seq": 2},
    {"stream": "/fx/producer", "protocol": "pico", "id": "p2", "epoch": 0, "seq": 2},
]

# A trimmed stream: 20 records, the first 8 trimmed away.
pico("PUT", "/fx/trimmed", 201, {"content-type": "text/plain"})
pico("POST", "/fx/trimmed", 200, BATCH, batch([{"body": f"t{i}"} for i in range(20)]))
head, _ = pico("POST", "/fx/trimmed", 200, {"pico-trim-seq": "8"})
assert head["pico-start-seq"] == "8", head

# A deleted stream, and one deleted and created again (its second life starts at offset 0).
pico("PUT", "/fx/deleted", 201, {"content-type": "text/plain"})
pico("POST", "/fx/deleted", 200, {}, "gone 0")
pico("POST", "/fx/deleted", 200, {}, "gone 1")
pico("DELETE", "/fx/deleted", 204)
pico("PUT", "/fx/recreated", 201, {"content-type": "text/plain"})
pico("POST", "/fx/recreated", 200, BATCH, batch([{"body": f"first life {i}"} for i in range(3)]))
pico("DELETE", "/fx/recreated", 204)
pico("PUT", "/fx/recreated", 201, {"content-type": "text/plain"})
pico("POST", "/fx/recreated", 200, BATCH, batch([{"body": f"second life {i}"} for i in range(2)]))

# An empty stream with a retention policy (a limit no test run reaches).
pico("PUT", "/fx/empty", 201,
     {"content-type": "application/json", "pico-retention-bytes": "1073741824"})

# Durable Streams: a JSON stream with an idempotent producer and Stream-Seq, a fork of it
# with an append of its own, and a closed text stream.
ds("PUT", "/ds/json", 201, {"content-type": "application/json"})


def ds_produce(seq, body, stream_seq, status=200):
    return ds("POST", "/ds/json", status, {
        "content-type": "application/json",
        "producer-id": "dsp",
        "producer-epoch": "0",
        "producer-seq": str(seq),
        "stream-seq": stream_seq,
    }, body)


ds_produce(0, '[{"n":1},{"n":2}]', "a001")
ds_produce(1, '{"n":3,"text":"three"}', "a002")
ds_produce(1, '{"n":3,"text":"three"}', "a002", status=204)  # a duplicate
producers.append({"stream": "/ds/json", "protocol": "ds", "id": "dsp", "epoch": 0, "seq": 1,
                  "stream_seq": "a002"})
ds("PUT", "/ds/fork", 201, {"stream-forked-from": "/ds/json"})
ds("POST", "/ds/fork", 204, {"content-type": "application/json"}, '{"n":"fork"}')
ds("PUT", "/ds/closed", 201, {"content-type": "text/plain"})
ds("POST", "/ds/closed", 204, {"content-type": "text/plain"}, "first line\n")
ds("POST", "/ds/closed", 204, {"content-type": "text/plain", "stream-closed": "true"}, "bye\n")

# A Durable Streams subscription (kept in <wal-dir>/subscriptions.json with the node's signing
# keys); its pattern matches no stream, so nothing is ever delivered to its URL.
ds("PUT", "/__ds/subscriptions/hook", 201, {"content-type": "application/json"}, json.dumps({
    "type": "webhook",
    "pattern": "fx-none/*",
    "webhook": {"url": "http://127.0.0.1:9/hook"},
    "description": "kept across upgrades",
}))

# The sealed segments are uploaded in the background: wait (bounded) for two.
deadline = time.time() + 60
while len(glob.glob(f"{objects_dir}/**/*.seg", recursive=True)) < 2:
    if time.time() > deadline:
        sys.exit("the sealed segments were not uploaded within 60 s")
    time.sleep(0.2)
time.sleep(1)


def decode_binary_read(data):
    pos = 0

    def take(n):
        nonlocal pos
        chunk = data[pos:pos + n]
        assert len(chunk) == n, "binary read truncated"
        pos += n
        return chunk

    assert take(1) == b"\x01"
    records = []
    for _ in range(struct.unpack(">I", take(4))[0]):
        seq, timestamp, count = struct.unpack(">QqI", take(20))
        headers = []
        for _ in range(count):
            name = take(struct.unpack(">I", take(4))[0]).decode()
            value = take(struct.unpack(">I", take(4))[0]).decode()
            headers.append([name, value])
        body = take(struct.unpack(">I", take(4))[0])
        record = {"seq": seq, "timestamp": timestamp, "headers": headers}
        try:
            record["body"] = body.decode()
        except UnicodeDecodeError:
            record["body_b64"] = base64.b64encode(body).decode()
        records.append(record)
    assert pos == len(data), "trailing bytes in a binary read"
    return records


def read_back(name):
    head, _ = pico("HEAD", name, 200)
    stream = {
        "name": name,
        "content_type": head["content-type"],
        "start_seq": int(head["pico-start-seq"]),
        "next_seq": int(head["pico-next-seq"]),
        "closed": head.get("pico-closed") == "true",
    }
    if "pico-retention-bytes" in head:
        stream["retention_bytes"] = int(head["pico-retention-bytes"])
    records, seq = [], stream["start_seq"]
    for _ in range(1000):
        head, data = pico("GET", f"{name}?seq={seq}&format=binary&bytes=1048576", 200)
        page = decode_binary_read(data)
        records += page
        seq = int(head["pico-next-seq"])
        if head.get("pico-up-to-date") == "true":
            break
    assert [r["seq"] for r in records] == list(range(stream["start_seq"], stream["next_seq"]))
    stream["records"] = records
    return stream


def ds_read_back(name):
    head, data = ds("GET", f"{name}?offset=-1", 200)
    return {
        "name": name,
        "next_offset": head["stream-next-offset"],
        "closed": head.get("stream-closed") == "true",
        "body": data.decode(),
    }


listing = json.loads(pico("GET", "/?prefix=/", 200)[1])
names = [s["name"] for s in listing["streams"]]
assert not listing["has_more"]
assert "/fx/deleted" not in names
pico("HEAD", "/fx/deleted", 404)
manifest = {
    "written_by": label,
    "wal_format": 1,
    "streams": [read_back(name) for name in names],
    "deleted": ["/fx/deleted"],
    "producers": producers,
    "ds": [ds_read_back(name) for name in ["/ds/json", "/ds/fork", "/ds/closed"]],
    "subscriptions": [json.loads(ds("GET", "/__ds/subscriptions/hook", 200)[1])],
    "jwks": json.loads(ds("GET", "/__ds/jwks.json", 200)[1]),
}


# Pretty at the top, one line per record.
def dump(value, depth=0):
    pad = " " * (depth + 1)
    if isinstance(value, dict) and "seq" in value and "timestamp" in value:
        return json.dumps(value)
    if isinstance(value, dict) and value:
        items = [f"{pad}{json.dumps(k)}: {dump(v, depth + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * depth + "}"
    if isinstance(value, list) and value and isinstance(value[0], (dict, list)):
        items = [pad + dump(v, depth + 1) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + " " * depth + "]"
    return json.dumps(value)


text = dump(manifest)
assert json.loads(text) == manifest
with open(manifest_path, "w") as f:
    f.write(text + "\n")
print(f"manifest: {len(names)} streams, "
      f"{sum(len(s['records']) for s in manifest['streams'])} records")
PY

kill -9 "$pid"
wait "$pid" 2>/dev/null || true
pid=""

# The fixture: the data directory with each WAL file cut after its last frame.
mkdir -p "$out"
cp -a "$work/data" "$work/objects" "$out/"
cp "$work/manifest.json" "$out/"
python3 - "$out/data/wal" <<'PY'
import glob, struct, sys

files = sorted(glob.glob(f"{sys.argv[1]}/*.wal"))
if not files:
    sys.exit("no WAL files left: nothing of the fixture is only in the WAL")
written = 0
for path in files:
    data = open(path, "rb").read()
    pos = 0
    while pos + 40 <= len(data):
        (length,) = struct.unpack_from("<I", data, pos)
        if length < 40 or pos + length > len(data):
            break
        pos += length
    if any(data[pos:]):
        sys.exit(f"{path}: bytes other than zeros after the last frame (at {pos})")
    with open(path, "r+b") as f:
        f.truncate(pos)
    print(f"{path}: {len(data)} bytes, frames end at {pos}")
    written += pos
if written == 0:
    sys.exit("the WAL files hold no frames: nothing of the fixture is only in the WAL")
PY
python3 - "$out/data/meta.db" <<'PY'
import os, sqlite3, sys

db = sqlite3.connect(sys.argv[1])
busy, _, _ = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
assert busy == 0
db.close()
for suffix in ("-wal", "-shm"):
    assert not os.path.exists(sys.argv[1] + suffix), f"meta.db{suffix} left after the checkpoint"
PY
cat >"$out/README.md" <<EOF
Written by $label, its binary run by \`scripts/make-upgrade-fixture.sh\` (which says how to
build it and re-make this directory); read by \`cli/tests/upgrade.rs\`. \`manifest.json\` is
what that release acknowledged, read back through it before \`kill -9\`; \`data/\` and
\`objects/\` are its \`--meta-url sqlite:data/meta.db --wal-dir data/wal
--storage -2@file://objects\`, WAL files cut after their last frame, SQLite's -wal file
checkpointed into meta.db.
EOF
echo "fixture in $out:"
find "$out" -type f -printf '%s\t%P\n' | sort -k2
