"""The serving benchmark's in-process parts: the decode step against the reserved cache, KV
bytes per live token, and ``generate``'s decode speed (issue 27).

    times = decode_step_times(path, caches=(256, 1024, 4096), live=33)   # {(L, rows): s}
    kv_bytes_per_live_token(layout, live=33, cache_len=4096)              # paged, static
    generate_decode(path, prompt, env=...)                                # {"tokens_per_s": ...}

The decode step: one ``Generator(model, engine="inductor", max_batch_size=8, cache_len=L)`` per
cache length L (each its own copy of the model, as ``setup_paged`` sizes the model's block
pools), then rounds that time a few steps of each in turn (8 rows, then 1 row, every row at
``live`` tokens: ``live - 1`` in its blocks and the one it decodes), so that a loaded machine
slows all of them alike. A step here is what the core does per step: its inputs built, one call
of the compiled graph.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.kv_blocks import blocks_for
from torch_tensorrt_dist.generation.kv_memory import KVLayout

__all__ = ["decode_step_times", "generate_decode", "kv_bytes_per_live_token"]


def kv_bytes_per_live_token(layout: KVLayout, *, live: int, cache_len: int) -> tuple[float, float]:
    """KV bytes a sequence of ``live`` tokens holds per live token: in the paged cache (whole
    blocks), and in a static cache of ``cache_len`` tokens per row (the old core's)."""
    paged = blocks_for(live, layout.block_size) * layout.bytes_per_block
    return paged / live, cache_len * layout.bytes_per_token / live


def decode_step_times(
    path: str | Path,
    *,
    caches: Sequence[int] = (256, 1024, 4096),
    rows: Sequence[int] = (8, 1),
    live: int = 33,
    rounds: int = 5,
    steps: int = 10,
) -> dict[tuple[int, int], float]:
    """Median seconds of a decode step, by (cache length, rows), every row at ``live`` tokens
    (see the module docstring). Runs with one torch thread, as a server's rank does."""
    import torch

    from torch_tensorrt_dist.generation.generate import Generator
    from torch_tensorrt_dist.generation.step_inputs import step_inputs
    from torch_tensorrt_dist.parallel.llama_load import load_llama

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gens = {
            c: Generator(
                load_llama(path, progress=False),
                engine="inductor",
                max_batch_size=max(rows),
                cache_len=c,
            )
            for c in caches
        }
        calls = {}
        for (c, gen), r in ((g, r) for g in gens.items() for r in rows):
            n = blocks_for(live, gen.block_size)
            spans = [([1], live - 1, list(range(1 + i * n, 1 + (i + 1) * n))) for i in range(r)]

            def call(gen: Any = gen, spans: Any = spans) -> None:
                gen._step(*step_inputs(spans, gen.limits, gen.device))

            call()  # compiles this shape
            calls[c, r] = call
        times: dict[tuple[int, int], list[float]] = {key: [] for key in calls}
        with torch.no_grad():
            for _ in range(rounds):
                for key, call in calls.items():
                    for _ in range(steps):
                        start = time.perf_counter()
                        call()
                        times[key].append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(saved)
    return {key: statistics.median(t) for key, t in times.items()}


def generate_decode(
    path: str | Path,
    prompt: str,
    *,
    max_new_tokens: int,
    options: Sequence[str],
    env: dict[str, str],
) -> dict[str, Any]:
    """``torchtrt-dist generate --json`` on one prompt (TP 1, one thread, Inductor): its JSON
    (``tokens_per_s``: decode tokens/s, ``text``)."""
    cmd = [
        sys.executable,
        "-m",
        "torch_tensorrt_dist",
        "generate",
        "--model",
        str(path),
        "--engine",
        "inductor",
        "--threads",
        "1",
        "--max-new-tokens",
        str(max_new_tokens),
        "--prompt",
        prompt,
        "--json",
        *options,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise ConfigError(f"generate failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return dict(json.loads(lines[-1]))
