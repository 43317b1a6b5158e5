#!/usr/bin/env bash
# A lone writer's append, split at the disk (BENCHMARKS.md, "Live delivery"): one Durable
# Streams client on CPU 1 appends a 64 B record every 10 ms over one HTTP/1.1 connection to a
# fresh server on CPU 0, every acknowledgement after a durable write, while `perf record`
# traces the server's durable write: PicoMQ's WAL write (`io_uring` submission to completion,
# `RWF_DSYNC`), the comparison server's `fdatasync`. Live delivery waits for that write in
# both servers, and its time swings between runs on a virtual disk by more than the servers
# differ; what the server adds around it (the wake-ups, parsing, the answer, the client) is
# the append's time less the write's. Prints one Markdown row per run and server, alternated.
# Needs root for `perf`.
#
#   RUNS=3 APPENDS=400 scripts/bench-lone-writer.sh
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-3}
appends=${APPENDS:-400}
. scripts/lib/side-by-side.sh
find_servers
work=$(mktemp -d /tmp/pico-lone.XXXXXX)
server_pid=
trap 'stop_pinned; rm -rf "$work"' EXIT

# The client: PUT the stream, then APPENDS appends 10 ms apart; writes the monotonic clock's
# nanoseconds before each send and after each answer, one pair per line.
cat >"$work/writer.py" <<'EOF'
import socket, sys, time
port, count, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
sock = socket.create_connection(("127.0.0.1", port))
sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
def request(method, body=b""):
    head = "%s /w/lone HTTP/1.1\r\nHost: a\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n"
    sock.sendall((head % (method, len(body))).encode() + body)
    got = b""
    while b"\r\n\r\n" not in got:
        more = sock.recv(4096)
        if not more:
            sys.exit("the server closed the connection")
        got += more
request("PUT")
with open(out, "w") as times:
    for _ in range(count):
        sent = time.monotonic_ns()
        request("POST", b"x" * 64)
        times.write("%d %d\n" % (sent, time.monotonic_ns()))
        time.sleep(0.01)
EOF

# The split: for each append, its durable write within it (the only one the server's own
# threads start while it is in flight), and the rest. Skips the first 20 (warm-up).
cat >"$work/split.py" <<'EOF'
import bisect, sys
times, trace, pid = sys.argv[1], sys.argv[2], sys.argv[3]
starts, ends = [], []
inflight = {}
for line in open(trace):
    fields = line.split()
    if len(fields) < 5 or not fields[1].startswith(pid + "/"):
        continue
    at = float(fields[3].rstrip(":")) * 1e9
    event = fields[4].rstrip(":")
    if event == "syscalls:sys_enter_fdatasync":
        starts.append(at)
    elif event == "syscalls:sys_exit_fdatasync":
        ends.append(at)
    elif event == "io_uring:io_uring_submit_req":
        if "opcode WRITE" in line and "user_data 0x0," not in line:
            inflight[line.split("req ")[1].split(",")[0]] = at
    elif event == "io_uring:io_uring_complete":
        req = line.split("req ")[1].split(",")[0]
        if req in inflight:
            starts.append(inflight.pop(req))
            ends.append(at)
pairs = sorted(zip(starts, ends))
begins = [p[0] for p in pairs]
disk, rest = [], []
for row in list(open(times))[20:]:
    sent, answered = map(int, row.split())
    i = bisect.bisect_left(begins, sent)
    inside = [p for p in pairs[i:i + 3] if p[0] >= sent and p[1] <= answered]
    if len(inside) != 1:
        continue
    write = inside[0][1] - inside[0][0]
    disk.append(write)
    rest.append(answered - sent - write)
def p(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))] / 1e3
print("%d | %.0f / %.0f µs | %.0f / %.0f µs" % (len(disk), p(disk, 0.5), p(disk, 0.9), p(rest, 0.5), p(rest, 0.9)))
EOF

one() {
  local name=$1 dir
  shift
  dir=$(mktemp -d "$work/server.XXXXXX")
  start_pinned "$dir" "$@"
  perf record -q -k CLOCK_MONOTONIC -o "$dir/perf.data" \
    -e syscalls:sys_enter_fdatasync -e syscalls:sys_exit_fdatasync \
    -e io_uring:io_uring_submit_req -e io_uring:io_uring_complete -p "$server_pid" \
    -- taskset -c 1 python3 "$work/writer.py" "${server_url##*:}" "$appends" "$dir/times" \
    >"$dir/perf.out" 2>&1 || true
  stop_pinned
  perf script -i "$dir/perf.data" -F comm,pid,tid,cpu,time,event,trace --ns 2>/dev/null \
    >"$dir/trace"
  echo "| $run | $name | $(python3 "$work/split.py" "$dir/times" "$dir/trace" "$server_pid") |"
}

echo "| run | server | appends | durable write p50 / p90 | the rest p50 / p90 |"
echo "|---|---|---:|---:|---:|"
for run in $(seq 1 "$runs"); do
  one "PicoMQ" "$PICO_BIN" "${pico_serve[@]}"
  if [ -n "$peer" ]; then
    one "durable-streams-server 0.1.5" "$peer" "${peer_serve[@]}"
  fi
done
