"""``eval --perplexity``'s job in a rank: this rank's shard scores the text's sliding windows
(``generation/perplexity.py``); rank 0 prints the perplexity."""

from __future__ import annotations

import json
from typing import cast

from torch_tensorrt_dist.cli._rank import RankJob
from torch_tensorrt_dist.config.jobs import EvalJob
from torch_tensorrt_dist.config.run import RunConfig
from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.families import ModelPlan, ModelSpec, Rank
from torch_tensorrt_dist.models.llama import Transformer

__all__ = ["EvalRankJob"]


class EvalRankJob(RankJob[Transformer]):
    """``eval``'s job in a rank (``start(ns, job_of, EvalRankJob())``)."""

    def check(self, config: RunConfig, spec: ModelSpec, plan: ModelPlan) -> None:
        job = cast(EvalJob, config.job)
        if job.window > plan.args.max_seq_len:
            raise ConfigError(
                f"--window {job.window} exceeds the model's {plan.args.max_seq_len} positions; use "
                "at most that many"
            )

    def build(self, rank: Rank) -> Transformer:
        return rank.model()

    def run(self, rank: Rank, model: Transformer) -> int:
        from torch_tensorrt_dist.generation.perplexity import document_ids, perplexity

        config, job = rank.config, cast(EvalJob, rank.config.job)
        ids = document_ids(job.read(), rank.tokenizer())
        result = perplexity(model, ids, window=job.window, stride=job.stride, engine=config.engine)
        if rank.index != 0:
            return 0
        p, quant = rank.plan.parallel, config.quantize
        summary = {
            "perplexity": result.perplexity,
            "nll": result.nll,
            "tokens": result.tokens,
            "windows": result.windows,
            "seconds": result.seconds,
            "file": job.text,
            "tp": p.tp,
            "ep": p.ep,
            "engine": config.engine,
            "dtype": config.model.dtype,
            "quantize": None if quant is None else quant.to_dict(),
            "threads": rank.threads,
        }
        if job.json:
            print(json.dumps(summary), flush=True)
            return 0
        q = "" if quant is None else f" {quant.describe()}"
        print(
            f"perplexity {result.perplexity:.4f} over {result.tokens} tokens "
            f"({result.windows} windows of {job.window}, stride {job.stride}) "
            f"[tp={p.tp} engine={config.engine} {config.model.dtype}{q}] {result.seconds:.1f} s",
            flush=True,
        )
        return 0
