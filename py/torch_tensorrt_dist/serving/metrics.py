"""The server's Prometheus metrics (``GET /metrics``), in a registry of its own.

Requests by status, prompt and generated tokens, queue depth, running and waiting requests, KV
blocks (used, cached, free), preemptions, prefix-cache hits, speculative decoding's proposed and
accepted tokens and mean accepted length, time to first token, inter-token
latency, the time from a token's step to the write of its text to the client (kept by the
process that writes: with HTTP in a process of its own, ``ClientMetrics`` there), step time
and the control channel's time per step (rank 0's exchange, and the one-way latency measured at
warm-up), and the CPU time of rank 0's step and HTTP threads (Linux: read from
``/proc/self/task`` at each scrape).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, Metric

from torch_tensorrt_dist.runtime.exit_watch import proc_stat_fields
from torch_tensorrt_dist.serving.bridge import Submission

__all__ = ["CONTENT_TYPE", "ClientMetrics", "Metrics", "ThreadCPUMetric", "thread_cpu_seconds"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_FAST = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1)


def thread_cpu_seconds(native_id: int, pid: int | None = None) -> float | None:
    """CPU seconds (user + system) thread ``native_id`` of this process (or of process
    ``pid``) has used; None where it has ended or ``/proc`` does not exist (not Linux)."""
    try:
        with open(f"/proc/{pid or 'self'}/task/{native_id}/stat") as f:
            fields = proc_stat_fields(f.read())
    except OSError:
        return None
    # from the state (proc(5)'s field 3): utime is field 14, stime 15
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ThreadCPUMetric:
    """A collector: ``<prefix>_thread_cpu_seconds_total{thread=...}`` for the threads named
    with :meth:`track` (rank 0's step loop and HTTP thread). Their share of a core over an
    interval says which one limits the server; a step thread short of a whole core while
    rows run is waiting: for the GIL (which the two share), the CPU, or the other ranks
    (``docs/performance.md``)."""

    def __init__(self, prefix: str) -> None:
        self.name = f"{prefix}_thread_cpu_seconds"
        self._threads: dict[str, tuple[int, int | None]] = {}
        self._lock = threading.Lock()

    def track(self, name: str, native_id: int, *, pid: int | None = None) -> None:
        """Report thread ``native_id`` (``threading.get_native_id()``) as ``name``; of process
        ``pid`` (rank 0's HTTP process) where given."""
        with self._lock:
            self._threads[name] = (native_id, pid)

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            self.name, "CPU time of a thread of rank 0 (user + system)", labels=["thread"]
        )
        with self._lock:
            threads = list(self._threads.items())
        for name, (tid, pid) in threads:
            seconds = thread_cpu_seconds(tid, pid)
            if seconds is not None:
                family.add_metric([name], seconds)
        yield family


def _write_delay(prefix: str, registry: CollectorRegistry) -> Histogram:
    return Histogram(
        f"{prefix}_token_to_write_seconds",
        "From the step that made a token to the write of its text to the client (the oldest "
        "token of each event: a slow reader's merged events count their wait)",
        buckets=_LATENCY,
        registry=registry,
    )


class ClientMetrics:
    """What the HTTP process measures itself (its writes to clients); its ``/metrics`` shows
    them after rank 0's (``frontend.ChildInbox.scrape``)."""

    def __init__(self, prefix: str = "torchtrt") -> None:
        self.registry = CollectorRegistry()
        self.write_delay = _write_delay(prefix, self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class Metrics:
    """Every metric of one server; thread-safe (prometheus-client locks its values)."""

    def __init__(self, prefix: str = "torchtrt") -> None:
        r = self.registry = CollectorRegistry()
        self._totals: dict[int, float] = {}
        p = prefix
        self.requests = Counter(
            f"{p}_requests", "Finished HTTP requests by status", ["status"], registry=r
        )
        self.prompt_tokens = Counter(f"{p}_prompt_tokens", "Prompt tokens received", registry=r)
        self.generated_tokens = Counter(f"{p}_generation_tokens", "Tokens generated", registry=r)
        self.queue_depth = Gauge(
            f"{p}_queue_depth", "Requests accepted and not admitted yet", registry=r
        )
        self.running = Gauge(f"{p}_running_requests", "Requests running (rows)", registry=r)
        self.waiting = Gauge(
            f"{p}_waiting_requests",
            "Requests waiting for admission (new or preempted)",
            registry=r,
        )
        self.blocks = Gauge(
            f"{p}_kv_blocks", "KV-cache blocks by state (rank 0)", ["state"], registry=r
        )
        self.preemptions = Counter(
            f"{p}_preemptions", "Requests preempted (their KV recomputed later)", registry=r
        )
        self.prefix_queries = Counter(
            f"{p}_prefix_cache_queries", "Prompt blocks looked up in the prefix cache", registry=r
        )
        self.prefix_hits = Counter(
            f"{p}_prefix_cache_hits", "Prompt blocks found in the prefix cache", registry=r
        )
        self.prefix_hit_rate = Gauge(
            f"{p}_prefix_cache_hit_rate",
            "Prompt blocks found in the prefix cache / blocks looked up, since the start",
            registry=r,
        )
        # speculative decoding (vLLM's names)
        spec, why = f"{p}_spec_decode", " (speculative decoding)"
        self.spec_proposed = Counter(
            f"{spec}_num_draft_tokens", "Tokens proposed for verification" + why, registry=r
        )
        self.spec_accepted = Counter(
            f"{spec}_num_accepted_tokens", "Proposed tokens the target accepted" + why, registry=r
        )
        self.spec_accepted_length = Gauge(
            f"{spec}_mean_accepted_length",
            "Tokens a verified row produced per step, accepted ones and its own, since the start",
            registry=r,
        )

        def seconds(name: str, doc: str, buckets: tuple[float, ...] = _LATENCY) -> Histogram:
            return Histogram(f"{p}_{name}_seconds", doc, buckets=buckets, registry=r)

        self.ttft = seconds("time_to_first_token", "Arrival to first token")
        self.itl = seconds("inter_token_latency", "Time between tokens")
        self.step = seconds("step", "Decode step (control exchange included)")
        self.control = seconds("control", "Control exchange of a decode step (rank 0)", _FAST)
        self.control_latency = Gauge(
            f"{p}_control_latency_seconds",
            "One-way latency of a control header (measured at warm-up)",
            registry=r,
        )
        self.write_delay = _write_delay(p, r)
        self.threads = ThreadCPUMetric(p)
        r.register(self.threads)

    def writes_elsewhere(self) -> None:
        """The HTTP server runs in a process of its own, which keeps ``write_delay``."""
        self.registry.unregister(self.write_delay)

    def set_total(self, counter: Counter, total: float) -> None:
        """Advance ``counter`` to ``total`` (a running total kept elsewhere)."""
        seen = self._totals.get(id(counter), 0.0)
        if total > seen:
            counter.inc(total - seen)
            self._totals[id(counter)] = total

    def token(self, sub: Submission, now: float, prev: float | None) -> None:
        """A token of ``sub`` was published at ``now`` (``prev``: its previous one's time)."""
        self.generated_tokens.inc()
        if prev is None:
            self.ttft.observe(now - sub.arrived)
        else:
            self.itl.observe(now - prev)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def scrape(self, waiting: int) -> bytes:
        """``/metrics``'s body, the wait queue holding ``waiting`` requests (the HTTP process
        asks rank 0 for it: ``frontend.ChildInbox.scrape``)."""
        self.queue_depth.set(waiting)
        return self.render()
