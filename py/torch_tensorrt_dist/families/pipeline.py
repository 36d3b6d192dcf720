"""Pipeline stages of a model family: ``pp x tp`` (dense) or ``pp x ep x tp`` (MoE) ranks, the
stage outermost. A stage is the family's own spec (``dense.py``, ``moe.py``: its layout checks,
its loader, its quantization) over this rank's stage (``parallel/pipeline.py``), plus the
transfers at the stage's boundaries (``generation/pipeline.py``); every rank then runs the same
generation core, so ``generate`` and ``serve`` take ``--pp``."""

from __future__ import annotations

from dataclasses import replace

from torch_tensorrt_dist.config.run import RunConfig
from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.families.spec import (
    Draft,
    ModelPlan,
    ModelSpec,
    Rank,
    build_generator,
)
from torch_tensorrt_dist.generation.generate import Generator
from torch_tensorrt_dist.models.llama import Transformer
from torch_tensorrt_dist.parallel.pipeline import StagePlace, split_layers

__all__ = ["PipelineSpec"]


class PipelineSpec(ModelSpec):
    family = "pipeline"
    refused = {
        "compile": "--pp {config.parallel.pp}: pipeline artifacts are not supported yet (a "
        "rank's package is the whole model's paged step, tokens in and logits out; a stage "
        "would take and give hidden states); compile with --tp, or run "
        "`torchtrt-dist generate --pp` / `serve --pp` from the checkpoint",
        "eval": "eval --pp {config.parallel.pp}: pipeline stages are not evaluated yet; use --tp",
    }

    def __init__(self, inner: ModelSpec) -> None:
        super().__init__(inner.path, inner.preset)
        self.inner = inner
        """The family each stage is a part of (dense or MoE)."""

    def plan(self, config: RunConfig) -> ModelPlan:
        """The family's plan (its TP / EP layout, lengths, quantization), and the stages'
        split."""
        self.check_command(config)
        plan = self.inner.plan(config)
        p = plan.parallel
        split_layers(plan.args.n_layers, p.pp, p.split)
        return plan

    def place(self, rank: Rank) -> StagePlace:
        """This rank's stage on a new ``(pp, [ep,] tp)`` mesh (every rank, in the same order)."""
        from torch_tensorrt_dist.parallel.pipeline import make_pipeline_mesh, stage_place

        p = rank.plan.parallel
        ep = p.ep if rank.plan.moe is not None else None
        mesh = make_pipeline_mesh(p.pp, p.tp or 1, ep=ep)
        return stage_place(mesh, rank.plan.args.n_layers, p.split)

    def load(self, rank: Rank, *, progress: bool = False) -> Transformer:
        """This rank's stage: the family's loader over the stage's parts and groups (each
        stage quantizes its own layers)."""
        if rank.plan.parallel.pp == 1:  # one stage (--split N alone): the whole model
            return self.inner.load(rank, progress=progress)
        place = rank.stage if rank.stage is not None else self.place(rank)
        return self.inner.load(replace(rank, stage=place), progress=progress)

    def generator(
        self, rank: Rank, *, rows: int, cache_len: int, progress: bool = False, draft: Draft = None
    ) -> Generator:
        if rank.plan.parallel.pp == 1:
            return self.inner.generator(
                rank, rows=rows, cache_len=cache_len, progress=progress, draft=draft
            )
        if draft is not None:
            raise ConfigError("--speculative runs without --pp (one stage holds every layer)")
        place = self.place(rank)
        model = self.inner.load(replace(rank, stage=place), progress=progress)
        return build_generator(model, rank.config, rows, cache_len, stage=place)
