"""The official Durable Streams Python client (PyPI `durable-streams`) against a running node.

Usage: python client_check.py BASE_URL

Creates its own streams under BASE_URL (a Durable Streams listener, e.g.
http://127.0.0.1:4438) and checks, with the client's public API only: create (idempotent
re-create), byte and JSON appends, head, catch-up reads (bytes and JSON), a long-poll read
that waits for an append made while it waits, an SSE read in JSON mode, a read from an offset,
Stream-Seq conflicts and delete. Prints one line per check and exits non-zero at the first
failure (a Python assertion names it). Every wait is bounded.
"""

import sys
import threading
import time
import uuid

import durable_streams as ds

TIMEOUT_S = 20.0


def check(name, condition, detail=""):
    if not condition:
        raise AssertionError(f"{name}: {detail}")
    print(f"ok {name}")


def until_ready(url):
    """The node may still be starting: retry a HEAD of a missing stream for a while."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            ds.DurableStream.head_static(f"{url}/__ready-{uuid.uuid4().hex}", timeout=2.0)
            return
        except ds.StreamNotFoundError:
            return
        except Exception:  # noqa: BLE001 - the node is not answering yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def main(base):
    base = base.rstrip("/")
    until_ready(base)
    run = uuid.uuid4().hex[:8]

    # Bytes: create, append, head, catch-up read.
    text_url = f"{base}/python/{run}/text"
    text = ds.DurableStream.create(text_url, content_type="text/plain", timeout=TIMEOUT_S)
    again = ds.DurableStream.create(text_url, content_type="text/plain", timeout=TIMEOUT_S)
    check("create is idempotent with the same settings", again.url == text.url)
    text.append("hello ")
    result = text.append("world")
    check("append answers the new tail", result.next_offset is not None, repr(result))
    head = text.head()
    check("head names the tail", head.offset == result.next_offset, f"{head!r} vs {result!r}")
    with text.stream(live=False) as response:
        body = response.read_text()
    check("catch-up read returns every byte in order", body == "hello world", repr(body))

    # JSON mode: one message per append (the client wraps each value, a list included, in an
    # array that the node flattens one level).
    json_url = f"{base}/python/{run}/json"
    stream = ds.DurableStream.create(
        json_url, content_type="application/json", timeout=TIMEOUT_S
    )
    stream.append({"n": 0})
    stream.append({"n": 1})
    stream.append([{"n": 2}, {"n": 3}])
    with stream.stream(live=False) as response:
        items = response.read_json()
    check(
        "JSON catch-up reads one message per append",
        items == [{"n": 0}, {"n": 1}, [{"n": 2}, {"n": 3}]],
        repr(items),
    )

    # From an offset: the messages after it.
    with stream.stream(live=False) as response:
        first = response.read_json()
        tail = response.offset
    stream.append({"n": 4})
    with stream.stream(offset=tail, live=False) as response:
        after = response.read_json()
    check("a read from an offset starts there", after == [{"n": 4}], repr(after))
    check("the first read saw three", len(first) == 3, repr(first))

    # Long-poll: a read at the tail waits for the next append.
    for live in ("long-poll", "sse"):
        url = f"{base}/python/{run}/live-{live}"
        live_stream = ds.DurableStream.create(
            url, content_type="application/json", timeout=TIMEOUT_S
        )
        live_stream.append({"before": True})
        got = []
        failure = []

        def read(live=live, live_stream=live_stream, got=got, failure=failure):
            try:
                # Live reads name where they start (the protocol refuses them without).
                with live_stream.stream(offset="-1", live=live) as response:
                    for item in response.iter_json():
                        got.append(item)
                        if len(got) == 3:
                            return
            except Exception as e:  # noqa: BLE001 - reported below
                failure.append(repr(e))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        time.sleep(0.5)
        live_stream.append({"after": 1})
        time.sleep(0.2)
        live_stream.append({"after": 2})
        reader.join(TIMEOUT_S)
        check(
            f"a {live} reader gets what was there and what came while it waited",
            got == [{"before": True}, {"after": 1}, {"after": 2}],
            f"{got!r} {failure!r}",
        )

    # Stream-Seq: a writer sequence that does not sort after the last one is refused.
    seq_url = f"{base}/python/{run}/seq"
    seq = ds.DurableStream.create(seq_url, content_type="text/plain", timeout=TIMEOUT_S)
    seq.append("a", seq="0002")
    try:
        seq.append("b", seq="0001")
        refused = False
    except ds.SeqConflictError:
        refused = True
    check("a Stream-Seq that goes back is a SeqConflictError", refused)

    # Delete: the stream is gone.
    text.delete()
    try:
        text.head()
        gone = False
    except ds.StreamNotFoundError:
        gone = True
    check("a deleted stream is not found", gone)
    print("python client: all checks passed")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
