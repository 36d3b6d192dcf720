"""Functions the pipeline tests run in spawned gloo ranks (importable by the spawned processes)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch


def _stage_generator(job: dict[str, Any]) -> Any:
    """This rank's stage of ``job["path"]`` on a ``(pp, [ep,] tp)`` mesh of the world, and its
    ``PipelineGenerator`` (``job["gen"]``: the generator's options; ``quantize``: int8)."""
    import torch.distributed as dist

    from torch_tensorrt_dist.generation.pipeline import PipelineGenerator
    from torch_tensorrt_dist.parallel.pipeline import make_pipeline_mesh, stage_place

    pp, ep = job["pp"], job.get("ep")
    tp = job.get("tp") or dist.get_world_size() // (pp * (ep or 1))
    mesh = make_pipeline_mesh(pp, tp, ep=ep)
    if ep is None:
        from torch_tensorrt_dist.models.llama_args import read_config
        from torch_tensorrt_dist.parallel.llama_load import load_llama

        place = stage_place(mesh, read_config(job["path"]).n_layers, job.get("split"))
        model = load_llama(job["path"], group=place.tp_group, stage=place.role, progress=False)
    else:
        from torch_tensorrt_dist.models.moe_args import read_moe_config
        from torch_tensorrt_dist.parallel.moe import moe_groups
        from torch_tensorrt_dist.parallel.moe_load import load_moe

        place = stage_place(mesh, read_moe_config(job["path"])[0].n_layers, job.get("split"))
        groups = moe_groups(place.stage_mesh) if place.layout.width > 1 else None
        model = load_moe(job["path"], groups=groups, stage=place.role, progress=False)
    if job.get("quantize"):
        from torch_tensorrt_dist.quantization import QuantConfig, quantize_model

        quantize_model(model, QuantConfig(job["quantize"]), engine=job.get("engine", "none"))
    opts = {"engine": job.get("engine", "none"), **job.get("gen", {})}
    blocks = opts.pop("kv_blocks", None)
    if blocks is not None:  # a pool of that many blocks on every rank (the deepest stage's)
        from torch_tensorrt_dist.generation.kv_memory import kv_layout

        opts["kv_cache_memory"] = blocks * kv_layout(model, opts["block_size"]).bytes_per_block
    return PipelineGenerator(model, place, **opts)


def pipeline_suite(rank: int, world: int, jobs: list[dict[str, Any]]) -> list[Any]:
    """Run each job on this rank: ``generate`` of its prompts, or (``schedule``) a scripted
    serving schedule (``_core_fns.run_schedule``); a job ``{"expect_error": True, ...}`` returns
    the error's type and message instead."""
    from torch_tensorrt_dist.backend import recording
    from torch_tensorrt_dist.errors import TensorRTDistError
    from torch_tensorrt_dist.generation import SamplingConfig

    from ._core_fns import Job, run_schedule

    out: list[Any] = []
    for job in jobs:
        torch._dynamo.reset()
        try:
            with recording() as graphs:
                gen = _stage_generator(job)
                if "schedule" in job:
                    result = run_schedule(
                        gen, [Job(**j) for j in job["schedule"]], tuple(job.get("stop_ids", ()))
                    )
                    result["pool"] = asdict(result["pool"])
                else:
                    res = gen.generate(
                        job["prompts"],
                        max_new_tokens=job["max_new_tokens"],
                        sampling=SamplingConfig(**job.get("sampling", {})),
                        stop_ids=job.get("stop_ids", ()),
                    )
                    result = {"tokens": res.tokens, "steps": res.decode_steps}
        except TensorRTDistError as exc:
            if not job.get("expect_error"):
                raise
            out.append({"error": type(exc).__name__, "message": str(exc)})
            continue
        result["graphs"] = len(graphs)  # fullgraph=True: a graph break would have raised
        result["in_place"] = all(w.in_place for g in graphs for w in g.input_writes)
        result["collective_groups"] = sorted(
            {tuple(c.group_ranks) for g in graphs for c in g.collectives}
        )
        out.append(result)
    return out
