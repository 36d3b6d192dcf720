"""``compile``'s job in a rank: this rank's loaded (and quantized) shard becomes its compiled
graphs and weight file under ``--out`` (``families/compile.py``); rank 0 writes the manifest
and prints where."""

from __future__ import annotations

import json
import logging
import time
from typing import cast

from torch_tensorrt_dist.cli._rank import RankJob
from torch_tensorrt_dist.config.jobs import CompileJob
from torch_tensorrt_dist.config.run import RunConfig
from torch_tensorrt_dist.families import ModelPlan, ModelSpec, Rank
from torch_tensorrt_dist.models.llama import Transformer

__all__ = ["CompileRankJob"]


class CompileRankJob(RankJob[tuple[Transformer, float]]):
    """``compile``'s job in a rank (``start(ns, job_of, CompileRankJob())``)."""

    def check(self, config: RunConfig, spec: ModelSpec, plan: ModelPlan) -> None:
        from torch_tensorrt_dist.artifacts.build import check_output_dir
        from torch_tensorrt_dist.families.compile import check_compile

        check_compile(config, plan)  # engine, quantization, lengths, buckets
        check_output_dir(cast(CompileJob, config.job).out)

    def build(self, rank: Rank) -> tuple[Transformer, float]:
        """This rank's shard, and when its loading started (the compile's time counts it)."""
        import torch

        if not torch.cuda.is_available():  # Inductor's import warns about CUDA_HOME: not our case
            logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
        start = time.perf_counter()
        return rank.model(), start

    def run(self, rank: Rank, built: tuple[Transformer, float]) -> int:
        from torch_tensorrt_dist.families.compile import write_artifacts

        job = cast(CompileJob, rank.config.job)
        result = write_artifacts(rank, built[0], started=built[1])
        if rank.index == 0:
            tp = rank.plan.parallel.tp
            summary = {"manifest": str(result.manifest), "compile_s": result.seconds, "tp": tp}
            if job.json:
                print(json.dumps(summary), flush=True)
            else:
                print(f"wrote {result.manifest} (tp={tp}, {result.seconds:.1f} s)", flush=True)
        return 0
