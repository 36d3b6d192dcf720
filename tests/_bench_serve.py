"""Hand-made streams for the serve bench's tests (``tests/test_bench_serve*.py``)."""

from __future__ import annotations

from torch_tensorrt_dist.bench.serve_streams import Stream


def stream(sent: float, times: list[float], *, cached: int = 0, prompt: int = 5) -> Stream:
    return Stream(
        sent, times, "x" * len(times), len(times), prompt_tokens=prompt, cached_tokens=cached
    )
