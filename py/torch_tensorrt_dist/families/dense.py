"""The dense Llama family (Llama 2/3, Mistral, Qwen2, Qwen3): ``config.json`` or a preset, the TP
layout of ``parallel/llama.py``, each rank's slices read by the generic loader
(``parallel/sharded_load.py``) with the names and slices of ``parallel/llama_load.py`` (only its
pipeline stage's, when ``families/pipeline.py`` gives the rank one)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch_tensorrt_dist.config.run import RunConfig
from torch_tensorrt_dist.families.spec import ModelPlan, ModelSpec, Rank
from torch_tensorrt_dist.models.llama_args import DENSE_MODEL_TYPES, ModelArgs, read_config
from torch_tensorrt_dist.models.weights_check import check_checkpoint
from torch_tensorrt_dist.parallel.llama import tp_layout

if TYPE_CHECKING:
    from torch_tensorrt_dist.parallel.llama_load import DenseShards

__all__ = ["DenseSpec"]


class DenseSpec(ModelSpec):
    family = "dense"
    model_types = DENSE_MODEL_TYPES
    describe = "dense"

    def read_args(self) -> ModelArgs:
        """``config.json`` checked against the weights' headers (no tensor read), or the
        preset's."""
        if self.path is None:
            return ModelArgs.from_name(self.preset or "tiny")
        args = read_config(self.path)
        check_checkpoint(self.path, args)  # names, shapes, layers, dtypes: before allocating
        return args

    def plan(self, config: RunConfig) -> ModelPlan:
        self.check_command(config)
        args = self.read_args()
        p = config.parallel
        tp_layout(args, 0, p.tp or 1, config.model.lm_head, config.model.embedding)
        return self.checkpoint_plan(config, args)

    def shards(self, rank: Rank) -> DenseShards:
        from torch_tensorrt_dist.parallel.llama_load import DenseShards

        place, layout = rank.stage, rank.config.model
        group = rank.group if place is None else place.tp_group
        return DenseShards(rank.plan.args, group, layout.lm_head, layout.embedding)
