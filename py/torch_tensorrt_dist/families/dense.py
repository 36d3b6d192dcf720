"""The dense Llama family (Llama 2/3, Mistral, Qwen2, Qwen3): ``config.json`` or a preset, the TP
layout of ``parallel/llama.py``, each rank's slices read by ``parallel/llama_load.py`` (only
its pipeline stage's, when ``families/pipeline.py`` gives the rank one)."""

from __future__ import annotations

from torch_tensorrt_dist.config.run import RunConfig
from torch_tensorrt_dist.families.spec import ModelPlan, ModelSpec, Rank, quantize_shard
from torch_tensorrt_dist.models.dtypes import DTYPES
from torch_tensorrt_dist.models.llama import Transformer
from torch_tensorrt_dist.models.llama_args import ModelArgs, read_config
from torch_tensorrt_dist.models.weights_check import check_checkpoint
from torch_tensorrt_dist.parallel.llama import tp_layout

__all__ = ["DenseSpec"]


class DenseSpec(ModelSpec):
    family = "dense"

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

    def load(self, rank: Rank, *, progress: bool = False) -> Transformer:
        from torch_tensorrt_dist.parallel.llama_load import load_llama, random_llama

        config, plan, place = rank.config, rank.plan, rank.stage
        dtype, layout = DTYPES[config.model.dtype], config.model
        group = rank.group if place is None else place.tp_group
        stage = None if place is None else place.role
        if plan.path is not None:
            model = load_llama(
                plan.path,
                group=group,
                dtype=dtype,
                device=rank.device,
                lm_head=layout.lm_head,
                embedding=layout.embedding,
                max_seq_len=plan.args.max_seq_len,
                progress=progress,
                stage=stage,
            )
        else:
            model = random_llama(
                plan.args,
                seed=0,
                group=group,
                dtype=dtype,
                lm_head=layout.lm_head,
                embedding=layout.embedding,
                stage=stage,
            ).to(rank.device)
        quantize_shard(model, config)
        return model
