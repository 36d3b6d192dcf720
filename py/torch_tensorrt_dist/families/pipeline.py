"""Pipeline stages of a dense model: ``pp x tp`` ranks, TP inner; each stage holds its layers
(``parallel/pipeline.py``) and loads them itself (``parallel/pipeline_load.py``) when its
generator (``generation/pipeline.py``) starts. Only ``generate`` runs them yet."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch_tensorrt_dist.config.jobs import GenerateJob
from torch_tensorrt_dist.config.run import RunConfig
from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.families.dense import DenseSpec
from torch_tensorrt_dist.families.spec import ModelPlan, Rank
from torch_tensorrt_dist.generation.sampling import SamplingConfig
from torch_tensorrt_dist.models.dtypes import DTYPES
from torch_tensorrt_dist.models.llama import Transformer
from torch_tensorrt_dist.parallel.llama import tp_layout
from torch_tensorrt_dist.parallel.pipeline import check_mesh, split_layers

__all__ = ["PipelineSpec"]


class PipelineSpec(DenseSpec):
    family = "pipeline"
    refused = {
        "serve": "serve --pp {config.parallel.pp}: pipeline parallel serving is not supported "
        "yet; serve with --tp (and --ep for MoE)",
        "compile": "--pp {config.parallel.pp}: pipeline artifacts are not supported yet; compile "
        "with --tp only, or run `torchtrt-dist generate --pp` from the checkpoint",
        "eval": "eval --pp {config.parallel.pp}: pipeline stages are not evaluated yet; use --tp",
    }

    def plan(self, config: RunConfig) -> ModelPlan:
        self.check_command(config)
        args = self.read_args()
        p, layout = config.parallel, config.model
        tp = p.tp or 1
        tp_layout(args, 0, tp, layout.lm_head, layout.embedding)
        plan = self.checkpoint_plan(config, args)
        if config.quantize is not None:
            raise ConfigError("--quantize with --pp is not supported yet; quantize with --tp only")
        check_mesh(p.pp, tp, p.pp * tp, args)
        split_layers(args.n_layers, p.pp, p.split)
        return plan

    def load(self, rank: Rank, *, progress: bool = False) -> Transformer:
        raise ConfigError("a pipeline stage is loaded by its generator, not alone")

    def generator(self, rank: Rank, *, rows: int, cache_len: int, progress: bool = False) -> Any:
        return PipelineGeneration(rank, cache_len)


class PipelineGeneration:
    """``generate_pipeline`` behind the calls the ``generate`` job makes of a generator: each
    stage loads its layers and warms up inside it."""

    def __init__(self, rank: Rank, cache_len: int) -> None:
        self.rank, self.cache_len = rank, cache_len
        self.engine = rank.config.engine

    def warmup(self, *sizes: int) -> None:
        return None  # generate_pipeline compiles (and warms up) every stage itself

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        sampling: SamplingConfig,
        stop_ids: Sequence[int],
        on_step: Callable[[list[int]], None] | None,
    ) -> Any:
        from torch_tensorrt_dist.generation.pipeline import generate_pipeline

        config, plan = self.rank.config, self.rank.plan
        job = config.job
        p = plan.parallel
        return generate_pipeline(
            plan.path or plan.args,
            prompts,
            pp=p.pp,
            tp=p.tp or 1,
            engine=config.engine,
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            stop_ids=stop_ids,
            split=list(p.split) if p.split else None,
            dtype=DTYPES[config.model.dtype],
            lm_head=config.model.lm_head,
            embedding=config.model.embedding,
            cache_len=self.cache_len,
            warmup=job.warmup if isinstance(job, GenerateJob) else True,
            microbatches=p.microbatches,
            on_step=on_step,
            verify=config.verify,
        )
