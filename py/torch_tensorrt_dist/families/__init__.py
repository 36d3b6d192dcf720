"""A spec per model family (dense Llama, mixture of experts, and pipeline stages of either;
compiled artifacts in ``artifacts/spec.py``): each owns reading its configuration, the layout check,
loading a rank's slices and quantizing them (``spec.py`` says what a spec does).

    spec = checkpoint_spec(config)          # the family of --model (or the demo / preset)

``NATIVE_MODEL_TYPES`` says which family runs each ``config.json`` ``model_type``; any other
is refused by name before a weight is read.
"""

from __future__ import annotations

from typing import Any

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
from torch_tensorrt_dist.models.llama_args import DENSE_MODEL_TYPES
from torch_tensorrt_dist.models.moe_args import MOE_MODEL_TYPES

__all__ = [
    "NATIVE_MODEL_TYPES",
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
    "native_family",
    "resolve_model",
]

#: config.json ``model_type`` -> the native family that runs it
NATIVE_MODEL_TYPES: dict[str, str] = {
    **dict.fromkeys(DENSE_MODEL_TYPES, "dense"),
    **dict.fromkeys(MOE_MODEL_TYPES, "moe"),
}


def native_family(cfg: dict[str, Any]) -> str:
    """The native family ("dense" or "moe") of a ``config.json``; ConfigError naming its
    ``model_type`` and the ones the native families run otherwise (no weight read)."""
    kind = cfg.get("model_type", "llama")  # transformers' Llama configs once omitted it
    family = NATIVE_MODEL_TYPES.get(kind) if isinstance(kind, str) else None
    if family is None:
        dense = ", ".join(DENSE_MODEL_TYPES)
        moe = ", ".join(MOE_MODEL_TYPES)
        raise ConfigError(
            f"config.json has model_type={kind!r}, which no native model family runs; they run "
            f"{dense} (dense) and {moe} (mixture of experts); --model-impl auto (the default) "
            "or transformers runs other model types through transformers' own model class"
        )
    return family


def checkpoint_spec(config: RunConfig) -> ModelSpec:
    """The spec of ``--model``'s family: transformers' model class where no native family
    runs its ``model_type`` (or ``--model-impl transformers``); MoE where its ``config.json``
    says so, else dense;
    for ``--pp`` > 1 (or ``--split``), the pipeline stages of that family. ``--ep`` needs a MoE
    model."""
    path, preset = resolve_model(config.model.model)
    p = config.parallel
    spec: ModelSpec
    impl = config.model.model_impl
    if impl == "transformers":
        return TransformersSpec(path)
    if path is not None and (path / "config.json").is_file():
        cfg = load_config_json(path)
        if impl == "auto" and cfg.get("model_type", "llama") not in NATIVE_MODEL_TYPES:
            return TransformersSpec(path)  # no native family runs it: transformers' class does
        family = native_family(cfg)  # --model-impl native: refused by name
    else:  # a preset (or a folder without config.json: the dense reader says so)
        family = "dense"
    if path is not None and family == "moe":
        spec = MoESpec(path)
    elif p.ep != 1:
        raise ConfigError(
            f"--ep {p.ep} needs a mixture-of-experts checkpoint (Mixtral, Qwen2-MoE, Qwen3-MoE); "
            f"{'the default model' if path is None else path} is a dense model: drop --ep"
        )
    else:
        spec = DenseSpec(path, preset)
    return PipelineSpec(spec) if p.pp > 1 or p.split else spec
