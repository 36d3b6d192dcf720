"""A spec per model family (dense Llama, mixture of experts, a toy parallel-block decoder,
pipeline stages of any, transformers' own classes, compiled artifacts: ``artifacts.py``):
each owns reading its configuration, the layout check, loading a rank's slices and quantizing
them (``spec.py`` says what a spec does).

    spec = checkpoint_spec(config)          # the family of --model (or the demo / preset)
    rank = rank_for(config, index=0, world=1)   # a rank of it, as rank_main builds one

Every module of this package is imported here, so a family is its spec module alone: a spec
class naming ``model_types`` runs them (``MODEL_TYPES``); any other ``model_type`` is refused by
name before a weight is read (or runs through transformers' class, ``--model-impl``).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING, Any

from torch_tensorrt_dist.config.run import RunConfig
from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.families.dense import DenseSpec
from torch_tensorrt_dist.families.moe import MoESpec
from torch_tensorrt_dist.families.pipeline import PipelineSpec
from torch_tensorrt_dist.families.spec import (
    MODEL_TYPES,
    ModelPlan,
    ModelSpec,
    Rank,
    build_generator,
    check_kv_cache,
    resolve_model,
)
from torch_tensorrt_dist.families.transformers import TransformersSpec
from torch_tensorrt_dist.models.checkpoint_files import load_config_json

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

__all__ = [
    "MODEL_TYPES",
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
    "native_spec",
    "rank_for",
    "resolve_model",
]

for _module in pkgutil.iter_modules(__path__):  # each family's spec registers its model_types
    importlib.import_module(f"{__name__}.{_module.name}")

#: config.json ``model_type`` -> the native family that runs it
NATIVE_MODEL_TYPES: dict[str, str] = {kind: spec.family for kind, spec in MODEL_TYPES.items()}


def native_spec(cfg: dict[str, Any]) -> type[ModelSpec]:
    """The spec of the native family that runs a ``config.json``'s ``model_type``; ConfigError
    naming it and the ones the native families run otherwise (no weight read)."""
    kind = cfg.get("model_type", "llama")  # transformers' Llama configs once omitted it
    family = MODEL_TYPES.get(kind) if isinstance(kind, str) else None
    if family is None:
        specs = list(dict.fromkeys(MODEL_TYPES.values()))
        runs = [f"{', '.join(spec.model_types)} ({spec.describe})" for spec in specs]
        raise ConfigError(
            f"config.json has model_type={kind!r}, which no native model family runs; they run "
            f"{', '.join(runs[:-1])} and {runs[-1]}; --model-impl auto (the default) "
            "or transformers runs other model types through transformers' own model class"
        )
    return family


def checkpoint_spec(config: RunConfig) -> ModelSpec:
    """The spec of ``--model``'s family: transformers' model class where no native family
    runs its ``model_type`` (or ``--model-impl transformers``); else the native family that
    names it (a preset: dense); for ``--pp`` > 1 (or ``--split``), the pipeline stages of that
    family. ``--ep`` needs a family whose experts it splits."""
    path, preset = resolve_model(config.model.model)
    p = config.parallel
    impl = config.model.model_impl
    # a preset, or a folder without config.json (the dense reader says so): dense
    family: type[ModelSpec] = DenseSpec
    staged = p.pp > 1 or bool(p.split)
    if impl == "transformers":
        return PipelineSpec(TransformersSpec(path)) if staged else TransformersSpec(path)
    if path is not None and (path / "config.json").is_file():
        cfg = load_config_json(path)
        if impl == "auto" and cfg.get("model_type", "llama") not in NATIVE_MODEL_TYPES:
            # no native family runs it: transformers' class does (its stages for --pp)
            return PipelineSpec(TransformersSpec(path)) if staged else TransformersSpec(path)
        family = native_spec(cfg)  # --model-impl native: refused by name
    if p.ep != 1 and not family.expert_parallel:
        raise ConfigError(
            f"--ep {p.ep} needs a mixture-of-experts checkpoint (Mixtral, Qwen2-MoE, Qwen3-MoE); "
            f"{'the default model' if path is None else path} is a {family.describe} model: "
            "drop --ep"
        )
    spec = family(path, preset)
    return PipelineSpec(spec) if staged else spec


def rank_for(
    config: RunConfig,
    *,
    index: int = 0,
    world: int = 1,
    device: torch.device | str = "cpu",
    group: dist.ProcessGroup | None = None,
) -> Rank:
    """This process's rank of ``config`` (planned by its family): what ``rank_main`` builds,
    for code that joined the world itself (the benchmarks, the tests)."""
    spec = checkpoint_spec(config)
    plan = spec.plan(config)
    return Rank(config.with_(parallel=plan.parallel), spec, plan, index, world, device, group)
