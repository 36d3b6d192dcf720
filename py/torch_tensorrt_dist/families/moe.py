"""The mixture-of-experts family (Mixtral, Qwen2-MoE, Qwen3-MoE): ``ep x tp`` ranks, TP inner,
the layout of ``parallel/moe.py``, each rank's experts and slices read by the generic loader
(``parallel/sharded_load.py``) with the names and slices of ``parallel/moe_load.py`` (only its
pipeline stage's, when ``families/pipeline.py`` gives the rank one: ``pp x ep x tp`` ranks)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from torch_tensorrt_dist.config.run import RunConfig
from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.families.spec import ModelPlan, ModelSpec, Rank
from torch_tensorrt_dist.models.moe_args import MOE_MODEL_TYPES, read_moe_config
from torch_tensorrt_dist.models.weights_check import check_checkpoint
from torch_tensorrt_dist.parallel.moe import moe_layout

if TYPE_CHECKING:
    from torch_tensorrt_dist.parallel.moe_load import MoEShards

__all__ = ["MoESpec"]


class MoESpec(ModelSpec):
    family = "moe"
    model_types = tuple(MOE_MODEL_TYPES)
    describe = "mixture of experts"
    expert_parallel = True
    refused = {
        "compile": "compile: mixture-of-experts artifacts are not supported yet; run "
        "`torchtrt-dist generate --ep` (or serve) from the checkpoint",
    }

    def __init__(self, path: Path | None, preset: str | None = None) -> None:
        if path is None:
            raise ConfigError("a mixture-of-experts model is a checkpoint (--model DIR)")
        super().__init__(path, None)
        self.checkpoint = path

    def plan(self, config: RunConfig) -> ModelPlan:
        self.check_command(config)
        p, layout = config.parallel, config.model
        args, moe = read_moe_config(self.checkpoint)
        check_checkpoint(self.checkpoint, args, moe)
        moe_layout(
            args,
            moe,
            ep=p.ep,
            tp=p.tp or 1,
            lm_head=layout.lm_head,
            embedding=layout.embedding,
        )
        return self.checkpoint_plan(config, args, moe=moe)

    def shards(self, rank: Rank) -> MoEShards:
        from torch_tensorrt_dist.parallel.moe import make_moe_mesh, moe_groups
        from torch_tensorrt_dist.parallel.moe_load import MoEShards

        plan, place, layout = rank.plan, rank.stage, rank.config.model
        p = plan.parallel
        groups = None
        if place is not None:  # this stage's ep x tp ranks
            groups = moe_groups(place.stage_mesh) if place.layout.width > 1 else None
        elif rank.world > 1:
            groups = moe_groups(make_moe_mesh(p.ep, p.tp or 1))
        assert plan.moe is not None  # plan read it
        shards = MoEShards(plan.args, plan.moe, lm_head=layout.lm_head, embedding=layout.embedding)
        return shards if groups is None else replace(shards, groups=groups)
