"""The server's Prometheus metrics (``GET /metrics``), in a registry of its own.

Requests by status, prompt and generated tokens, queue depth, running and waiting requests, KV
blocks (used, cached, free), preemptions, prefix-cache hits, time to first token, inter-token
latency, step time and the control channel's time per step (rank 0's exchange, and the one-way
latency measured at warm-up).
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from torch_tensorrt_dist.serving.bridge import Submission

__all__ = ["CONTENT_TYPE", "Metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_FAST = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1)


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
        self.ttft = Histogram(
            f"{p}_time_to_first_token_seconds",
            "Arrival to first token",
            buckets=_LATENCY,
            registry=r,
        )
        self.itl = Histogram(
            f"{p}_inter_token_latency_seconds", "Time between tokens", buckets=_LATENCY, registry=r
        )
        self.step = Histogram(
            f"{p}_step_seconds",
            "Decode step (control exchange included)",
            buckets=_LATENCY,
            registry=r,
        )
        self.control = Histogram(
            f"{p}_control_seconds",
            "Control exchange of a decode step (rank 0)",
            buckets=_FAST,
            registry=r,
        )
        self.control_latency = Gauge(
            f"{p}_control_latency_seconds",
            "One-way latency of a control header (measured at warm-up)",
            registry=r,
        )

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
