"""One rank of ``torchtrt-dist serve``: warm up, then run the step loop; rank 0 also serves HTTP.

    code = serve_rank(gen, tokenizer=tok, chat=template, stop_ids=(2,), config=ServeConfig(),
                      control=dist.new_group(backend="gloo"))       # every rank

Rank 0 binds its socket and starts the HTTP thread first (``/health`` answers 503 while the
graphs compile), then every rank compiles every prefill bucket and the decode graph, measures
the control channel's latency, and enters the step loop. SIGTERM (or SIGINT) on rank 0 starts a
drain: new requests get 503, running ones finish (at most ``drain_timeout_s``), then rank 0
tells every rank to stop and each exits 0. Other ranks ignore those signals: they leave the
loop when rank 0 says so, or when a collective fails because a peer died. When a step fails on
rank 0 (a rank died), every request in flight gets a 503 and the rank exits non-zero.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType

import torch.distributed as dist

from torch_tensorrt_dist.generation.generate import Generator
from torch_tensorrt_dist.models.tokenizer import Tokenizer
from torch_tensorrt_dist.serving.chat import ChatTemplate
from torch_tensorrt_dist.serving.control import ControlChannel, measure_latency
from torch_tensorrt_dist.serving.loop import Leader, StepLoop
from torch_tensorrt_dist.serving.metrics import Metrics

__all__ = ["ServeConfig", "ServeResult", "serve_rank"]

logger = logging.getLogger(__name__)

#: Rank 0's thread switch interval while serving (Python's default is 5 ms). The step loop
#: releases the interpreter lock inside every collective; when the HTTP thread holds it then,
#: the loop waits for it until the HTTP thread's interval ends, and every other rank waits with
#: it. 0.5 ms bounds that wait per handover.
GIL_SWITCH_S = 5e-4


@dataclass(frozen=True)
class ServeConfig:
    """Options of a server (``torchtrt-dist serve``)."""

    host: str = "127.0.0.1"
    port: int = 8000
    """0 picks a free port (the URL passed to ``on_ready`` has the real one)."""
    api_key: str | None = None
    max_queue: int = 64
    """Requests that may wait for a slot; more get 429."""
    drain_timeout_s: float = 20.0
    idle_tick_s: float = 0.5
    """How often an idle rank 0 still opens a step (the other ranks wait in it)."""
    model_name: str = "model"


@dataclass
class ServeResult:
    """How a rank's server ended: exit code, its one-line step summary, and the first signal
    it received (SIGTERM/SIGINT; the caller may end the process by it once drained)."""

    code: int
    summary: str
    signal: int | None = None
    error: BaseException | None = None
    """What made the server fail (code != 0)."""


class _Signals:
    """The first SIGTERM/SIGINT this rank received; on rank 0 it also starts the drain."""

    def __init__(self, on_signal: Callable[[], None] | None) -> None:
        self.first: int | None = None
        self._on_signal = on_signal
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, _: FrameType | None) -> None:
        self.first = self.first or signum
        if self._on_signal is not None:
            logger.info("signal %d: draining", signum)
            self._on_signal()
        else:
            logger.info("signal %d noted: rank 0 decides when the ranks stop", signum)


def serve_rank(
    gen: Generator,
    *,
    tokenizer: Tokenizer,
    chat: ChatTemplate | None,
    stop_ids: tuple[int, ...],
    config: ServeConfig,
    control: dist.ProcessGroup | None,
    on_ready: Callable[[str, float], None] | None = None,
) -> ServeResult:
    """Run this rank's part of the server until it stops (see the module docstring)."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    core = gen.core(tokenizer=tokenizer, text=rank == 0)
    loop = StepLoop(core, ControlChannel(control))
    if rank != 0:
        signals = _Signals(None)
        gen.warmup_all()
        measure_latency(control)
        _rank_pids(control)
        loop.follow()
        summary = loop.stats.summary(rank, loop.channel.payload_steps)
        return ServeResult(0, summary, signals.first)
    return _lead(gen, loop, tokenizer, chat, stop_ids, config, control, on_ready)


def _lead(
    gen: Generator,
    loop: StepLoop,
    tokenizer: Tokenizer,
    chat: ChatTemplate | None,
    stop_ids: tuple[int, ...],
    config: ServeConfig,
    control: dist.ProcessGroup | None,
    on_ready: Callable[[str, float], None] | None,
) -> ServeResult:
    from torch_tensorrt_dist.serving.api import ServedModel, create_app
    from torch_tensorrt_dist.serving.bridge import Inbox, ServerState
    from torch_tensorrt_dist.serving.http import HttpThread

    state, inbox, metrics = ServerState(), Inbox(config.max_queue), Metrics()

    def check(prompt_len: int, max_new: int) -> None:
        gen.check([[0] * prompt_len], max_new)

    model = ServedModel(
        config.model_name, tokenizer, chat, gen.cache_len, gen.args.vocab_size, check
    )
    http = HttpThread(
        create_app(model, inbox, state, metrics, api_key=config.api_key), config.host, config.port
    )
    http.start()

    signals = _Signals(lambda: state.set("draining"))
    leader = Leader(
        loop,
        gen.scheduler(loop.core),
        inbox,
        state,
        stop_ids=stop_ids,
        idle_tick_s=config.idle_tick_s,
        drain_timeout_s=config.drain_timeout_s,
        on_token=metrics.token,
        on_step=lambda lead: _observe(lead, metrics),
    )
    try:
        warm = gen.warmup_all()
        metrics.control_latency.set(measure_latency(control))
        state.pids = _rank_pids(control)
        if state.state == "warming":
            state.set("ready")
            if on_ready is not None:
                on_ready(http.url, warm)
        with _gil_switch(GIL_SWITCH_S):
            leader.run()
    except Exception as exc:  # a failed collective (a rank died) or a failed graph
        reason = _reason(exc)
        logger.error("the step loop failed: %s", reason)
        state.set("failed", reason)
        leader.fail_all(503, f"a rank of the server failed ({reason})")
        time.sleep(1.0)  # let the HTTP thread send the 503s
        http.stop()
        return ServeResult(1, f"rank 0: failed: {reason}", signals.first, exc)
    http.stop()
    return ServeResult(0, loop.stats.summary(0, loop.channel.payload_steps), signals.first)


@contextlib.contextmanager
def _gil_switch(interval_s: float) -> Iterator[None]:
    """Python's thread switch interval set to ``interval_s`` while the step loop runs."""
    saved = sys.getswitchinterval()
    sys.setswitchinterval(interval_s)
    try:
        yield
    finally:
        sys.setswitchinterval(saved)


def _reason(exc: BaseException) -> str:
    """One line for a failed step: gloo's ``[file:line] Read error ...: Connection reset by
    peer. This is typically ...`` becomes ``Read error ...: Connection reset by peer``."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = re.sub(r"^\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", text)
    text = text.split(". This is typically")[0]
    return f"{type(exc).__name__}: {text}"[:300]


def _rank_pids(control: dist.ProcessGroup | None) -> list[int]:
    """Every rank's process id, by rank (shown by ``/health``; tests and operators use it)."""
    if control is None:
        return [os.getpid()]
    pids: list[int] = [0] * dist.get_world_size(control)
    dist.all_gather_object(pids, os.getpid(), group=control)
    return pids


def _observe(leader: Leader, metrics: Metrics) -> None:
    loop, sched, pool = leader.loop, leader.scheduler, leader.core.pool
    metrics.running.set(loop.core.active)
    metrics.waiting.set(sched.pending)
    stats = pool.stats()
    for state in ("used", "cached", "free"):
        metrics.blocks.labels(state).set(getattr(stats, state))
    metrics.set_total(metrics.preemptions, sched.preemptions)
    metrics.set_total(metrics.prefix_queries, pool.queries)
    metrics.set_total(metrics.prefix_hits, pool.hits)
    if loop.last is not None:  # the step ran rows
        step_s, control_s = loop.last
        metrics.step.observe(step_s)
        metrics.control.observe(control_s)
