"""``bench --section serve_clients``: what each client of a streamed completion sees.

    figures = client_view(streams)   # pure: gaps between events, first event, events per token

The serving benchmark's checkpoint (``serve_checkpoint.py``: 4096 positions, the demo model's
byte-level BPE, greedy runs to the token limit) is served at TP 1 and 2; C = 1, 8 and 32 clients
each send one streamed completion at once, long (1,500 tokens) then short (64 tokens), and
record when each event with text arrives. Per run: the wait from the request to its first
event, the gaps between events (p50 / p99 / max over every stream's gaps, and the largest gap
of any one stream), and events per token (below 1: pieces were merged for a slow reader, or
text was held back by the detokenizer). Greedy text of random weights drifts into bytes that
never form a character: the issue's freeze showed there. The clients are asyncio tasks of one
process (``httpx``), reading as fast as they can.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch_tensorrt_dist.bench.common import Figure
from torch_tensorrt_dist.bench.serve_control import PROMPTS
from torch_tensorrt_dist.bench.serve_load import ServerProcess, percentile
from torch_tensorrt_dist.bench.serve_streams import Stream

__all__ = ["ClientSizes", "client_view", "serve_clients", "stream_events"]

SECTION = "serve_clients (CPU, gloo, bench checkpoint)"
#: the goal of the issue: no client waits longer than this for its next event
MAX_WAIT_S = 0.5


@dataclass(frozen=True)
class ClientSizes:
    """The runs of the section."""

    clients: tuple[int, ...] = (1, 8, 32)
    long_tokens: int = 1500
    short_tokens: int = 64
    engine: str = "inductor"
    tp: tuple[int, ...] = (1, 2)

    @classmethod
    def quick(cls) -> ClientSizes:
        return cls(clients=(1, 4), long_tokens=200, short_tokens=16, engine="none", tp=(1,))


def client_view(streams: Sequence[Stream]) -> dict[str, float]:
    """The figures of one run's streams (seconds; pure): the first event's wait (p50, max),
    the gaps between events (p50, p99, max), and events per generated token."""
    gaps = [g for s in streams for g in s.gaps]
    tokens = sum(s.completion_tokens for s in streams)
    return {
        "first_p50": percentile([s.ttft for s in streams], 0.5),
        "first_max": max((s.ttft for s in streams), default=0.0),
        "gap_p50": percentile(gaps, 0.5),
        "gap_p99": percentile(gaps, 0.99),
        "gap_max": max(gaps, default=0.0),
        "events_per_token": sum(len(s.times) for s in streams) / tokens if tokens else 0.0,
    }


async def stream_events(client: Any, url: str, prompt: str, max_tokens: int) -> Stream:
    """One streamed completion read with ``httpx``: the time of each event with text."""
    body = {
        "model": "bench",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    stream = Stream(time.perf_counter())
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"the server answered {r.status_code}: {await r.aread()!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(f"the stream ended with an error: {event['error']}")
            if event["choices"] and event["choices"][0]["text"]:
                stream.times.append(time.perf_counter())
            if event.get("usage"):
                stream.completion_tokens = event["usage"]["completion_tokens"]
    return stream


async def _run(url: str, clients: int, max_tokens: int) -> list[Stream]:
    import httpx

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        return list(
            await asyncio.gather(
                *(
                    stream_events(client, url, PROMPTS[i % len(PROMPTS)], max_tokens)
                    for i in range(clients)
                )
            )
        )


def serve_clients(sizes: ClientSizes | None = None) -> list[Figure]:
    from torch_tensorrt_dist.bench.serve_checkpoint import bench_checkpoint

    sizes = sizes or ClientSizes()
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = bench_checkpoint(tmp)
        longest = max(sizes.long_tokens, sizes.short_tokens) + 64
        args = ["--model", str(path), "--engine", sizes.engine, "--served-model-name", "bench"]
        args += ["--max-batch-size", str(max(sizes.clients)), "--max-seq-len", str(longest)]
        for tp in sizes.tp:
            with ServerProcess([*args, "--tp", str(tp)]) as server:
                asyncio.run(_run(server.url, 1, 4))  # warm-up
                for kind, tokens in (("long", sizes.long_tokens), ("short", sizes.short_tokens)):
                    for c in sizes.clients:
                        view = client_view(asyncio.run(_run(server.url, c, tokens)))
                        figures += _figures(f"TP {tp}, C={c} {kind} ({tokens} tokens)", view)
    return figures


def _figures(run: str, view: dict[str, float]) -> list[Figure]:
    waits = max(view["first_max"], view["gap_max"])
    return [
        Figure(SECTION, f"{run}: first event p50 / max", _pair(view, "first"), "s"),
        Figure(
            SECTION,
            f"{run}: gap between events p50 / p99 / max",
            f"{view['gap_p50']:.3f} / {view['gap_p99']:.3f} / {view['gap_max']:.3f}",
            "s",
            goal=f"largest wait <= {MAX_WAIT_S} s",
            met=waits <= MAX_WAIT_S,
        ),
        Figure(SECTION, f"{run}: events per token", round(view["events_per_token"], 3)),
    ]


def _pair(view: dict[str, float], name: str) -> str:
    return f"{view[f'{name}_p50']:.3f} / {view[f'{name}_max']:.3f}"
