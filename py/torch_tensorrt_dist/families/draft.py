"""``--speculative draft --draft-model PATH``: the draft model's plan, checks and shard.

The draft is planned and loaded as the target is (``checkpoint_spec``: its family from its
``config.json``; the family's sharded loader over the rank's group, the same TP), so every
rank holds its slice of the draft beside its slice of the target. Before any weight is read
(:func:`check_draft_plan`, with the command's other checks) a draft with another vocabulary
or tokenizer than the target's, or with more bytes of weights, is refused naming the option.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from torch_tensorrt_dist.errors import ConfigError

if TYPE_CHECKING:
    from torch_tensorrt_dist.config.run import RunConfig
    from torch_tensorrt_dist.families.spec import ModelPlan, ModelSpec, Rank
    from torch_tensorrt_dist.models.llama import Transformer

__all__ = ["DRAFT_FAMILIES", "check_draft_plan", "draft_model"]

#: the families whose model a draft may be (the native decoders, tested: dense)
DRAFT_FAMILIES = ("dense", "moe")


def _draft_config(config: RunConfig) -> RunConfig | None:
    spec = config.speculative
    if spec is None or spec.method != "draft":
        return None
    if spec.draft_model is None:
        raise ConfigError("--speculative draft needs --draft-model PATH")
    return config.with_(model=replace(config.model, model=spec.draft_model))


def _plan(config: RunConfig) -> tuple[ModelSpec, ModelPlan]:
    """The draft's native family (the spec its ``config.json``'s ``model_type`` registered
    in ``MODEL_TYPES``; a preset: dense) and its plan; a model type no native family runs is
    refused here (a draft runs in :data:`DRAFT_FAMILIES`)."""
    from torch_tensorrt_dist.families.spec import MODEL_TYPES, resolve_model
    from torch_tensorrt_dist.models.checkpoint_files import load_config_json

    path, preset = resolve_model(config.model.model)
    kind = "llama"  # a preset, or a folder without config.json: the dense reader's
    if path is not None and (path / "config.json").is_file():
        kind = load_config_json(path).get("model_type", "llama")
    family = MODEL_TYPES.get(kind) if isinstance(kind, str) else None
    if family is None or family.family not in DRAFT_FAMILIES:
        raise ConfigError(
            f"its model_type {kind!r} runs in no native family that drafts; a draft model "
            f"runs in the {' or '.join(DRAFT_FAMILIES)} family (Llama, Qwen, Mistral, Mixtral ...)"
        )
    spec = family(path, preset)
    return spec, spec.plan(config)


def _weight_bytes(path: Path | None) -> int | None:
    if path is None:
        return None
    files = list(path.glob("*.safetensors")) or list(path.glob("*.bin"))
    return sum(f.stat().st_size for f in files) or None


def _tokenizer(plan: ModelPlan) -> bytes | None:
    """The model's ``tokenizer.json`` (None: it has none)."""
    if plan.tokenizer_dir is None or not (plan.tokenizer_dir / "tokenizer.json").is_file():
        return None
    return (plan.tokenizer_dir / "tokenizer.json").read_bytes()


def check_draft_plan(config: RunConfig, plan: ModelPlan) -> None:
    """Refuse a draft model (``--draft-model``) that cannot draft for the target of ``plan``:
    another vocabulary size or tokenizer, more bytes of weights, another layout. Reads the
    draft's ``config.json`` and files' sizes only."""
    draft_config = _draft_config(config)
    if draft_config is None:
        return
    try:
        spec, draft = _plan(draft_config)
    except ConfigError as exc:
        raise ConfigError(f"--draft-model {draft_config.model.model}: {exc}") from exc
    if spec.family not in DRAFT_FAMILIES:
        raise ConfigError(
            f"--draft-model {draft.source} runs in the {spec.family} family; a draft model "
            f"runs in the {' or '.join(DRAFT_FAMILIES)} family (Llama, Qwen, Mistral, Mixtral ...)"
        )
    if draft.args.vocab_size != plan.args.vocab_size:
        raise ConfigError(
            f"--draft-model {draft.source} has a vocabulary of {draft.args.vocab_size} tokens, "
            f"the target {plan.args.vocab_size}: a draft model needs the target's tokenizer"
        )
    mine, theirs = _tokenizer(plan), _tokenizer(draft)
    if mine is not None and theirs is not None and mine != theirs:
        raise ConfigError(
            f"--draft-model {draft.source} has another tokenizer.json than the target's: "
            "a draft model needs the target's tokenizer"
        )
    big, small = _weight_bytes(plan.path), _weight_bytes(draft.path)
    if big is not None and small is not None and small > big:
        raise ConfigError(
            f"--draft-model {draft.source} is larger than the target ({small:,} bytes of "
            f"weights, the target {big:,}): a draft model is a smaller one"
        )
    if draft.parallel != plan.parallel:
        raise ConfigError(
            f"--draft-model {draft.source} does not split as the target does "
            f"({draft.parallel} vs {plan.parallel})"
        )


def draft_model(rank: Rank, *, progress: bool = False) -> Transformer | None:
    """This rank's shard of the draft model (None without ``--speculative draft``), loaded by
    its family's loader over the rank's group."""
    from torch_tensorrt_dist.families.spec import Rank

    draft_config = _draft_config(rank.config)
    if draft_config is None:
        return None
    spec, plan = _plan(draft_config)
    config = draft_config.with_(parallel=plan.parallel, speculative=None)
    draft = Rank(config, spec, plan, rank.index, rank.world, rank.device, rank.group)
    return draft.model(progress=progress)
