"""The server's Prometheus metrics (``GET /metrics``), in a registry of its own.

Requests by status, prompt and generated tokens, queue depth, running rows, time to first
token, inter-token latency, decode step time and the control channel's time per decode step
(rank 0's exchange, and the one-way latency measured at warm-up).
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
        p = prefix
        self.requests = Counter(
            f"{p}_requests", "Finished HTTP requests by status", ["status"], registry=r
        )
        self.prompt_tokens = Counter(f"{p}_prompt_tokens", "Prompt tokens received", registry=r)
        self.generated_tokens = Counter(f"{p}_generation_tokens", "Tokens generated", registry=r)
        self.queue_depth = Gauge(f"{p}_queue_depth", "Requests waiting for a slot", registry=r)
        self.running = Gauge(f"{p}_running_rows", "KV-cache rows running a request", registry=r)
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

    def token(self, sub: Submission, now: float, prev: float | None) -> None:
        """A token of ``sub`` was published at ``now`` (``prev``: its previous one's time)."""
        self.generated_tokens.inc()
        if prev is None:
            self.ttft.observe(now - sub.arrived)
        else:
            self.itl.observe(now - prev)

    def render(self) -> bytes:
        return generate_latest(self.registry)
