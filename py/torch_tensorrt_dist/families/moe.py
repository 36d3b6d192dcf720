"""The mixture-of-experts family (Mixtral, Qwen2-MoE, Qwen3-MoE): ``ep x tp`` ranks, TP inner,
the layout of ``parallel/moe.py``, each rank's experts and slices read by
``parallel/moe_load.py`` (only its pipeline stage's, when ``families/pipeline.py`` gives the
rank one: ``pp x ep x tp`` ranks)."""

from __future__ import annotations

from pathlib import Path

from torch_tensorrt_dist.config.run import RunConfig
from torch_tensorrt_dist.families.spec import ModelPlan, ModelSpec, Rank, quantize_shard
from torch_tensorrt_dist.models.dtypes import DTYPES
from torch_tensorrt_dist.models.llama import Transformer
from torch_tensorrt_dist.models.moe_args import read_moe_config
from torch_tensorrt_dist.models.weights_check import check_checkpoint
from torch_tensorrt_dist.parallel.moe import moe_layout

__all__ = ["MoESpec"]


class MoESpec(ModelSpec):
    family = "moe"
    refused = {
        "compile": "compile: mixture-of-experts artifacts are not supported yet; run "
        "`torchtrt-dist generate --ep` (or serve) from the checkpoint",
    }

    def __init__(self, path: Path) -> None:  # a MoE model is always a checkpoint
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

    def load(self, rank: Rank, *, progress: bool = False) -> Transformer:
        from torch_tensorrt_dist.parallel.moe import make_moe_mesh, moe_groups
        from torch_tensorrt_dist.parallel.moe_load import load_moe

        config, plan, place = rank.config, rank.plan, rank.stage
        p = plan.parallel
        groups = None
        if place is not None:  # this stage's ep x tp ranks
            groups = moe_groups(place.stage_mesh) if place.layout.width > 1 else None
        elif rank.world > 1:
            groups = moe_groups(make_moe_mesh(p.ep, p.tp or 1))
        model = load_moe(
            self.checkpoint,
            groups=groups,
            dtype=DTYPES[config.model.dtype],
            device=rank.device,
            lm_head=config.model.lm_head,
            embedding=config.model.embedding,
            max_seq_len=plan.args.max_seq_len,
            progress=progress,
            stage=None if place is None else place.role,
        )
        quantize_shard(model, config)
        return model
