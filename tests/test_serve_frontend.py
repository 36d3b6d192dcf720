"""Rank 0's HTTP server in a process of its own (``serving/frontend.py``): the messages of
both ends in this process (whole at any size, a corrupt pipe failing the server loudly), then
real servers: a request of 300 KB leaves the server healthy and its answers unchanged, the
child ignores Ctrl-C, a rank 0 that is killed leaves its open requests a 503 and no HTTP
process behind."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import socket
import time
from collections.abc import Iterator
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from torch_tensorrt_dist.generation.sampling import SamplingConfig
from torch_tensorrt_dist.serving.bridge import (
    Failed,
    Piece,
    QueueFull,
    ServerState,
    Sink,
    Submission,
    deliver,
)
from torch_tensorrt_dist.serving.frames import FrameBuffer, read_frame, write_frame
from torch_tensorrt_dist.serving.frontend import (
    GONE,
    Channel,
    ChildInbox,
    ForwardingInbox,
    RemoteSink,
    SinkRef,
)
from torch_tensorrt_dist.serving.metrics import ThreadCPUMetric
from torch_tensorrt_dist.serving.protocol import RequestError

from ._serve import Server, start_server


def _sub(sink: object) -> Submission:
    return Submission((1, 2, 3), 4, SamplingConfig(), None, (), sink)  # type: ignore[arg-type]


def _pair() -> tuple[socket.socket, socket.socket]:
    """Rank 0's end and the child's (non-blocking, as the child's event loop reads it)."""
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    return ours, theirs


def _recv(sock: socket.socket) -> Any:
    """The next message on rank 0's end (waits at most 10 s)."""
    assert _poll(sock, 10.0), "no message within 10 s"
    return ForkingPickler.loads(read_frame(sock.fileno()))


def _poll(sock: socket.socket, timeout: float = 0.2) -> bool:
    return bool(select.select([sock], [], [], timeout)[0])


def test_the_child_bounds_the_queue_routes_pieces_and_fails_what_is_open() -> None:
    async def body() -> None:
        ours, theirs = _pair()
        child, state = ChildInbox(Channel(theirs), max_waiting=3), ServerState()
        sink = Sink(asyncio.get_running_loop())
        a, b = _sub(sink), _sub(sink)
        child.submit(a, b)  # one HTTP request of two prompts: one sink
        kind, sent = _recv(ours)
        assert kind == "submit" and [s.rid for s in sent] == [a.rid, b.rid]
        sid = sent[0].sink.sid
        assert all(s.sink == SinkRef(sid) for s in sent)
        with pytest.raises(QueueFull, match="--max-queue 3"):
            child.submit(_sub(Sink(asyncio.get_running_loop())), _sub(sink))
        assert child.received(("left", 1), state) and child.waiting == 1  # rank 0 admitted one
        other = _sub(Sink(asyncio.get_running_loop()))
        child.submit(other)
        assert _recv(ours)[0] == "submit"
        assert child.received(("pieces", [(sid, Piece("x", 1)), (sid, Piece("y", 1))]), state)
        assert sink.queue.get_nowait().text == "xy" and sink.queue.empty()  # waited: merged
        child.received(("state", "draining", "", [7]), state)
        assert (state.state, state.pids) == ("draining", [7])
        assert _recv(ours) == ("seen", "draining")  # told back: rank 0 waits for it
        child.finished(a.rid)
        assert _recv(ours) == ("finished", a.rid)
        child.received(("pieces", [(sid, Piece("z", 1))]), state)
        assert sink.queue.get_nowait().text == "z"  # b is still open
        child.finished(b.rid)
        _recv(ours)
        child.received(("pieces", [(sid, Piece("late", 1))]), state)
        assert sink.queue.empty()  # answered: nothing more reaches it
        scrape = asyncio.ensure_future(child.scrape(0))
        await asyncio.sleep(0)
        assert _recv(ours)[:1] == ("scrape",)
        assert child.received(("stop",), state) is False  # what rank 0 never answered: 503
        failed = other.sink.queue.get_nowait()
        assert isinstance(failed, Failed) and failed.status == 503
        with pytest.raises(RequestError):
            await scrape

    asyncio.run(body())


def test_with_rank_0_gone_the_child_answers_503_and_raises_nothing() -> None:
    async def body() -> None:
        ours, theirs = _pair()
        child, state = ChildInbox(Channel(theirs), max_waiting=4), ServerState()
        early = _sub(Sink(asyncio.get_running_loop()))
        child.submit(early)  # open when rank 0 goes
        ours.close()
        assert child.pump(theirs.fileno(), FrameBuffer(), state) == "gone"
        assert (state.state, state.reason) == ("failed", "the step loop ended")
        sub = _sub(Sink(asyncio.get_running_loop()))
        child.submit(sub)  # after: answered at once, its place in the wait queue given back
        assert child.waiting == early.n
        for s in (early, sub):
            failed = s.sink.queue.get_nowait()
            assert isinstance(failed, Failed) and (failed.status, failed.message) == (503, GONE)
        child.requests.labels("200").inc()  # counts and answers are dropped, not raised
        child.finished(sub.rid)
        child.cancel(sub.rid)
        with pytest.raises(RequestError) as err:
            await child.scrape(0)
        assert err.value.status == 503

    asyncio.run(body())


def test_rank_0_sends_a_steps_pieces_in_one_message_and_tells_admissions() -> None:
    ours, theirs = socket.socketpair()
    channel = Channel(ours)
    inbox = ForwardingInbox(channel)
    one, two = RemoteSink(1, channel), RemoteSink(2, channel)
    deliver([(one, Piece("a", 1)), (two, Piece("b", 1, "stop"))])  # type: ignore[list-item]
    assert _recv(theirs) == ("pieces", [(1, Piece("a", 1)), (2, Piece("b", 1, "stop"))])
    assert not _poll(theirs)
    inbox.submit(_sub(one), _sub(two))
    inbox.left(2)
    assert _recv(theirs) == ("left", 2) and inbox.waiting == 0
    assert inbox.fail_live(503, "a rank failed") == 2
    failed = Failed(503, "a rank failed")
    assert _recv(theirs) == ("pieces", [(1, failed), (2, failed)])
    theirs.close()
    deliver([(one, Piece("c", 1))])  # type: ignore[list-item]  # the child has gone: dropped
    channel.close()


_SIZES = [1 << 10, 64 << 10, 300 << 10, 1 << 20, 8 << 20, 64 << 20]


def _blob(size: int, tag: int) -> bytes:
    return (bytes([tag]) + bytes(range(256))) * (size // 257) + bytes([tag]) * (size % 257)


def test_messages_of_1_kb_to_64_mb_arrive_whole_both_ways_at_once() -> None:
    """Rank 0's writer and the child's, each end full at once; the child's end non-blocking
    (its writes resumed, its reads framed), rank 0's read by whole frames."""
    ours, theirs = _pair()
    to_child, to_rank0 = Channel(ours), Channel(theirs)
    for i, size in enumerate(_SIZES):
        to_child.send(("pieces", _blob(size, i)))
        to_rank0.send(("submit", _blob(size, 100 + i)))
    got_child: list[Any] = []
    got_rank0: list[Any] = []
    frames = FrameBuffer()
    fd = theirs.fileno()
    deadline = time.monotonic() + 60
    while (len(got_child) < len(_SIZES) or len(got_rank0) < len(_SIZES)) and (
        time.monotonic() < deadline
    ):
        readable = select.select([ours, theirs], [], [], 1.0)[0]
        if theirs in readable:  # the child's event loop: what is whole now
            try:
                while data := os.read(fd, 1 << 20):
                    got_child += [ForkingPickler.loads(f) for f in frames.feed(data)]
            except BlockingIOError:
                pass
        if ours in readable:  # rank 0's reader thread: a whole frame, blocking
            got_rank0.append(ForkingPickler.loads(read_frame(ours.fileno())))
    assert [m[1] for m in got_child] == [_blob(n, i) for i, n in enumerate(_SIZES)]
    assert [m[1] for m in got_rank0] == [_blob(n, 100 + i) for i, n in enumerate(_SIZES)]
    assert frames.pending == 0 and not to_child.closed and not to_rank0.closed
    to_child.close()
    to_rank0.close()


def test_a_frame_that_does_not_decode_fails_the_child_loudly() -> None:
    async def body() -> None:
        ours, theirs = _pair()
        child, state = ChildInbox(Channel(theirs), max_waiting=4), ServerState()
        state.state = "ready"
        sub = _sub(Sink(asyncio.get_running_loop()))
        child.submit(sub)
        assert _recv(ours)[0] == "submit"
        write_frame(ours.fileno(), b"\xff\xfe not a pickle")
        assert _poll(theirs, 5.0)
        assert child.pump(theirs.fileno(), FrameBuffer(), state) == "failed"
        assert state.state == "failed" and "cannot read rank 0's pipe" in state.reason
        failed = sub.sink.queue.get_nowait()
        assert isinstance(failed, Failed) and failed.status == 503
        assert "cannot read rank 0's pipe" in failed.message
        kind, reason = _recv(ours)  # rank 0 is told (and ends the server naming it)
        assert kind == "failed" and reason == state.reason

    asyncio.run(body())


def test_a_frame_that_does_not_decode_fails_rank_0_loudly() -> None:
    from torch_tensorrt_dist.serving.http import bind_socket
    from torch_tensorrt_dist.serving.http_process import HttpProcess
    from torch_tensorrt_dist.serving.metrics import Metrics

    lost: list[str] = []
    http = HttpProcess(
        lambda inbox, st: None,
        bind_socket("127.0.0.1", 0),
        ServerState(),
        Metrics(),
        max_waiting=4,
        on_lost=lost.append,
    )
    child_end = http._theirs
    write_frame(child_end.fileno(), b"\x80\x04 torn")  # half a pickle
    http._read()  # returns: the reader cannot go on
    assert len(lost) == 1 and "cannot read the HTTP process's pipe" in lost[0], lost
    write_frame(child_end.fileno(), ForkingPickler.dumps(("failed", "why")))
    http._read()
    assert lost[1] == "the HTTP process failed: why"
    child_end.close()
    http._read()
    assert lost[2] == "the HTTP process (pid 0) ended"
    http.inbox.channel.close()
    http.sock.close()


def test_frames_cut_or_out_of_step_raise() -> None:
    from torch_tensorrt_dist.serving.frames import HEADER, MAX_FRAME, FrameError

    a, b = socket.socketpair()
    a.sendall(HEADER.pack(10) + b"12345")
    a.close()
    with pytest.raises(FrameError, match="5 bytes before the frame's end"):
        read_frame(b.fileno())
    with pytest.raises(FrameError, match="corrupt stream"):
        list(FrameBuffer().feed(HEADER.pack(MAX_FRAME + 1)))
    frames = FrameBuffer()
    whole = HEADER.pack(3) + b"abc"
    assert [list(frames.feed(bytes([c]))) for c in whole][-1] == [b"abc"]


def test_rank_0_says_ready_once_the_http_process_has_applied_it() -> None:
    """The "serving ... at URL" line waits for the child's word that it left "warming" (a
    client that starts on that line met 503 "warming up" while the state was on its way)."""
    import threading

    from torch_tensorrt_dist.serving.http_process import HttpProcess
    from torch_tensorrt_dist.serving.metrics import Metrics

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    never_called = cast(Any, None)  # the app: nothing is forked here
    http = HttpProcess(never_called, sock, ServerState(), Metrics(), max_waiting=4)
    try:
        http._handle(("seen", "warming"))  # the child's answer to the first state
        assert not http.told(0.05)
        later = threading.Timer(0.2, http._handle, args=(("seen", "ready"),))
        later.start()
        start = time.monotonic()
        assert http.told(10.0) and time.monotonic() - start >= 0.15
        later.join()
    finally:
        http.inbox.channel.close()
        http.inbox.channel.conn.close()
        sock.close()


def test_state_listeners() -> None:
    state, seen = ServerState(), []
    state.listeners.append(lambda s: seen.append(s.state))
    state.set("ready")
    state.set("ready")  # ready only from warming: not a change, not reported
    state.set("failed", "x")
    state.set("draining")  # failed is final: not reported
    assert seen == ["ready", "failed"]


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc")
def test_a_thread_of_another_process_is_reported() -> None:
    metric = ThreadCPUMetric("t")
    metric.track("other", os.getpid(), pid=os.getpid())
    [family] = metric.collect()
    [sample] = family.samples
    assert sample.labels == {"thread": "other"} and sample.value > 0


_ARGS = ["--tp", "1", "--engine", "none", "--max-seq-len", "256", "--max-batch-size", "2"]
_BODY = {"model": "demo", "prompt": "The for statement", "max_tokens": 24, "temperature": 0}


@pytest.fixture(scope="module")
def srv() -> Iterator[Server]:
    server = start_server(_ARGS)
    yield server
    assert server.stop() == 0


def _complete(srv: Server, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{srv.url}/v1/completions", json=body, timeout=120)


def test_a_request_of_300_kb_leaves_the_server_healthy_and_its_answers_unchanged(
    srv: Server,
) -> None:
    """30,000 choices (about 300 KB pickled, over the socket's buffer): a choice or a clean
    4xx; then ``/health`` is ready and a plain request gives the text it gave before."""
    before = _complete(srv, _BODY)
    assert before.status_code == 200, before.text
    choices = [f"choice {i:05d}" for i in range(30_000)]
    big = {**_BODY, "max_tokens": 8, "guided_choice": choices}
    r = _complete(srv, big)
    assert r.status_code == 200 or 400 <= r.status_code < 500, r.text
    if r.status_code == 200:  # a choice, or the start of one where max_tokens cut it
        choice = r.json()["choices"][0]
        assert any(c.startswith(choice["text"]) for c in choices) and choice["text"], r.text
        assert choice["finish_reason"] == "length" or choice["text"] in choices, r.text
    else:
        assert r.json()["error"]["message"], r.text
    assert srv.health()["status"] == "ready"
    after = _complete(srv, _BODY)
    assert after.status_code == 200, after.text
    assert after.json()["choices"][0]["text"] == before.json()["choices"][0]["text"]


def test_the_http_process_ignores_ctrl_c_and_goes_on_serving(srv: Server) -> None:
    """A Ctrl-C reaches the whole group: the child leaves it to rank 0, which drains."""
    before = _complete(srv, _BODY)
    [child] = _children(srv.health()["pids"][0])
    for sig in (signal.SIGINT, signal.SIGTERM):
        os.kill(child, sig)
    time.sleep(0.5)
    r = _complete(srv, _BODY)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == before.json()["choices"][0]["text"]
    ready = next(line for line in srv.lines if line.startswith("serving "))
    assert "own process" in ready


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children = (task / "children").read_text().split()
        out += [int(c) for c in children]
    return out


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc")
def test_a_killed_rank_0_leaves_its_streams_a_503_and_no_http_process() -> None:
    """A stream whose headers have gone when rank 0 dies ends with the 503 error event, then
    ``[DONE]``, never a finish; the HTTP process ends. Rank 0 is stopped (SIGSTOP) before the
    request, so the stream is open when it is killed whatever the machine's load (a stream
    killed after its first token could end first: its 200 tokens take a second)."""
    srv = start_server(_ARGS)
    try:
        rank0 = srv.health()["pids"][0]
        [child] = _children(rank0)
        body = {**_BODY, "max_tokens": 200, "stream": True}
        os.kill(rank0, signal.SIGSTOP)  # the child forwards the request; rank 0 cannot answer
        with httpx.stream("POST", f"{srv.url}/v1/completions", json=body, timeout=60) as r:
            assert r.status_code == 200  # the stream's headers have come: it is open
            os.kill(rank0, signal.SIGKILL)
            events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]", events
        chunks = [json.loads(e) for e in events[:-1]]
        errors = [c["error"] for c in chunks if "error" in c]
        assert len(errors) == 1, chunks
        assert errors[0]["message"] == GONE, errors
        assert "error" in chunks[-1], chunks  # the last event before [DONE]
        finished = [c for c in chunks for ch in c.get("choices", ()) if ch.get("finish_reason")]
        assert not finished, finished  # the stream was cut, not ended
        deadline = time.monotonic() + 20
        while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
            if Path(f"/proc/{child}/stat").read_text().split(") ")[1][0] == "Z":
                break  # ended; its parent (killed) has not reaped it
            time.sleep(0.05)
        stat = Path(f"/proc/{child}/stat")
        assert not stat.exists() or stat.read_text().split(") ")[1][0] == "Z"
    finally:
        srv.kill()


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc")
def test_a_killed_http_process_ends_the_server_naming_it() -> None:
    """The limit: a stream's connection belongs to the HTTP process, so its SIGKILL closes it
    bare (nothing can send an error event): the client sees a body cut before its end (an
    incomplete chunked read), never a clean end; rank 0 exits 1 naming the process."""
    srv = start_server(_ARGS)
    try:
        [child] = _children(srv.health()["pids"][0])
        body = {**_BODY, "max_tokens": 250, "stream": True}
        events = []
        url = f"{srv.url}/v1/completions"
        with (
            pytest.raises(httpx.RemoteProtocolError, match="incomplete chunked read"),
            httpx.stream("POST", url, json=body, timeout=60) as r,
        ):
            os.kill(child, signal.SIGKILL)  # its head has come; its 250 tokens take longer
            events += [line for line in r.iter_lines() if line.startswith("data: ")]
        assert "data: [DONE]" not in events
        assert srv.proc.wait(30) == 1
        assert f"the HTTP process (pid {child}) ended" in srv.output()
    finally:
        srv.kill()
