"""Rank 0's scheduler running the core in one process, with no server: joins into free rows,
cancels, refusals, the drain, deferred text, a failed step (request checks, the control payload
and chat templates: tests/test_serve_requests.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from torch_tensorrt_dist.generation import Generator, SamplingConfig
from torch_tensorrt_dist.generation.core import Request
from torch_tensorrt_dist.generation.detok import Detokenizer
from torch_tensorrt_dist.generation.plan import StepPlan
from torch_tensorrt_dist.models.llama_args import ModelArgs
from torch_tensorrt_dist.models.tokenizer import ByteTokenizer
from torch_tensorrt_dist.parallel.llama_load import random_llama

pytest.importorskip("fastapi")

from torch_tensorrt_dist.serving import control
from torch_tensorrt_dist.serving.bridge import (
    Failed,
    Inbox,
    Piece,
    ServerState,
    Sink,
    Submission,
    deliver,
)
from torch_tensorrt_dist.serving.loop import Leader, StepLoop


class _Sink:
    def __init__(self) -> None:
        self.items: list[Piece | Failed] = []

    def put(self, item: Piece | Failed) -> None:
        self.items.append(item)


@pytest.fixture(scope="module")
def gen() -> Generator:
    torch.manual_seed(0)
    model = random_llama(ModelArgs.from_name("tiny"), seed=0)
    return Generator(model, max_batch_size=2, cache_len=48)


def _leader(gen: Generator, drain_when_idle: bool = True) -> tuple[Leader, Inbox, ServerState]:
    inbox, state = Inbox(8), ServerState()
    state.set("ready")

    def on_step(leader: Leader) -> None:
        if drain_when_idle and leader.scheduler.idle() and not inbox.waiting:
            state.set("draining")

    core = gen.core(tokenizer=ByteTokenizer(256), text=True)
    loop = StepLoop(core, control.ControlChannel(None))
    leader = Leader(
        loop,
        gen.scheduler(core),
        inbox,
        state,
        stop_ids=(),
        idle_tick_s=0.01,
        on_step=on_step,
    )
    return leader, inbox, state


def test_leader_runs_more_requests_than_rows_and_each_gets_its_alone_text(gen: Generator) -> None:
    leader, inbox, _ = _leader(gen)
    prompts = [(72, 105), (1, 2, 3, 4, 5), (9,), (100, 101, 102), (65,)]
    sinks = [_Sink() for _ in prompts]
    subs = [
        Submission(p, 6 + i, SamplingConfig(), None, (), s)  # type: ignore[arg-type]
        for i, (p, s) in enumerate(zip(prompts, sinks))
    ]
    for sub in subs:
        inbox.submit(sub)
    inbox.cancel(subs[4].rid)  # its client left while it waited: it never runs
    leader.run()
    tok = ByteTokenizer(256)
    for i, (p, sink) in enumerate(zip(prompts[:4], sinks)):
        ref = gen.generate([list(p)], max_new_tokens=6 + i).tokens[0]
        assert "".join(x.text for x in sink.items if isinstance(x, Piece)) == tok.decode(ref)
        assert sum(x.tokens for x in sink.items if isinstance(x, Piece)) == len(ref)
        assert sink.items[-1].finish == "length"  # type: ignore[union-attr]
    assert sinks[4].items == [] and inbox.waiting == 0
    assert not leader.core.sequences and leader.core.pool.stats().used == 0


def test_the_prompts_of_one_request_share_a_group_and_the_queue_counts_sequences(
    gen: Generator,
) -> None:
    """Two prompts x n = 2 (one HTTP request: one sink) and a plain request: the queue holds
    5 sequences, the first request's 4 share one group, the 2 rows go one to each request, and
    each sequence that joins leaves the queue."""
    leader, inbox, _ = _leader(gen, drain_when_idle=False)
    sink, plain_sink = _Sink(), _Sink()
    pair = [
        Submission(p, 4, SamplingConfig(), None, (), sink, n=2)  # type: ignore[arg-type]
        for p in ((1, 2), (3, 4))
    ]
    plain = Submission((5,), 4, SamplingConfig(), None, (), plain_sink)  # type: ignore[arg-type]
    inbox.submit(*pair)
    inbox.submit(plain)
    assert inbox.waiting == 5
    plan = leader._plan()  # takes the three submissions; 2 rows: one sequence of each request
    group = {r.rid: r.group for r in [*plan.joins, *leader.scheduler.waiting]}
    assert {group[rid] for sub in pair for rid in sub.rids} == {pair[0].rid}
    assert group[plain.rid] == plain.rid
    assert [r.rid for r in plan.joins] == [pair[0].rid, plain.rid]  # round robin
    assert inbox.waiting == 3


def test_a_step_is_published_between_the_next_steps_inputs_and_its_graph(
    gen: Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The text of step k reaches HTTP once step k + 1's inputs are built and before its graph
    runs (``GenerationCore.before_graph``): the HTTP thread writes while the kernels run."""
    from torch_tensorrt_dist.generation import core as core_module

    leader, inbox, _ = _leader(gen)
    sink = _Sink()
    inbox.submit(Submission((72, 105), 5, SamplingConfig(), None, (), sink))  # type: ignore[arg-type]
    out = lambda: sum(x.tokens for x in sink.items if isinstance(x, Piece))  # noqa: E731
    built: list[int] = []
    called: list[int] = []
    inputs, step = core_module.step_inputs, leader.core._step

    def spy_inputs(*a: Any, **k: Any) -> Any:
        built.append(out())
        return inputs(*a, **k)

    def spy_step(*a: Any) -> Any:
        called.append(out())
        return step(*a)

    monkeypatch.setattr(core_module, "step_inputs", spy_inputs)
    leader.core._step = spy_step
    leader.run()
    # the prefill, then four decode steps: each graph call after the step before was published
    assert called == [0, 1, 2, 3, 4] and built == [0, 0, 1, 2, 3]
    assert out() == 5 and sink.items[-1].finish == "length"  # type: ignore[union-attr]


def test_leader_drain_refuses_waiting_and_a_join_that_does_not_fit(gen: Generator) -> None:
    leader, inbox, state = _leader(gen, drain_when_idle=False)
    sinks = [_Sink() for _ in range(4)]
    too_long = Submission(tuple(range(40)), 20, SamplingConfig(), None, (), sinks[0])  # type: ignore[arg-type]
    inbox.submit(too_long)  # slipped past the HTTP check: the scheduler refuses it
    for s in sinks[1:]:
        inbox.submit(Submission((5,), 30, SamplingConfig(), None, (), s))  # type: ignore[arg-type]
    steps = {"n": 0}

    def on_step(_: Leader) -> None:
        steps["n"] += 1
        if steps["n"] == 2:
            state.set("draining")  # two running, one waiting

    leader.on_step = on_step
    leader.run()
    assert isinstance(sinks[0].items[0], Failed) and sinks[0].items[0].status == 400
    assert "exceeds the longest sequence served, 48 tokens" in sinks[0].items[0].message
    finished = [s for s in sinks[1:] if isinstance(s.items[-1], Piece)]
    refused = [s for s in sinks[1:] if isinstance(s.items[-1], Failed)]
    # the refused request took no row: two ran to the end, one waited
    assert finished == sinks[1:3] and refused == [sinks[3]]
    assert refused[0].items[-1].status == 503  # type: ignore[union-attr]
    assert all(sum(x.tokens for x in s.items) == 30 for s in finished)  # type: ignore[union-attr]


def test_deferred_text_is_rendered_later_and_equals_the_immediate_text(gen: Generator) -> None:
    """Rank 0 leaves the text of rows without stop strings for after the next header; rows
    with stop strings decode theirs at once (it decides their finish on every rank)."""
    tok = ByteTokenizer(256)
    texts: dict[bool, list[list[str]]] = {}
    for defer in (False, True):
        core = gen.core(tokenizer=tok, text=True)
        core.defer_text = defer
        sched = gen.scheduler(core)
        sched.add(Request(0, (72, 105, 33), 8))
        sched.add(Request(1, (72, 105, 33), 8, stop=("\x00\x00\x00",)))  # never hit
        pieces = []
        while not sched.idle():
            pieces += core.step(sched.plan())
        unrendered = [e.text for e in pieces if e.rid == 0]
        core.render()
        if defer:
            assert set(unrendered) == {""}  # nothing decoded for the plain row yet
        texts[defer] = [[e.text for e in pieces if e.rid == rid] for rid in (0, 1)]
    assert texts[True] == texts[False]
    ref = gen.generate([[72, 105, 33]], max_new_tokens=8).tokens[0]
    assert "".join(texts[True][0]) == "".join(texts[True][1]) == tok.decode(ref)


def test_deliver_wakes_each_event_loop_once_per_batch() -> None:
    class Loop:
        def __init__(self) -> None:
            self.calls: list[Any] = []

        def call_soon_threadsafe(self, fn: Any, *args: Any) -> None:
            self.calls.append((fn, args))

    loops = [Loop(), Loop()]
    sinks = [Sink(loops[0]), Sink(loops[0]), Sink(loops[1])]  # type: ignore[arg-type]
    deliver(
        [
            (sinks[0], Piece("a", 1)),
            (sinks[1], Piece("b", 1)),
            (sinks[2], Failed(503, "x")),
            (sinks[0], Piece("c", 1, "length")),
        ]
    )
    assert [len(loop.calls) for loop in loops] == [1, 1]
    for loop in loops:
        fn, args = loop.calls[0]
        fn(*args)
    got = [[q.get_nowait() for _ in range(q.qsize())] for q in (s.queue for s in sinks)]
    # nobody read sinks[0] between its two pieces: they wait as one
    assert got == [[Piece("ac", 2, "length")], [Piece("b", 1)], [Failed(503, "x")]]


def _texts(sink: _Sink) -> tuple[str, int]:
    pieces = [x for x in sink.items if isinstance(x, Piece)]
    return "".join(p.text for p in pieces), sum(p.tokens for p in pieces)


def _shown(ids: list[int]) -> str:
    """The text a stream shows for ``ids`` while it runs (an incomplete character waits)."""
    detok = Detokenizer(ByteTokenizer(256))
    return "".join(detok.push(i) for i in ids)


@pytest.mark.parametrize("publish_fails", [False, True])
def test_a_failed_step_still_answers_what_the_last_step_finished(
    gen: Generator, monkeypatch: pytest.MonkeyPatch, publish_fails: bool
) -> None:
    """The step after a decode fails (a rank died): that decode's text is valid and is sent
    first (a request it finished gets its whole answer, not a 503), then the 503s. Where
    sending that text fails too, every request it holds gets the 503."""
    leader, inbox, _ = _leader(gen, drain_when_idle=False)
    sinks = [_Sink() for _ in range(3)]
    for (prompt, max_new), sink in zip([((72, 105), 2), ((1, 2, 3), 10), ((9,), 5)], sinks):
        inbox.submit(Submission(prompt, max_new, SamplingConfig(), None, (), sink))  # type: ignore[arg-type]
    exchange, calls = leader.loop.channel.exchange, []

    def failing(plan: StepPlan | None = None) -> StepPlan:
        calls.append(1)
        if len(calls) == 3:  # step 2's decode gave the first request its second, last token
            raise RuntimeError("a peer closed the connection")
        return exchange(plan)

    monkeypatch.setattr(leader.loop.channel, "exchange", failing)
    with pytest.raises(RuntimeError, match="a peer closed"):
        leader.run()
    if publish_fails:

        def on_token(*_: Any) -> None:
            raise RuntimeError("metrics broke")

        leader.on_token = on_token
    leader.fail_all(503, "a rank of the server failed")
    assert leader._last_token == {} and inbox.waiting == 0
    assert sinks[2].items == [Failed(503, "a rank of the server failed")]  # it waited
    if publish_fails:
        assert [s.items[-1] for s in sinks[:2]] == [Failed(503, "a rank of the server failed")] * 2
        assert [_texts(s)[1] for s in sinks[:2]] == [1, 1]  # step 1's, published at step 2
        return
    tok = ByteTokenizer(256)
    ref = gen.generate([[72, 105]], max_new_tokens=2).tokens[0]
    assert _texts(sinks[0]) == (tok.decode(ref), 2) and sinks[0].items[-1].finish == "length"  # type: ignore[union-attr]
    ref = gen.generate([[1, 2, 3]], max_new_tokens=10).tokens[0]
    assert _texts(sinks[1]) == (_shown(ref[:2]), 2)  # its pieces, then the failure
    assert sinks[1].items[-1] == Failed(503, "a rank of the server failed")


def test_publishing_that_fails_inside_the_next_step_loses_no_text(gen: Generator) -> None:
    """Step k's text is published from step k + 1, its inputs built (``before_graph``): where
    that raises, the step loop fails there, and ``fail_all`` still sends step k's text (kept
    until it was handed over), then the 503, to every request."""
    leader, inbox, _ = _leader(gen, drain_when_idle=False)
    sinks = [_Sink(), _Sink()]
    for sink in sinks:
        inbox.submit(Submission((1, 2, 3), 10, SamplingConfig(), None, (), sink))  # type: ignore[arg-type]
    calls, graphs, step = [], [], leader.core._step

    def on_token(*_: Any) -> None:
        calls.append(1)
        if len(calls) == 3:  # step 2's first piece, published from step 3
            raise RuntimeError("metrics broke")

    def counted(*a: Any) -> Any:
        graphs.append(1)
        return step(*a)

    leader.on_token, leader.core._step = on_token, counted
    with pytest.raises(RuntimeError, match="metrics broke"):
        leader.run()
    assert len(graphs) == 2  # step 3 failed before its graph
    leader.on_token = None
    leader.fail_all(503, "a rank of the server failed")
    ref = gen.generate([[1, 2, 3]], max_new_tokens=10).tokens[0]
    for sink in sinks:
        assert _texts(sink) == (_shown(ref[:2]), 2)  # steps 1 and 2, nothing lost
        assert sink.items[-1] == Failed(503, "a rank of the server failed")
    assert not leader.requests and not leader._pending and inbox.waiting == 0


def test_drain_timeout_sends_the_last_text_before_the_503(gen: Generator) -> None:
    """A client stops reading at its 503: the last step's text comes before it."""
    leader, inbox, state = _leader(gen, drain_when_idle=False)
    leader.drain_timeout_s = 0.0  # what runs at the drain's first step is stopped
    sink = _Sink()
    inbox.submit(Submission((5,), 30, SamplingConfig(), None, (), sink))  # type: ignore[arg-type]
    steps = []

    def on_step(_: Leader) -> None:
        steps.append(1)
        if len(steps) == 2:
            state.set("draining")

    leader.on_step = on_step
    leader.run()
    ref = gen.generate([[5]], max_new_tokens=30).tokens[0]
    assert _texts(sink) == (_shown(ref[:2]), 2)  # the prefill's token and a decode's
    assert isinstance(sink.items[-1], Failed) and sink.items[-1].status == 503
    assert "drain timeout" in sink.items[-1].message and leader._last_token == {}


def test_cancelled_requests_leave_no_state(gen: Generator) -> None:
    """Clients that go away while their requests run: no timing kept for them, rows free."""
    leader, inbox, state = _leader(gen, drain_when_idle=False)
    sinks = [_Sink(), _Sink()]
    subs = [Submission((7, 8), 30, SamplingConfig(), None, (), s) for s in sinks]  # type: ignore[arg-type]
    for sub in subs:
        inbox.submit(sub)
    steps = []

    def on_step(leader: Leader) -> None:
        steps.append(1)
        if len(steps) == 2:
            for sub in subs:
                inbox.cancel(sub.rid)
        elif len(steps) > 2 and leader.scheduler.idle():
            state.set("draining")

    leader.on_step = on_step
    leader.run()
    assert all(_texts(s)[1] == 2 and all(isinstance(x, Piece) for x in s.items) for s in sinks)
    assert leader._last_token == {} and leader.core.pool.stats().used == 0


def test_settle_heap_freezes_what_exists_and_still_collects_new_garbage():
    """After the warm-up the server moves the load's and the compiles' objects out of the
    collector's scans (a full scan of them stopped the step loop for about half a second);
    garbage made afterwards is collected as before."""
    import gc
    import weakref

    from torch_tensorrt_dist.serving.interpreter import settle_heap

    class Cycle:
        pass

    kept = Cycle()
    try:
        frozen = settle_heap()
        # as many as it froze, less any a thread of an earlier test freed since
        assert 0 < gc.get_freeze_count() <= frozen
        assert not gc.is_tracked(kept) or kept not in gc.get_objects(generation=2)
        later = Cycle()
        later.me = later  # type: ignore[attr-defined]  # a cycle: only the collector frees it
        ref = weakref.ref(later)
        del later
        gc.collect()
        assert ref() is None
    finally:
        gc.unfreeze()


def test_a_stream_whose_events_raise_ends_with_an_error_event_and_done() -> None:
    """Its headers have gone: the client gets a 500 error event, then [DONE]; the answer's
    status is 500 (counted by the stream's ``on_close``, however the stream ends)."""
    import asyncio
    import json
    from types import SimpleNamespace

    from torch_tensorrt_dist.serving.api import _Handler

    class _Answer:
        status, made = "200", 0.0

        async def events(self, queue: object) -> Any:
            yield "data: {}\n\n"
            raise KeyError("a bug")

    handler, answer = SimpleNamespace(), _Answer()

    async def body() -> list[str]:
        sink = SimpleNamespace(queue=None)
        stream = _Handler.stream(handler, answer, sink)  # type: ignore[arg-type]
        return [event async for event, _ in stream]

    events = asyncio.run(body())
    assert events[0] == "data: {}\n\n" and events[-1] == "data: [DONE]\n\n"
    error = json.loads(events[1].removeprefix("data: "))["error"]
    assert error["code"] is None or error["type"]
    assert error["message"] == "internal error: KeyError: 'a bug'"
    assert answer.status == "500"  # what the stream's on_close counts (PacedStream)
