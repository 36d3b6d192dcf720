"""The serving benchmark's request patterns beyond steady clients (issue 28).

    join = asyncio.run(join_during_streams(url, "bench", prompts, long_ids, stream_tokens=256))
    join.gap_share                      # largest gap of a running stream / the join's TTFT
    first, second = asyncio.run(shared_prefix(url, "bench", prefix, suffix_a, suffix_b))
    second.ttft / first.ttft, second.cached_tokens

A joining prompt and shared prefixes are token ids (what our server takes as a prompt), drawn
from a seeded generator so that no earlier request of the run cached them.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass

from torch_tensorrt_dist.bench.serve_streams import (
    Prompt,
    Stream,
    client,
    max_gap_during,
    stream_completion,
)

__all__ = ["Join", "join_during_streams", "random_ids", "shared_prefix"]


def random_ids(n: int, *, vocab: int, seed: int, avoid: Sequence[int] = ()) -> list[int]:
    """``n`` token ids in [0, vocab) from a seeded generator, none of ``avoid`` (special ids)."""
    rng, skip = random.Random(seed), set(avoid)
    out: list[int] = []
    while len(out) < n:
        i = rng.randrange(vocab)
        if i not in skip:
            out.append(i)
    return out


@dataclass
class Join:
    """Running streams, and a long prompt that joined them once each had its first token."""

    streams: list[Stream]
    join: Stream

    @property
    def gap(self) -> float:
        """The largest gap between two tokens of a running stream while the join was
        prefilled (sent to its first token)."""
        return max_gap_during(self.streams, self.join.sent, self.join.times[0])

    @property
    def gap_share(self) -> float:
        return self.gap / self.join.ttft

    @property
    def covered(self) -> bool:
        """Every stream still ran when the join got its first token (else fewer gaps count)."""
        return all(s.times and s.times[-1] >= self.join.times[0] for s in self.streams)


async def join_during_streams(
    url: str,
    model: str,
    prompts: Sequence[Prompt],
    join_prompt: Prompt,
    *,
    stream_tokens: int,
    join_tokens: int = 4,
) -> Join:
    """``len(prompts)`` streams of ``stream_tokens`` tokens (no end of text before: a stream
    that ended early would leave the join's prefill unmeasured); once each has its first token,
    ``join_prompt`` is sent; once it has its first token and ended, the streams are closed
    (their requests cancelled)."""
    streams = [Stream(0.0) for _ in prompts]
    async with client(url) as api:
        started = [asyncio.Event() for _ in prompts]
        tasks = [
            asyncio.create_task(
                stream_completion(
                    api, model, p, stream_tokens, started=e, stream=s, min_tokens=stream_tokens
                )
            )
            for p, e, s in zip(prompts, started, streams, strict=True)
        ]
        try:
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), timeout=600)
            join = await stream_completion(api, model, join_prompt, join_tokens)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return Join(streams, join)


async def shared_prefix(
    url: str,
    model: str,
    prefix: list[int],
    first_suffix: list[int],
    second_suffix: list[int],
    *,
    max_tokens: int = 4,
) -> tuple[Stream, Stream]:
    """Two requests, one after the other, whose prompts share ``prefix``: the second may take
    the first's prefix blocks from the prefix cache."""
    async with client(url) as api:
        first = await stream_completion(api, model, prefix + first_suffix, max_tokens)
        second = await stream_completion(api, model, prefix + second_suffix, max_tokens)
    return first, second
