"""Functions the pipeline tests run in spawned gloo ranks (importable by the spawned processes)."""

from __future__ import annotations

from typing import Any

import torch


def pipeline_suite(rank: int, world: int, jobs: list[dict[str, Any]]) -> list[Any]:
    """Run each job (``generate_pipeline`` keyword arguments, or an expected error) on this rank.

    A job ``{"expect_error": True, ...}`` returns the error's type and message instead of tokens.
    """
    from torch_tensorrt_dist.backend import recording
    from torch_tensorrt_dist.errors import TensorRTDistError
    from torch_tensorrt_dist.generation import SamplingConfig
    from torch_tensorrt_dist.generation.pipeline import generate_pipeline

    out: list[Any] = []
    for job in jobs:
        job = dict(job)
        expect_error = job.pop("expect_error", False)
        prompts = job.pop("prompts")
        sampling = job.pop("sampling", None)
        if sampling is not None:
            job["sampling"] = SamplingConfig(**sampling)
        torch._dynamo.reset()
        try:
            with recording() as graphs:
                res = generate_pipeline(job.pop("path"), prompts, warmup=False, **job)
        except TensorRTDistError as exc:
            if not expect_error:
                raise
            out.append({"error": type(exc).__name__, "message": str(exc)})
            continue
        out.append(
            {
                "tokens": res.tokens,
                "steps": res.decode_steps,
                "graphs": len(graphs),
                "collective_groups": sorted(
                    {tuple(c.group_ranks) for g in graphs for c in g.collectives}
                ),
            }
        )
    return out
