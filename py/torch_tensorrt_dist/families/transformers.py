"""The transformers family: any causal LM transformers ships, run by its own model class over
our paged KV cache (``models/hf_model.py``), sharded by its own ``base_model_tp_plan``, each
rank's slices read by ``parallel/hf_load.py``.

Chosen for a checkpoint whose ``model_type`` no native family runs, or by
``--model-impl transformers`` (``families/__init__.py``). What it cannot run is refused in
``plan``, before any weight is read: a checkpoint with its own code, an unknown ``model_type``,
layers the paged cache cannot hold, no TP plan for ``--tp`` > 1, heads ``--tp`` does not
divide, a config whose shapes contradict the weights' headers, ``--quantize`` where the TP plan
names no linear it can quantize (``quantization/hf_linears.py``).

``--pp`` runs the model's pipeline stages (``families/pipeline.py`` wraps this spec) where its
class has a ``base_model_pp_plan`` and hands hidden states on unchanged
(``models/hf_stage.check_pipeline``); each stage is sharded by the TP plan over its own TP
group.
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch_tensorrt_dist.config.run import RunConfig
from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.families.spec import ModelPlan, ModelSpec, Rank
from torch_tensorrt_dist.models.dtypes import DTYPES
from torch_tensorrt_dist.models.hf_config import check_runnable, model_args, read_hf_config
from torch_tensorrt_dist.models.hf_model import PagedHFModel
from torch_tensorrt_dist.models.hf_stage import check_pipeline, pp_parts

__all__ = ["TransformersSpec"]


class TransformersSpec(ModelSpec):
    family = "transformers"
    refused: ClassVar[dict[str, str]] = {
        "compile": "the transformers family runs `generate` and `serve`; `compile` does not "
        "package transformers' model class yet: use --model-impl native where it runs the model",
        "eval": "the transformers family runs `generate` and `serve`; `eval --perplexity` does "
        "not score transformers' model class yet: use --model-impl native where it runs the model",
    }

    def read_hf(self) -> Any:
        if self.path is None:
            raise ConfigError(
                "--model-impl transformers needs a checkpoint directory (--model DIR); "
                "the presets are native models"
            )
        return read_hf_config(self.path)

    def plan(self, config: RunConfig) -> ModelPlan:
        self.check_command(config)
        cfg = self.read_hf()
        p, tp = config.parallel, config.parallel.tp or 1
        staged = p.pp > 1 or bool(p.split)
        if p.ep != 1:
            raise ConfigError(
                f"model_type {cfg.model_type!r} runs through transformers with --tp only or "
                "--pp stages (no --ep yet): drop --ep"
            )
        if config.speculative is not None:
            raise ConfigError(
                f"--speculative needs a verify call (every token's logits) that transformers' "
                f"model class ({cfg.model_type!r}) does not have yet: drop --speculative"
            )
        m = config.model
        if (m.lm_head, m.embedding) != ("vocab_parallel", "vocab_parallel"):
            raise ConfigError(
                "--lm-head and --embedding are the model's own TP plan under --model-impl "
                "transformers: drop them"
            )
        check_runnable(cfg, tp=tp)
        from torch_tensorrt_dist.parallel.hf_load import build_meta, check_hf_checkpoint

        assert self.path is not None  # read_hf checked it
        meta = build_meta(cfg, DTYPES[m.dtype])
        if staged:  # its PP plan's parts (refused by name where it has none)
            pp_parts(meta)
        check_hf_checkpoint(self.path, meta)  # headers: no weight
        if config.quantize is not None:
            from torch_tensorrt_dist.quantization.hf_linears import hf_refusal

            reason = hf_refusal(meta, tp, embeddings=config.quantize.embeddings)
            if reason is not None:
                raise ConfigError(f"{cfg.model_type!r}: {reason}")
        if staged:  # a forward that hands hidden states on (run on meta: changes it)
            check_pipeline(meta)
        return self.checkpoint_plan(config, model_args(cfg, tp=tp))

    def load(self, rank: Rank, *, progress: bool = False) -> PagedHFModel:  # type: ignore[override]
        from torch_tensorrt_dist.parallel.hf_load import load_hf

        assert rank.plan.path is not None  # plan checked it
        config, stage = rank.config, rank.stage  # stage: a pipeline stage's (families/pipeline)
        group = rank.group if stage is None else stage.tp_group
        model = load_hf(
            rank.plan.path,
            self.read_hf(),
            group=group,
            dtype=DTYPES[config.model.dtype],
            device=rank.device,
            stage=None if stage is None else stage.role,
        )
        if config.quantize is not None:  # the plan's colwise / rowwise linears, this rank's
            from torch_tensorrt_dist.quantization.hf_linears import quantize_hf

            tp = config.parallel.tp or 1
            quantize_hf(
                model.hf, config.quantize, engine=config.engine, group=group if tp > 1 else None
            )
        return model
