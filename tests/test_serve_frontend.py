"""Rank 0's HTTP server in a process of its own (``serving/frontend.py``): the messages of
both ends in this process, then real servers: the split's tokens equal the HTTP thread's, and
a rank 0 that is killed leaves its open requests a 503 and no HTTP process behind."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from multiprocessing import Pipe
from pathlib import Path

import httpx
import pytest

from torch_tensorrt_dist.errors import ConfigError
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
from torch_tensorrt_dist.serving.frontend import (
    GONE,
    Channel,
    ChildInbox,
    ForwardingInbox,
    RemoteSink,
    SinkRef,
    http_mode,
)
from torch_tensorrt_dist.serving.metrics import ThreadCPUMetric
from torch_tensorrt_dist.serving.protocol import RequestError

from ._serve import start_server


def _sub(sink: object) -> Submission:
    return Submission((1, 2, 3), 4, SamplingConfig(), None, (), sink)  # type: ignore[arg-type]


def test_the_child_bounds_the_queue_routes_pieces_and_fails_what_is_open() -> None:
    async def body() -> None:
        ours, theirs = Pipe()
        child, state = ChildInbox(theirs, max_waiting=3), ServerState()
        sink = Sink(asyncio.get_running_loop())
        a, b = _sub(sink), _sub(sink)
        child.submit(a, b)  # one HTTP request of two prompts: one sink
        kind, sent = ours.recv()
        assert kind == "submit" and [s.rid for s in sent] == [a.rid, b.rid]
        sid = sent[0].sink.sid
        assert all(s.sink == SinkRef(sid) for s in sent)
        with pytest.raises(QueueFull, match="--max-queue 3"):
            child.submit(_sub(Sink(asyncio.get_running_loop())), _sub(sink))
        assert child.received(("left", 1), state) and child.waiting == 1  # rank 0 admitted one
        other = _sub(Sink(asyncio.get_running_loop()))
        child.submit(other)
        assert ours.recv()[0] == "submit"
        assert child.received(("pieces", [(sid, Piece("x", 1)), (sid, Piece("y", 1))]), state)
        assert sink.queue.get_nowait().text == "xy" and sink.queue.empty()  # waited: merged
        child.received(("state", "draining", "", [7]), state)
        assert (state.state, state.pids) == ("draining", [7])
        child.finished(a.rid)
        assert ours.recv() == ("finished", a.rid)
        child.received(("pieces", [(sid, Piece("z", 1))]), state)
        assert sink.queue.get_nowait().text == "z"  # b is still open
        child.finished(b.rid)
        ours.recv()
        child.received(("pieces", [(sid, Piece("late", 1))]), state)
        assert sink.queue.empty()  # answered: nothing more reaches it
        scrape = asyncio.ensure_future(child.scrape(0))
        await asyncio.sleep(0)
        assert ours.recv()[:1] == ("scrape",)
        assert child.received(("stop",), state) is False  # what rank 0 never answered: 503
        failed = other.sink.queue.get_nowait()
        assert isinstance(failed, Failed) and failed.status == 503
        with pytest.raises(RequestError):
            await scrape

    asyncio.run(body())


def test_with_rank_0_gone_the_child_answers_503_and_raises_nothing() -> None:
    async def body() -> None:
        ours, theirs = Pipe()
        child = ChildInbox(theirs, max_waiting=4)
        ours.close()
        sub = _sub(Sink(asyncio.get_running_loop()))
        child.submit(sub)
        failed = sub.sink.queue.get_nowait()
        assert isinstance(failed, Failed) and (failed.status, failed.message) == (503, GONE)
        child.requests.labels("200").inc()  # counts and answers are dropped, not raised
        child.finished(sub.rid)
        child.cancel(sub.rid)
        with pytest.raises(RequestError) as err:
            await child.scrape(0)
        assert err.value.status == 503

    asyncio.run(body())


def test_rank_0_sends_a_steps_pieces_in_one_message_and_tells_admissions() -> None:
    ours, theirs = Pipe()
    channel = Channel(ours)
    inbox = ForwardingInbox(channel)
    one, two = RemoteSink(1, channel), RemoteSink(2, channel)
    deliver([(one, Piece("a", 1)), (two, Piece("b", 1, "stop"))])  # type: ignore[list-item]
    assert theirs.recv() == ("pieces", [(1, Piece("a", 1)), (2, Piece("b", 1, "stop"))])
    assert not theirs.poll()
    inbox.submit(_sub(one), _sub(two))
    inbox.left(2)
    assert theirs.recv() == ("left", 2) and inbox.waiting == 0
    assert inbox.fail_live(503, "a rank failed") == 2
    failed = Failed(503, "a rank failed")
    assert theirs.recv() == ("pieces", [(1, failed), (2, failed)])
    theirs.close()
    deliver([(one, Piece("c", 1))])  # type: ignore[list-item]  # the child has gone: dropped
    channel.close()


def test_http_mode_and_state_listeners() -> None:
    assert http_mode({}) == ("process" if hasattr(os, "fork") else "thread")
    assert http_mode({"TORCH_TENSORRT_DIST_HTTP": "Thread"}) == "thread"
    with pytest.raises(ConfigError, match="use process or thread"):
        http_mode({"TORCH_TENSORRT_DIST_HTTP": "fork"})
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


def test_the_http_process_gives_the_http_threads_tokens() -> None:
    texts, lines = [], []
    for mode in ("process", "thread"):
        srv = start_server(_ARGS, env={"TORCH_TENSORRT_DIST_HTTP": mode})
        try:
            if mode == "process":  # a Ctrl-C reaches the whole group: the child leaves it to
                [child] = _children(srv.health()["pids"][0])  # rank 0, which drains
                for sig in (signal.SIGINT, signal.SIGTERM):
                    os.kill(child, sig)
                time.sleep(0.5)
            r = httpx.post(f"{srv.url}/v1/completions", json=_BODY, timeout=60)
            assert r.status_code == 200, r.text
            texts.append(r.json()["choices"][0]["text"])
            lines.append(next(line for line in srv.lines if line.startswith("serving ")))
        finally:
            assert srv.stop() == 0
    assert texts[0] == texts[1] and texts[0]
    assert "own process" in lines[0] and ", thread, " in lines[1]


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children = (task / "children").read_text().split()
        out += [int(c) for c in children]
    return out


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc")
def test_a_killed_rank_0_leaves_its_streams_a_503_and_no_http_process() -> None:
    srv = start_server(_ARGS)
    try:
        rank0 = srv.health()["pids"][0]
        [child] = _children(rank0)
        body = {**_BODY, "max_tokens": 200, "stream": True}
        events = []
        with httpx.stream("POST", f"{srv.url}/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(line[6:])
                if len(events) == 1:
                    os.kill(rank0, signal.SIGKILL)
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["message"] == GONE, error
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
    srv = start_server(_ARGS)
    try:
        [child] = _children(srv.health()["pids"][0])
        os.kill(child, signal.SIGKILL)
        assert srv.proc.wait(30) == 1
        assert f"the HTTP process (pid {child}) ended" in srv.output()
    finally:
        srv.kill()
