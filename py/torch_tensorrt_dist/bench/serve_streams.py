"""Streamed completions through the official ``openai`` client, and what they measured.

    run = asyncio.run(run_clients(url, "bench", prompts, requests=16, concurrency=8,
                                  max_tokens=64))
    run.tokens_per_s, run.ttft_p(0.5), slowest_ttft_share(run.streams)

Every request streams ``/v1/completions`` (greedy, usage included), so its time to first token
and the times of its tokens are what a client sees. A prompt is text, or a list of token ids
(what our server also takes). The figures of a run are pure functions of these times.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from torch_tensorrt_dist.bench.serve_load import percentile

__all__ = [
    "ClientRun",
    "Stream",
    "max_gap_during",
    "run_clients",
    "slowest_ttft_share",
    "stream_completion",
]

Prompt = str | list[int]


@dataclass
class Stream:
    """One streamed request: when it was sent, when each piece of text arrived (seconds, one
    clock), and the server's usage."""

    sent: float
    times: list[float] = field(default_factory=list)
    text: str = ""
    completion_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0

    @property
    def ttft(self) -> float:
        return self.times[0] - self.sent if self.times else float("inf")

    @property
    def latency(self) -> float:
        """Sent to last token."""
        return self.times[-1] - self.sent if self.times else float("inf")

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first over the time they took (what ``generate`` reports)."""
        span = self.times[-1] - self.times[0] if len(self.times) > 1 else 0.0
        return (self.completion_tokens - 1) / span if span > 0 else 0.0

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in itertools.pairwise(self.times)]


@dataclass
class ClientRun:
    """``requests`` streams from ``concurrency`` clients, and the wall time they took."""

    wall_s: float
    streams: list[Stream]

    @property
    def tokens(self) -> int:
        return sum(s.completion_tokens for s in self.streams)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    def ttft_p(self, q: float) -> float:
        return percentile([s.ttft for s in self.streams], q)

    def itl_p(self, q: float) -> float:
        return percentile([g for s in self.streams for g in s.gaps], q)

    def decode_tokens_per_s(self) -> float:
        """The median stream's decode speed."""
        return statistics.median(s.decode_tokens_per_s for s in self.streams)


def slowest_ttft_share(streams: Sequence[Stream]) -> float:
    """The slowest time to first token over the median request latency (sent to last token):
    below 0.5, no request waited for another to finish."""
    return max(s.ttft for s in streams) / statistics.median(s.latency for s in streams)


def max_gap_during(streams: Sequence[Stream], start: float, end: float) -> float:
    """The largest gap between two tokens of any of ``streams`` that overlaps [start, end]
    (a gap that begins before ``end`` and ends after ``start``); 0 when none does."""
    gaps = [b - a for s in streams for a, b in itertools.pairwise(s.times) if a < end and b > start]
    return max(gaps, default=0.0)


async def stream_completion(
    client: Any,
    model: str,
    prompt: Prompt,
    max_tokens: int,
    *,
    started: Any = None,
    stream: Stream | None = None,
    min_tokens: int = 0,
) -> Stream:
    """One streamed greedy completion through an ``openai.AsyncOpenAI`` client; ``started``:
    an ``asyncio.Event`` set when its first token arrives; ``stream``: record into this one
    (what it holds stays readable when the task is cancelled: the client closes the stream,
    the server cancels the request); ``min_tokens``: no end of text before that many tokens
    (vLLM's field, ours too)."""
    stream = stream or Stream(0.0)
    stream.sent = time.perf_counter()
    text: list[str] = []
    response = await client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"min_tokens": min_tokens} if min_tokens else None,
    )
    try:
        async for chunk in response:
            if chunk.choices and chunk.choices[0].text:
                stream.times.append(time.perf_counter())
                text.append(chunk.choices[0].text)
                if started is not None:
                    started.set()
            if chunk.usage is not None:
                stream.completion_tokens = chunk.usage.completion_tokens
                stream.prompt_tokens = chunk.usage.prompt_tokens
                details = chunk.usage.prompt_tokens_details
                stream.cached_tokens = (details.cached_tokens or 0) if details else 0
    finally:
        stream.text = "".join(text)
        await response.close()
    return stream


def client(url: str) -> Any:
    """An ``openai.AsyncOpenAI`` client of the server at ``url`` (no retries: a failure shows)."""
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)


async def run_clients(
    url: str,
    model: str,
    prompts: Sequence[Prompt],
    *,
    requests: int,
    concurrency: int,
    max_tokens: int,
) -> ClientRun:
    """``requests`` streamed completions (``prompts`` taken in turn) from ``concurrency``
    clients, each sending its next request when its last one ended."""
    todo = list(range(requests))
    streams: list[Stream] = [Stream(0.0)] * requests
    async with client(url) as api:

        async def worker() -> None:
            while todo:
                i = todo.pop(0)
                streams[i] = await stream_completion(
                    api, model, prompts[i % len(prompts)], max_tokens
                )

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return ClientRun(wall, streams)
