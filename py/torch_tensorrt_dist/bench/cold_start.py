"""Cold start: generating from compiled artifacts vs compiling from the checkpoint, same run.

On 2 gloo ranks with the demo checkpoint (or the ``tiny`` preset where it is absent), each
rank times (a) the usual start: read its shard of the checkpoint, compile the step graphs a
prompt needs with the Inductor engine (``torch.compile``: prefill and decode of one row), run
one prefill and one decode step; then (b) builds the artifacts once (``compile_artifacts``: one
AOTInductor package for every step); then (c) a start from them: ``load_generator`` (manifest
checks, file hashes, shard, packages) and the same two steps.
Both starts generate the same prompt; the tokens are compared.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from torch_tensorrt_dist.bench.common import Figure

__all__ = ["cold_start"]

PROMPT = [1, 17, 42, 5, 9, 33, 7]
NEW = 8
MAX_SEQ = 64


def _model() -> str:
    try:
        from torch_tensorrt_dist.models.demo import demo_checkpoint_path

        return str(demo_checkpoint_path())
    except Exception:  # no demo checkpoint in this install
        return "tiny"


def _rank(rank: int, world: int, model: str, out: str) -> dict[str, Any]:
    import torch.distributed as dist

    from torch_tensorrt_dist.artifacts import load_generator
    from torch_tensorrt_dist.bench.common import bench_rank
    from torch_tensorrt_dist.families.compile import compile_artifacts

    dist.barrier()
    start = time.perf_counter()
    built_rank = bench_rank(model, engine="inductor", rank=rank, world=world)
    gen = built_rank.generator(rows=1, cache_len=MAX_SEQ)
    gen.warmup(len(PROMPT), NEW)  # prefill and decode graphs compiled: ready to serve
    ckpt_s = time.perf_counter() - start
    ckpt_tokens = gen.generate([PROMPT], max_new_tokens=NEW).tokens
    del gen

    built = compile_artifacts(model, out, max_seq_len=MAX_SEQ, max_batch_size=1)
    dist.barrier()
    start = time.perf_counter()
    loaded = load_generator(out)
    loaded.warmup(len(PROMPT), NEW)  # the same first calls as above
    art_s = time.perf_counter() - start
    art_tokens = loaded.generate([PROMPT], max_new_tokens=NEW).tokens
    return {
        "ckpt_s": ckpt_s,
        "art_s": art_s,
        "load_s": loaded.runner.load_s,
        "build_s": built.seconds,
        "same": ckpt_tokens == art_tokens,
    }


def cold_start() -> list[Figure]:
    from torch_tensorrt_dist.testing import run_on_ranks

    model = _model()
    with tempfile.TemporaryDirectory(prefix="torchtrt-artifacts-") as tmp:
        res = run_on_ranks(_rank, 2, model, str(Path(tmp) / "a"), timeout=900)
    ckpt = max(r["ckpt_s"] for r in res)
    art = max(r["art_s"] for r in res)
    speedup = ckpt / art if art > 0 else float("inf")
    name = Path(model).name if model != "tiny" else "preset tiny"
    return [
        Figure(
            "cold start",
            f"tp 2 {name}: compile from checkpoint / start from artifacts",
            round(speedup, 1),
            "x",
            goal=">= 5x",
            met=speedup >= 5,
            note=f"checkpoint + compile {ckpt:.1f} s, artifacts {art:.2f} s (load "
            f"{max(r['load_s'] for r in res):.2f} s); built once in "
            f"{max(r['build_s'] for r in res):.0f} s",
        ),
        Figure(
            "cold start",
            "same greedy tokens from artifacts and from the checkpoint",
            all(r["same"] for r in res),
            goal="True",
            met=all(r["same"] for r in res),
        ),
    ]
