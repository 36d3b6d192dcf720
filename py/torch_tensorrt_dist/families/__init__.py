"""A spec per model family (dense Llama, mixture of experts, and pipeline stages of either;
compiled artifacts in ``artifacts/spec.py``): each owns reading its configuration, the layout check,
loading a rank's slices and quantizing them (``spec.py`` says what a spec does).

    spec = checkpoint_spec(config)          # the family of --model (or the demo / preset)
"""

from __future__ import annotations

from pathlib import Path

from torch_tensorrt_dist.config.run import RunConfig
from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.families.dense import DenseSpec
from torch_tensorrt_dist.families.moe import MoESpec
from torch_tensorrt_dist.families.pipeline import PipelineSpec
from torch_tensorrt_dist.families.spec import (
    ModelPlan,
    ModelSpec,
    Rank,
    build_generator,
    check_kv_cache,
    resolve_model,
)
from torch_tensorrt_dist.families.transformers import TransformersSpec
from torch_tensorrt_dist.models.checkpoint_files import load_config_json
from torch_tensorrt_dist.models.llama_args import _SUPPORTED_MODEL_TYPES
from torch_tensorrt_dist.models.moe_args import is_moe_config

__all__ = [
    "DenseSpec",
    "MoESpec",
    "ModelPlan",
    "ModelSpec",
    "PipelineSpec",
    "Rank",
    "TransformersSpec",
    "build_generator",
    "check_kv_cache",
    "checkpoint_spec",
    "resolve_model",
]


def checkpoint_spec(config: RunConfig) -> ModelSpec:
    """The spec of ``--model``'s family: transformers' model class where no native family
    runs its ``model_type`` (or ``--model-impl transformers``); MoE where its ``config.json``
    says so, else dense;
    for ``--pp`` > 1 (or ``--split``), the pipeline stages of that family. ``--ep`` needs a MoE
    model."""
    path, preset = resolve_model(config.model.model)
    p = config.parallel
    has_config = path is not None and (path / "config.json").is_file()
    spec: ModelSpec
    if _transformers_impl(config, path if has_config else None):
        return TransformersSpec(path)
    if path is not None and has_config and is_moe_config(load_config_json(path)):
        spec = MoESpec(path)
    elif p.ep != 1:
        raise ConfigError(
            f"--ep {p.ep} needs a mixture-of-experts checkpoint (Mixtral, Qwen2-MoE, Qwen3-MoE); "
            f"{'the default model' if path is None else path} is a dense model: drop --ep"
        )
    else:
        spec = DenseSpec(path, preset)
    return PipelineSpec(spec) if p.pp > 1 or p.split else spec


def _transformers_impl(config: RunConfig, path: Path | None) -> bool:
    """Whether transformers' model class runs ``--model``: ``--model-impl transformers``, or
    ``auto`` with a ``config.json`` whose ``model_type`` no native family runs."""
    impl = config.model.model_impl
    if impl != "auto" or path is None:
        return impl == "transformers"
    cfg = load_config_json(path)
    return not (is_moe_config(cfg) or cfg.get("model_type") in _SUPPORTED_MODEL_TYPES)
