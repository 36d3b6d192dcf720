"""A stream's pieces on their way to a client (``serving/stream_out.py``, ``bridge.PieceQueue``):
a slow reader's pending pieces merge (text, tokens, logprobs), a stalled one is cut with an
error event; then a real server where one raw-socket client stops reading while another
stream goes on."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from torch_tensorrt_dist.bench.stream_client import connect
from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.logits_process import TokenLogprobs
from torch_tensorrt_dist.serving.bridge import LOGPROBS_COST, Failed, Piece, PieceQueue
from torch_tensorrt_dist.serving.stream_out import CUT_CODE, PacedStream, StreamLimits

from ._serve import demo_with_chat_template, start_server


def _lp(token: int) -> TokenLogprobs:
    return TokenLogprobs(token, -0.5, ((token, -0.5),))


def test_a_sequences_waiting_pieces_merge_in_order() -> None:
    q = PieceQueue()
    q.put_nowait(Piece("a", 1, None, cached=3, index=0, logprobs=(_lp(1),), made=5.0))
    q.put_nowait(Piece("x", 1, None, index=1, made=5.5))
    q.put_nowait(Piece("b", 2, None, index=0, logprobs=(_lp(2), _lp(3)), made=6.0))
    q.put_nowait(Piece("c", 1, "length", index=0, logprobs=(_lp(4),), made=7.0))
    assert q.qsize() == 2 and q.merges == 2
    assert q.size == 4 + 4 * LOGPROBS_COST  # "abc" + "x", four tokens' logprobs
    first = q.get_nowait()
    assert isinstance(first, Piece)
    assert (first.text, first.tokens, first.finish, first.cached, first.made) == (
        "abc",
        4,
        "length",
        3,
        5.0,  # the earliest step: the wait of its oldest token
    )
    assert [t.token for t in first.logprobs] == [1, 2, 3, 4]
    assert q.get_nowait() == Piece("x", 1, None, index=1, made=5.5)
    assert q.empty() and q.size == 0
    # a finished piece takes nothing more; nothing merges across a failure
    q.put_nowait(Piece("d", 1, "stop", index=0))
    q.put_nowait(Piece("e", 1, None, index=1))
    q.put_nowait(Failed(503, "gone"))
    q.put_nowait(Piece("f", 1, None, index=1))
    items = [q.get_nowait() for _ in range(q.qsize())]
    assert [getattr(i, "text", None) for i in items] == ["d", "e", None, "f"]


def test_a_queue_past_its_bound_calls_on_full() -> None:
    q, calls = PieceQueue(max_pending=10), []
    q.on_full = lambda: calls.append(q.size)
    q.put_nowait(Piece("0123456789", 1, None))
    assert not q.over and calls == []
    q.put_nowait(Piece("!", 1, None))
    assert q.over and calls == [11] and q.qsize() == 1


def test_a_full_queue_cuts_a_blocked_write() -> None:
    stalled = _Stalled(takes=2)  # the start and one event
    limits = StreamLimits(write_timeout_s=0.5, max_pending=8 * 5)
    cuts, _ = _run_stream(stalled, limits, pieces=50, fill=True)
    assert len(cuts) == 1 and "read too slowly" in cuts[0] and "at most 40" in cuts[0]


def test_limits_are_checked() -> None:
    with pytest.raises(ConfigError, match="--write-timeout must be > 0"):
        StreamLimits(write_timeout_s=0)


class _Stalled:
    """An ASGI ``send`` whose client stopped reading after ``takes`` body messages: later sends
    wait until ``resume`` is set."""

    def __init__(self, takes: int) -> None:
        self.takes, self.sent = takes, []
        self.resume = asyncio.Event()

    async def __call__(self, message: dict[str, Any]) -> None:
        if len(self.sent) >= self.takes:  # the response's start too, where takes == 0
            await self.resume.wait()
        self.sent.append(message)


def _run_stream(
    stalled: _Stalled, limits: StreamLimits, pieces: int, fill: bool = False
) -> tuple[Any, list[str]]:
    """``pieces`` events through a PacedStream to ``stalled``; ``fill``: while a write waits,
    more pieces arrive (8 characters every 10 ms)."""
    cuts: list[str] = []
    closed, writes = [], []

    async def body() -> None:
        q = PieceQueue(limits.max_pending)

        async def chunks() -> Any:
            try:
                for i in range(pieces):
                    q.put_nowait(Piece("x" * 8, 1, None))
                    await q.get()
                    yield f"data: {i}\n\n", 1.0
                    await asyncio.sleep(0)
                yield "data: [DONE]\n\n", 0.0
            finally:
                closed.append(True)

        stream = PacedStream(chunks(), q, limits, on_cut=cuts.append, on_write=writes.append)

        async def steps() -> None:  # the step loop goes on while the client does not read
            for _ in range(100):
                await asyncio.sleep(0.01)
                q.put_nowait(Piece("y" * 8, 1, None))

        filling = asyncio.ensure_future(steps()) if fill else None
        task = asyncio.ensure_future(stream.stream_response(stalled))  # type: ignore[arg-type]
        await asyncio.sleep(limits.write_timeout_s * 1.5)  # cut at 1x; its error waits
        stalled.resume.set()  # the client reads again: it finds the error event
        await asyncio.wait_for(task, 5)
        if filling is not None:
            filling.cancel()

    asyncio.run(body())
    assert closed == [True]
    texts = [m.get("body", b"").decode() for m in stalled.sent[1:]]
    # each event written with a step time is told, once; [DONE] and the error have none
    assert writes == [1.0] * sum(t.startswith("data: ") and t[6:7].isdigit() for t in texts)
    return cuts, texts


def test_a_client_that_stops_reading_is_cut_with_an_error_event() -> None:
    stalled = _Stalled(takes=3)  # the start and two events, then nothing
    cuts, texts = _run_stream(stalled, StreamLimits(write_timeout_s=0.2), pieces=50)
    assert len(cuts) == 1 and "did not read for" in cuts[0]
    assert texts[:2] == ["data: 0\n\n", "data: 1\n\n"]
    error = json.loads(texts[2].removeprefix("data: "))["error"]
    assert error["code"] == CUT_CODE
    assert "write timeout is 0.2 s" in error["message"]
    assert texts[3:] == ["data: [DONE]\n\n", ""]  # then the response's end


def test_a_start_past_its_deadline_cuts_the_stream_and_cleans_up() -> None:
    """The status line and headers are under the write deadline too; the request's cleanup
    (``on_close``) runs although its events never started."""
    stalled, cuts, closed = _Stalled(takes=0), [], []

    async def body() -> float:
        q = PieceQueue()

        async def chunks() -> Any:
            yield "data: 0\n\n", 1.0

        stream = PacedStream(
            chunks(),
            q,
            StreamLimits(write_timeout_s=0.2),
            on_cut=cuts.append,
            on_close=lambda: closed.append(list(cuts)),
        )
        start = time.monotonic()
        await asyncio.wait_for(stream.stream_response(stalled), 5)  # type: ignore[arg-type]
        return time.monotonic() - start

    took = asyncio.run(body())
    assert 0.2 <= took < 1.5  # cut at its deadline, not when the client reads again
    assert len(cuts) == 1 and "did not read for 0.2 s" in cuts[0]
    assert closed == [cuts]  # once, after the cut
    assert stalled.sent == []  # nothing of it was sent


def test_a_client_that_reads_is_not_cut() -> None:
    stalled = _Stalled(takes=10**6)
    cuts, texts = _run_stream(stalled, StreamLimits(write_timeout_s=0.05), pieces=20)
    assert cuts == [] and texts[-2:] == ["data: [DONE]\n\n", ""] and len(texts) == 22


# a real server: one client stops reading, another stream goes on


_ARGS = ["--tp", "1", "--engine", "none", "--max-seq-len", "256", "--max-batch-size", "16"]
_WRITE_TIMEOUT = 2.0


def _stalled_request(url: str, body: dict[str, Any]) -> socket.socket:
    """A stream request on a socket whose receive buffer is small; nothing is read."""
    sock, request = connect(url, body, path="/v1/chat/completions", small_buffer=True)
    sock.sendall(request)
    return sock


def _read_all(sock: socket.socket, timeout_s: float) -> bytes:
    sock.settimeout(timeout_s)
    out = bytearray()
    try:
        while chunk := sock.recv(1 << 16):
            out += chunk
            if out.endswith(b"0\r\n\r\n"):
                break
    except TimeoutError:
        pass
    return bytes(out)


@pytest.mark.skipif(
    not Path("/proc/sys/net/ipv4/tcp_wmem").is_file()
    or int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2]) > 4 << 20,
    reason="needs Linux with a socket send buffer of at most 4 MiB (the stream's ~5 MB fill it)",
)
def test_a_stalled_client_is_cut_and_the_other_streams_flow(tmp_path: Path) -> None:
    ckpt = demo_with_chat_template(tmp_path / "demo-chat")  # chat: top_logprobs up to 20
    for name in ("config.json", "generation_config.json"):  # a rare token ends the text:
        cfg = json.loads((ckpt / name).read_text())  # the streams run to max_tokens
        cfg["eos_token_id"] = 1023
        (ckpt / name).write_text(json.dumps(cfg))
    args = ["--model", str(ckpt), "--served-model-name", "demo", *_ARGS]
    srv = start_server([*args, "--write-timeout", str(_WRITE_TIMEOUT)])
    try:
        # 12 choices whose logprobs make each event ~2 KB: ~5 MB, more than the server's socket
        # buffer takes (the kernel's 4 MiB at most) once the client stops reading
        big = {
            "model": "demo",
            "messages": [{"role": "user", "content": "The for statement"}],
            "max_tokens": 230,
            "stream": True,
            "logprobs": True,
            "top_logprobs": 20,
            "n": 12,
        }
        stalled = _stalled_request(srv.url, big)
        gaps: list[float] = []
        finish: list[str] = []

        def other() -> None:
            body = {k: v for k, v in big.items() if "logprobs" not in k and k != "n"}
            body["max_tokens"] = 150
            last = None
            url = f"{srv.url}/v1/chat/completions"  # httpx's 5 s read timeout: not the subject
            with httpx.stream("POST", url, json=body, timeout=30) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        now = time.monotonic()
                        if last is not None:
                            gaps.append(now - last)
                        last = now
                        if line != "data: [DONE]":
                            choice = json.loads(line[6:])["choices"][0]
                            if choice["finish_reason"]:
                                finish.append(choice["finish_reason"])

        reader = threading.Thread(target=other)
        time.sleep(1.0)
        reader.start()
        reader.join(120)
        # the other stream ran to its end while the stalled client read nothing
        assert not reader.is_alive() and len(gaps) >= 2 and finish == ["length"]
        time.sleep(_WRITE_TIMEOUT * 3)  # the stalled stream is past its deadline by now
        raw = _read_all(stalled, timeout_s=30)
        stalled.close()
        events = [
            line.removeprefix(b"data: ") for line in raw.split(b"\n") if line.startswith(b"data: ")
        ]
        assert events and events[-1] == b"[DONE]", (len(raw), raw[:300], raw[-300:])
        assert b"error" in events[-2], (len(raw), len(events), events[-2][:500])
        error = json.loads(events[-2])["error"]
        assert "did not read" in error["message"], error
        tokens = sum(
            len(json.loads(e)["choices"][0]["logprobs"]["content"])
            for e in events[:-2]
            if json.loads(e).get("choices") and json.loads(e)["choices"][0].get("logprobs")
        )
        assert tokens < 12 * 230  # cut before its end
        metrics = httpx.get(f"{srv.url}/metrics").text
        assert 'torchtrt_requests_total{status="slow_client"} 1.0' in metrics
        # the HTTP process's writes, shown once after rank 0's metrics: every event of the
        # other stream but its [DONE], and the stalled one's that were written
        assert metrics.count("# TYPE torchtrt_token_to_write_seconds histogram") == 1
        found = re.search(r"^torchtrt_token_to_write_seconds_count (\S+)$", metrics, re.M)
        assert found is not None and float(found.group(1)) >= len(gaps)
    finally:
        assert srv.stop() == 0
