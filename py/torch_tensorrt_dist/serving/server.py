"""One rank of ``torchtrt-dist serve``: warm up, then run the step loop; rank 0 also serves HTTP.

    code = serve_rank(gen, tokenizer=tok, chat=template, stop_ids=(2,), config=ServeJob(),
                      control=dist.new_group(backend="gloo"))       # every rank

Rank 0 serves on a socket bound before the model loads (``http.bind_socket``, passed as
``sock``) and starts HTTP first, in a forked process of its own (``http_process.py``; ``/health``
answers 503 while the graphs compile), then every rank compiles every prefill bucket and the
decode graph, measures the control channel's latency, and enters the step loop. SIGTERM (or
SIGINT) on rank 0 starts a drain: new requests get 503, running ones finish (at most
``config.drain_timeout``), then rank 0 tells every rank to stop and each exits 0. Other ranks note
those signals: they leave the loop when rank 0 says so, or when a collective fails because a
peer died. When a step fails on rank 0 (a rank died), every request in flight gets a 503 and the
rank exits non-zero.

Liveness (``watchdog.py``): every rank other than 0 writes a heartbeat into the c10d store; rank
0's watchdog turns ``/health`` to 503, fails what is in flight and ends the server, naming the
rank that did not answer, when a step runs ``config.step_timeout`` without returning. A signal is
seen at once even while the main thread is stuck (``signals.py``): rank 0 stops accepting, and
a rank still running ``drain_timeout + DRAIN_GRACE_S`` after it ends itself.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from torch_tensorrt_dist.config.jobs import (
    DRAIN_GRACE_S,
    ServeJob,
)
from torch_tensorrt_dist.errors import ConfigError, EngineUnavailableError, StepTimeoutError
from torch_tensorrt_dist.generation.generate import Generator
from torch_tensorrt_dist.generation.grammar import Grammars
from torch_tensorrt_dist.models.tokenizer import Tokenizer
from torch_tensorrt_dist.runtime import end_now
from torch_tensorrt_dist.serving import watchdog
from torch_tensorrt_dist.serving.chat import ChatTemplate
from torch_tensorrt_dist.serving.control import ControlChannel, measure_latency
from torch_tensorrt_dist.serving.interpreter import gil_switch, settle_heap, switch_interval
from torch_tensorrt_dist.serving.loop import Leader, StepLoop
from torch_tensorrt_dist.serving.metrics import Metrics
from torch_tensorrt_dist.serving.signals import StopSignals, end_by_first
from torch_tensorrt_dist.serving.tools import served_format

__all__ = ["IDLE_TICK_S", "ServeResult", "serve_rank"]

logger = logging.getLogger(__name__)

#: how often an idle rank 0 still opens a step (the other ranks wait in it)
IDLE_TICK_S = 0.5
#: seconds the "serving ... at URL" line waits for the HTTP process to have applied "ready"
TOLD_TIMEOUT_S = 30.0


@dataclass
class ServeResult:
    """How a rank's server ended: exit code, its one-line step summary, and the first signal
    it received (SIGTERM/SIGINT; the caller may end the process by it once drained)."""

    code: int
    summary: str
    signal: int | None = None
    error: BaseException | None = None
    """What made the server fail (code != 0)."""


def serve_rank(
    gen: Generator,
    *,
    tokenizer: Tokenizer,
    chat: ChatTemplate | None,
    stop_ids: tuple[int, ...],
    config: ServeJob,
    control: dist.ProcessGroup | None,
    on_ready: Callable[[str, float, str], None] | None = None,
    signals: StopSignals | None = None,
    sock: socket.socket | None = None,
) -> ServeResult:
    """Run this rank's part of the server until it stops (see the module docstring).
    ``config``: the ``serve`` command's options (its ``served_model_name`` resolved: the name
    the API shows, ``model`` when None); ``signals``: installed before the model loaded (else
    now); ``sock``: rank 0's bound socket (else bound now)."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    signals = signals or StopSignals()
    core = gen.core(tokenizer=tokenizer, text=rank == 0)
    core.isolate = True  # one request's failure fails that request only (every rank alike)
    core.grammars, grammar_error = _grammars(tokenizer, gen.runner.args.vocab_size, stop_ids)
    loop = StepLoop(core, ControlChannel(control))
    if rank != 0:
        gen.warmup_all(stop=lambda: _stop_agreed(control, signals))
        settle_heap()
        measure_latency(control)
        _rank_pids(control)
        beat = watchdog.Heartbeat(
            _store(), rank, loop.progress, beat_s=watchdog.beat_interval(config.step_timeout)
        ).start()
        signals.deadline(config.drain_timeout + 2 * DRAIN_GRACE_S, lambda: end_by_first(signals))
        try:
            loop.follow()
        finally:
            signals.cancel()
            beat.stop()
        summary = loop.stats.summary(rank, loop.channel.payload_steps)
        return ServeResult(0, summary, signals.first)
    lead = _Lead(gen, tokenizer, chat, stop_ids, config, control, signals, on_ready, sock)
    return _serve_lead(lead, loop, grammar_error)


def _grammars(
    tokenizer: Tokenizer, vocab_size: int, eos_ids: tuple[int, ...]
) -> tuple[Grammars | None, str]:
    """The grammar engine of structured output over the model's tokenizer (the same on every
    rank), or None and why (requests with a grammar then get a 400 saying so)."""
    try:
        return Grammars.for_tokenizer(tokenizer, vocab_size=vocab_size, eos_ids=eos_ids), ""
    except (ConfigError, EngineUnavailableError) as exc:
        logger.warning("structured output is not available: %s", exc)
        return None, str(exc)


@dataclass(frozen=True)
class _Lead:
    """What rank 0 serves with: :func:`serve_rank`'s arguments, its stop signals installed."""

    gen: Generator
    tokenizer: Tokenizer
    chat: ChatTemplate | None
    stop_ids: tuple[int, ...]
    config: ServeJob
    control: dist.ProcessGroup | None
    signals: StopSignals
    on_ready: Callable[[str, float, str], None] | None
    sock: socket.socket | None


def _serve_lead(lead: _Lead, loop: StepLoop, grammar_error: str) -> ServeResult:
    """Rank 0: HTTP in its own process, the warm-up, then the leader's step loop until a
    drain ends it (or a failure); ``grammar_error``: why structured output is unavailable."""
    from torch_tensorrt_dist.serving.api import ServedModel, create_app
    from torch_tensorrt_dist.serving.bridge import ServerState
    from torch_tensorrt_dist.serving.http import bind_socket
    from torch_tensorrt_dist.serving.http_process import HttpProcess
    from torch_tensorrt_dist.serving.limits import request_limits
    from torch_tensorrt_dist.serving.stream_out import StreamLimits

    config, control, signals = lead.config, lead.control, lead.signals
    state, metrics = ServerState(), Metrics()
    sock = lead.sock or bind_socket(config.host, config.port)

    run = lead.gen.runner

    def check(prompt_len: int, max_new: int) -> None:
        run.check([[0] * prompt_len], max_new)

    limits = request_limits(lead.tokenizer, cache_len=run.cache_len)
    model = ServedModel(
        config.served_model_name or "model",
        lead.tokenizer,
        lead.chat,
        run.cache_len,
        run.args.vocab_size,
        check,
        limits,
        rows=run.max_batch_size,
        max_queue=config.max_queue,
        grammars=loop.core.grammars,
        grammar_error=grammar_error,
        eos_ids=lead.stop_ids,
        tool_format=served_format(config.tool_call_parser, lead.chat.source if lead.chat else None),
        reasoning=config.reasoning_parser is not None,
    )

    def http_lost(reason: str) -> None:
        """The HTTP process ended unasked (killed), or the pipe to it failed: the server
        cannot go on; ``/health`` says why (where the child still answers), exit 1."""
        logger.error("the server stops: %s", reason)
        state.set("failed", reason)
        if inbox.fail_live(503, f"the server failed: {reason}") and http.alive():
            time.sleep(1.0)  # let HTTP send the 503s
        end_now(1, RuntimeError(reason))

    streams = StreamLimits(config.write_timeout)
    metrics.writes_elsewhere()  # the client-side metrics are measured in the HTTP process
    # the HTTP server in a forked child (``http_process.py``)
    http = HttpProcess(
        lambda inbox, st: create_app(
            model, inbox, st, inbox, api_key=config.api_key, stream=streams
        ),
        sock,
        state,
        metrics,
        max_waiting=config.max_queue,
        on_lost=http_lost,
    )
    inbox = http.inbox
    http.start()
    metrics.threads.track("step", threading.get_native_id())  # this thread runs the loop
    signals.on_signal(lambda _: state.set("draining"))

    def stop_now(reason: str, verdict: watchdog.Verdict | None) -> None:
        """The step loop cannot go on (from a thread: the main thread is stuck)."""
        logger.error("the server stops: %s", reason)
        state.set("failed", reason)
        inbox.fail_live(503, f"the server failed: {reason}")
        time.sleep(1.0)  # let HTTP send the 503s
        blame = verdict.rank if verdict is not None and verdict.rank != 0 else None
        end_now(1, StepTimeoutError(reason, failed_rank=blame))

    def hang(verdict: watchdog.Verdict) -> None:
        stop_now(f"{verdict.message()} (--step-timeout {config.step_timeout:g} s)", verdict)

    def late() -> None:
        verdict = dog.verdict() if dog is not None else None
        why = f": {verdict.message()}" if verdict is not None else ""
        stop_now(f"the drain did not end within {config.drain_timeout:g} s{why}", verdict)

    leader = Leader(
        loop,
        lead.gen.scheduler(loop.core),
        inbox,
        state,
        stop_ids=lead.stop_ids,
        idle_tick_s=IDLE_TICK_S,
        drain_timeout_s=config.drain_timeout,
        on_token=metrics.token,
        on_step=lambda lead: _observe(lead, metrics),
    )
    dog: watchdog.Watchdog | None = None
    try:
        warm = lead.gen.warmup_all(stop=lambda: _stop_agreed(control, signals), progress=True)
        settle_heap()
        metrics.control_latency.set(measure_latency(control))
        state.pids = _rank_pids(control)
        dog = _watchdog(control, loop.progress, config, hang)
        signals.deadline(config.drain_timeout + DRAIN_GRACE_S, late)
        if state.state == "warming":
            state.set("ready")
            if not http.told(TOLD_TIMEOUT_S):
                logger.warning("the HTTP process did not confirm 'ready' in %g s", TOLD_TIMEOUT_S)
            if lead.on_ready is not None:  # URL, warm-up s, HTTP
                lead.on_ready(http.url, warm, f"{http.loop}, own process")
        with gil_switch(switch_interval(run.engine)):
            leader.run()
    except Exception as exc:  # a failed collective (a rank died) or a failed graph
        verdict = dog.verdict() if dog is not None else None
        error, reason = _blamed(exc, verdict)
        logger.error("the step loop failed: %s", reason)
        state.set("failed", reason)
        leader.fail_all(503, f"a rank of the server failed ({reason})")
        inbox.fail_live(503, f"a rank of the server failed ({reason})")
        time.sleep(1.0)  # let HTTP send the 503s
        http.stop()
        return ServeResult(1, f"rank 0: failed: {reason}", signals.first, error)
    finally:
        signals.cancel()
        if dog is not None:
            dog.stop()
    http.stop()
    return ServeResult(0, loop.stats.summary(0, loop.channel.payload_steps), signals.first)


def _stop_agreed(control: dist.ProcessGroup | None, signals: StopSignals) -> bool:
    """Whether any rank got a stop signal (every rank gets the same answer: the warm-up ends
    at the same graph on every rank)."""
    flag = torch.tensor([int(signals.first is not None)])
    if control is not None:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=control)
    return bool(flag.item())


def _store() -> dist.Store:
    """A connection of its own to the c10d store (its heartbeat thread uses it)."""
    store = dist.distributed_c10d._get_default_store()
    clone = getattr(store, "clone", None)
    try:
        return clone() if clone is not None else store
    except RuntimeError:  # a store without clone: share the process group's connection
        return store


def _watchdog(
    control: dist.ProcessGroup | None,
    progress: watchdog.StepProgress,
    config: ServeJob,
    on_hang: Callable[[watchdog.Verdict], None],
) -> watchdog.Watchdog:
    peers = None
    if control is not None:
        ranks = [r for r in dist.get_process_group_ranks(control) if r != dist.get_rank()]
        peers = watchdog.PeerBeats(_store(), ranks)
    return watchdog.Watchdog(
        progress, peers, timeout_s=config.step_timeout, on_hang=on_hang
    ).start()


def _blamed(exc: Exception, verdict: watchdog.Verdict | None) -> tuple[BaseException, str]:
    """The error a failed step leaves, and its reason in one line: a collective that timed
    out names the rank that did not answer (the launcher then blames it, not rank 0)."""
    reason = _reason(exc)
    if verdict is None or not re.search(r"timed? ?out", str(exc), re.I):
        return exc, reason
    reason = f"{reason}; {verdict.message()}"
    error = StepTimeoutError(reason, failed_rank=verdict.rank if verdict.rank != 0 else None)
    error.__cause__ = exc
    return error, reason


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
    metrics.prefix_hit_rate.set(pool.hits / pool.queries if pool.queries else 0.0)
    core = loop.core
    if core.speculative is not None:
        metrics.set_total(metrics.spec_proposed, core.spec_proposed)
        metrics.set_total(metrics.spec_accepted, core.spec_accepted)
        rows = core.spec_rows
        metrics.spec_accepted_length.set(1 + core.spec_accepted / rows if rows else 0.0)
    if loop.last is not None:  # the step ran rows
        step_s, control_s = loop.last
        metrics.step.observe(step_s)
        metrics.control.observe(control_s)
