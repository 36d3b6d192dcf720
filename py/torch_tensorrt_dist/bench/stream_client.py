"""One streamed completion read by a client process of its own (``bench --section
serve_clients``): standard library only, run as a script, so a client starts in a fraction of a
second and shares no interpreter (and no lock) with the other clients or the bench.

    python stream_client.py '{"url": ..., "body": {...}, "start": T, "stall_s": 0}'

It waits until ``time.monotonic()`` reaches ``start`` (every client of a run sends at once),
sends ``body`` to ``/v1/completions`` on one HTTP/1.1 connection and prints one JSON line: when
it sent (``sent``), the arrival time of each event with text (``times``; one clock for every
process of the machine), the completion tokens of the usage event, the text's length and its
U+FFFD, and the error event's message, if one came. ``stall_s`` > 0: after the first event
the client stops reading for that long at most, or until the file ``resume`` exists, with a
receive buffer of 4 KiB (a client that stopped reading: once the socket buffers are full, the
server's writes to it block), then reads the rest. ``nice``: the process's niceness is raised
by that much first: the bench's clients share the server's machine (its few cores), where a
real client would not, so they yield the CPU to the server's ranks and HTTP process.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Any

__all__ = ["connect", "read_stream"]


def connect(
    url: str, body: dict[str, Any], *, path: str = "/v1/completions", small_buffer: bool = False
) -> tuple[socket.socket, bytes]:
    """A socket connected to ``url``, and the HTTP/1.1 POST of ``body`` to ``path`` to send on
    it. ``small_buffer``: a receive buffer of 4 KiB (a client that stops reading fills it, then
    the server's socket buffers, soon)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if small_buffer:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.connect((host, int(port)))
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    ).encode()
    return sock, head + data


def read_stream(
    url: str, body: dict[str, Any], start: float, stall_s: float = 0.0, resume: str = ""
) -> dict[str, Any]:
    """The client's record of one stream (module docstring)."""
    sock, request = connect(url, body, small_buffer=stall_s > 0)
    time.sleep(max(0.0, start - time.monotonic()))
    out: dict[str, Any] = {"sent": time.monotonic(), "times": [], "tokens": 0, "chars": 0}
    out["fffd"] = out["bytes"] = 0
    sock.sendall(request)
    reader = sock.makefile("rb")
    status = reader.readline().split()
    if len(status) < 2 or status[1] != b"200":
        out["error"] = f"status {status!r}: {reader.read(2000)!r}"
        sock.close()
        return out
    stalled = False
    for raw in reader:  # chunked framing lines are skipped: events are whole lines here
        out["bytes"] += len(raw)
        if not raw.startswith(b"data: "):
            continue
        line = raw[6:].strip()
        if line == b"[DONE]":
            break
        event = json.loads(line)
        if "error" in event:
            out["error"] = event["error"].get("message", str(event["error"]))
            continue
        if event.get("choices") and event["choices"][0].get("text"):
            out["times"].append(time.monotonic())
            text = event["choices"][0]["text"]
            out["chars"] += len(text)
            out["fffd"] += text.count("\ufffd")
        if event.get("usage"):
            out["tokens"] = event["usage"]["completion_tokens"]
        if stall_s > 0 and not stalled:
            stalled, until = True, time.monotonic() + stall_s
            while time.monotonic() < until and not (resume and os.path.exists(resume)):
                time.sleep(0.1)
    sock.close()
    return out


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    if spec.get("nice"):
        os.nice(spec["nice"])  # below the server's processes (module docstring)
    record = read_stream(
        spec["url"], spec["body"], spec["start"], spec.get("stall_s", 0.0), spec.get("resume", "")
    )
    print(json.dumps(record), flush=True)
