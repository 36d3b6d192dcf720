"""What every model family's spec does, and the rank it builds for.

    spec = spec_for(config)                      # the family of --model / --artifacts
    plan = spec.plan(config)                     # config.json, layout, quantization: no weights
    rank = Rank(config, spec, plan, index=0, world=1)
    model = spec.load(rank)                      # this rank's slices, quantized
    gen = spec.generator(rank, rows=8, cache_len=2048)

``plan`` runs in the launching process (bad input is refused before any rank starts) and again
in every rank; ``load`` and ``generator`` in the ranks only. :func:`build_generator` is the one
place a rank's :class:`Generator` is made from a loaded model.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from torch_tensorrt_dist.config.run import Parallel, RunConfig
from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.generate import Generator
from torch_tensorrt_dist.models.llama import Transformer
from torch_tensorrt_dist.models.llama_args import PRESETS, ModelArgs
from torch_tensorrt_dist.models.moe_args import MoEArgs
from torch_tensorrt_dist.models.tokenizer import Tokenizer, load_tokenizer
from torch_tensorrt_dist.quantization.scheme import check_engine_group, check_group_slices

if TYPE_CHECKING:
    import torch.distributed as dist

    from torch_tensorrt_dist.artifacts.manifest import Manifest
    from torch_tensorrt_dist.parallel.pipeline import StagePlace
    from torch_tensorrt_dist.parallel.sharded_load import Shards

__all__ = [
    "MODEL_TYPES",
    "ModelPlan",
    "ModelSpec",
    "Prompts",
    "Rank",
    "build_generator",
    "check_kv_cache",
    "check_max_seq_len",
    "check_prompt_ids",
    "model_salt",
    "quantize_shard",
    "resolve_model",
]

logger = logging.getLogger(__name__)

Prompts = Sequence[Sequence[int]]
"""A batch of token-id prompts."""


def resolve_model(model: str | Path | None) -> tuple[Path | None, str | None]:
    """``--model`` as (checkpoint directory, None) or (None, preset name); None means the demo
    checkpoint, or the ``tiny`` preset where the demo is not installed."""
    if model is None:
        try:
            from torch_tensorrt_dist.models.demo import demo_checkpoint_path

            return demo_checkpoint_path(), None
        except (ImportError, ConfigError) as exc:
            logger.info("no demo checkpoint (%s); using the 'tiny' preset with random weights", exc)
            return None, "tiny"
    if Path(model).is_dir():
        return Path(model), None
    if str(model) in PRESETS:
        return None, str(model)
    raise ConfigError(
        f"--model {str(model)!r} is neither a checkpoint directory nor a preset "
        f"({', '.join(sorted(PRESETS))})"
    )


def check_prompt_ids(prompts: Sequence[Sequence[int]], *, vocab_size: int) -> None:
    """Token ids within the vocabulary (a tokenizer that is not the model's)."""
    for i, ids in enumerate(prompts):
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise ConfigError(
                f"prompt #{i + 1} encodes to token id {bad[0]}, outside the model's vocabulary "
                f"[0, {vocab_size}) (config.json vocab_size): the tokenizer is not this model's"
            )


def check_max_seq_len(requested: int | None, model_max: int) -> None:
    """``--max-seq-len`` within the model's positions: more is refused, never clamped."""
    if requested is not None and requested > model_max:
        raise ConfigError(
            f"--max-seq-len {requested} exceeds the model's {model_max} positions "
            f"(max_position_embeddings); use --max-seq-len <= {model_max}"
        )


@dataclass(frozen=True)
class ModelPlan:
    """What a family reads and checks before any weight is allocated."""

    family: str
    args: ModelArgs
    parallel: Parallel
    """The layout, resolved (``--artifacts``: the compiled one)."""
    source: str
    """What the output names: the checkpoint path, ``preset:NAME (random weights)``,
    ``artifacts:DIR``."""
    name: str
    """The model's short name (``serve``'s model id): the folder's name, or the preset's."""
    path: Path | None = None
    """The checkpoint (or artifact) directory; None for a preset."""
    preset: str | None = None
    moe: MoEArgs | None = None
    tokenizer_dir: Path | None = None
    """Where ``tokenizer.json`` (and the chat template) are; None: byte-level tokens."""
    dtype: str = "fp32"
    """The weights' dtype (``--dtype``, or the compiled one)."""
    quantize: dict[str, Any] | None = None
    """The weights' quantization (``--quantize``, or the compiled one), as a dict."""
    manifest: Manifest | None = None
    """The artifacts' manifest (``--artifacts`` only)."""


@dataclass(frozen=True)
class Rank:
    """One rank's place in the job and what it builds: the configuration, the family's spec
    and plan, its process group and device, and the intra-op threads it set."""

    config: RunConfig
    spec: ModelSpec
    plan: ModelPlan
    index: int = 0
    world: int = 1
    device: torch.device | str = "cpu"
    group: dist.ProcessGroup | None = None
    """The world's process group when ``world > 1``."""
    threads: int = 1
    stage: StagePlace | None = None
    """This rank's pipeline stage and its groups (set by ``families/pipeline.py``); None: the
    rank holds every layer."""

    def model(self, *, progress: bool = False) -> Transformer:
        """This rank's shard of the model, quantized when asked (``spec.load``)."""
        return self.spec.load(self, progress=progress)

    def generator(
        self,
        *,
        rows: int,
        cache_len: int,
        progress: bool = False,
        draft: Draft = None,
    ) -> Generator:
        """A generator over this rank's shard (``spec.generator``), with ``draft``'s."""
        return self.spec.generator(
            self, rows=rows, cache_len=cache_len, progress=progress, draft=draft
        )

    def tokenizer(self) -> Tokenizer:
        return load_tokenizer(self.plan.tokenizer_dir, vocab_size=self.plan.args.vocab_size)


#: this rank's shard of the draft model (``--speculative draft``: ``families.draft.draft_model``)
#: or None
Draft = Transformer | None

#: config.json ``model_type`` -> the native family's spec that runs it (each spec class that
#: names ``model_types`` adds itself; ``families/__init__.py`` imports every family module)
MODEL_TYPES: dict[str, type[ModelSpec]] = {}


class ModelSpec:
    """A model family: how it reads its configuration, checks the layout, loads a rank's
    slices and quantizes them. Subclasses set ``family`` and implement :meth:`plan` and either
    :meth:`shards` (the generic sharded loader, ``parallel/sharded_load.py``, then does the
    rest) or :meth:`load`; :meth:`generator` builds on :meth:`load` unless the family has its
    own. A native family names the ``model_types`` it runs: ``checkpoint_spec`` picks it by
    ``config.json``."""

    family: ClassVar[str]
    #: config.json ``model_type``s this family runs (a native family's; others: none)
    model_types: ClassVar[tuple[str, ...]] = ()
    #: what the family is, in refusals that list the native families
    describe: ClassVar[str] = ""
    #: whether ``--ep`` splits its experts
    expert_parallel: ClassVar[bool] = False
    #: commands this family cannot run yet -> the refusal (its fix included)
    refused: ClassVar[dict[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for kind in cls.__dict__.get("model_types", ()):
            MODEL_TYPES[kind] = cls

    def __init__(self, path: Path | None = None, preset: str | None = None) -> None:
        self.path, self.preset = path, preset

    def plan(self, config: RunConfig) -> ModelPlan:
        raise NotImplementedError

    def shards(self, rank: Rank) -> Shards:
        """The family's part of the generic loader for this rank: its model, its TP plan over
        the rank's groups (``rank.stage``'s when it is a pipeline stage), its tensors."""
        raise NotImplementedError

    def load(self, rank: Rank, *, progress: bool = False) -> Transformer:
        """This rank's shard by the generic loader: the checkpoint's slices (random weights
        for a preset), only its pipeline stage's parts, then quantized."""
        from torch_tensorrt_dist.models.dtypes import DTYPES
        from torch_tensorrt_dist.parallel.sharded_load import load_sharded, random_sharded

        config, plan = rank.config, rank.plan
        dtype, shards = DTYPES[config.model.dtype], self.shards(rank)
        stage = None if rank.stage is None else rank.stage.role
        if plan.path is not None:
            model = load_sharded(
                plan.path, shards, dtype=dtype, device=rank.device, stage=stage, progress=progress
            )
        else:
            model = random_sharded(shards, seed=0, dtype=dtype, stage=stage).to(rank.device)
        quantize_shard(model, config)
        return model  # type: ignore[return-value]  # a family's decoder: Transformer's steps

    def generator(
        self, rank: Rank, *, rows: int, cache_len: int, progress: bool = False, draft: Draft = None
    ) -> Generator:
        model = rank.model(progress=progress)
        return build_generator(model, rank.config, rows, cache_len, draft=draft)

    def request_len(
        self, config: RunConfig, plan: ModelPlan, prompts: Prompts, max_new_tokens: int
    ) -> int:
        """The longest sequence a batch of token-id prompts needs, every length and id checked
        before the model is loaded: ``--max-seq-len``, else the longest prompt and its new
        tokens, rounded up to 64."""
        from torch_tensorrt_dist.generation import check_lengths

        check_prompt_ids(prompts, vocab_size=plan.args.vocab_size)
        limit = min(plan.args.max_seq_len, config.cache.max_seq_len or plan.args.max_seq_len)
        for ids in prompts:
            check_lengths(len(ids), max_new_tokens, limit)
        if config.cache.max_seq_len is not None:
            return config.cache.max_seq_len
        need = max(len(p) for p in prompts) + max_new_tokens
        return min(limit, -(-need // 64) * 64)

    def check_command(self, config: RunConfig) -> None:
        """Refuse a command this family cannot run yet."""
        message = self.refused.get(config.command)
        if message is not None:
            raise ConfigError(message.format(config=config))

    def checkpoint_plan(
        self, config: RunConfig, args: ModelArgs, moe: MoEArgs | None = None
    ) -> ModelPlan:
        """The plan of a checkpoint or preset model whose ``args`` (and ``moe``) passed the
        family's checks: the lengths and the quantization are checked here, alike for every
        family."""
        check_max_seq_len(config.cache.max_seq_len, args.max_seq_len)
        tp = config.parallel.tp or 1
        expert_size = None if moe is None else moe.expert_size
        check_engine_group(config.quantize, config.engine)
        check_group_slices(
            args, tp=tp, config=config.quantize, expert_size=expert_size, engine=config.engine
        )
        path, preset = self.path, self.preset
        return ModelPlan(
            self.family,
            args,
            replace(config.parallel, tp=tp),
            source=str(path) if path is not None else f"preset:{preset} (random weights)",
            name=path.name if path is not None else str(preset),
            path=path,
            preset=preset,
            tokenizer_dir=path,
            dtype=config.model.dtype,
            quantize=None if config.quantize is None else config.quantize.to_dict(),
            moe=moe,
        )


def build_generator(
    model: Transformer,
    config: RunConfig,
    rows: int,
    cache_len: int,
    stage: StagePlace | None = None,
    draft: Transformer | None = None,
) -> Generator:
    """The rank's :class:`Generator` over its loaded shard: ``rows`` rows at once, requests of
    up to ``cache_len`` tokens, the KV cache of ``config.cache`` (memory, blocks, prefill
    budget, prefix caching), compiled by ``config.engine``; over a pipeline ``stage``, its
    ``PipelineGenerator``."""
    cache = config.cache
    if stage is None:
        make: Callable[..., Generator] = Generator
    else:
        from functools import partial

        from torch_tensorrt_dist.generation.pipeline import PipelineGenerator

        make = partial(PipelineGenerator, place=stage)
    extra: dict[str, Any] = {}
    if config.speculative is not None:
        extra["speculative"] = config.speculative
    if draft is not None:  # the draft model of --speculative draft
        extra["draft"] = draft
    return make(
        model,
        engine=config.engine,
        max_batch_size=rows,
        cache_len=cache_len,
        verify=config.verify,
        kv_cache_memory=cache.kv_cache_memory,
        block_size=cache.block,
        max_prefill_tokens=cache.prefill_budget,
        prefix_caching=cache.prefix_caching,
        salt=model_salt(config),
        **extra,
    )


def model_salt(config: RunConfig) -> bytes:
    """The model's identity in prefix-cache keys: the checkpoint, dtype and quantization."""
    m = config.model
    return f"{m.model}|{m.artifacts}|{m.dtype}|{config.quantize}".encode()


def check_kv_cache(config: RunConfig, plan: ModelPlan, rows: int, cache_len: int) -> None:
    """``--kv-cache-memory`` holds one request of ``cache_len`` tokens on every rank (checked
    before any rank starts: ConfigError naming the size needed; a pipeline's ranks hold the
    KV of the deepest stage's layers)."""
    from torch_tensorrt_dist.generation.kv_memory import kv_layout_for
    from torch_tensorrt_dist.models.dtypes import DTYPES

    cache, p = config.cache, plan.parallel
    layers = None
    if p.pp > 1 or p.split:  # every stage's pool is the deepest stage's
        from torch_tensorrt_dist.parallel.pipeline import split_layers

        layers = max(map(len, split_layers(plan.args.n_layers, p.pp, p.split)))
    dtype = DTYPES[plan.dtype]
    layout = kv_layout_for(
        plan.args, tp=p.tp or 1, dtype=dtype, block_size=cache.block, layers=layers
    )
    layout.blocks_for_memory(cache.kv_cache_memory, rows=rows, max_seq_len=cache_len)


def quantize_shard(model: torch.nn.Module, config: RunConfig) -> None:
    """Quantize this rank's loaded shard in place when ``--quantize`` was given."""
    from torch_tensorrt_dist.quantization import quantize_model

    quant = config.quantize
    if quant is None:
        return
    report = quantize_model(model, quant, engine=config.engine)
    logger.info(
        "%s: %d layers, %.1f -> %.1f MiB on this rank",
        quant.describe(),
        report.layers,
        report.bytes_before / 2**20,
        report.bytes_after / 2**20,
    )
    if config.engine == "tensorrt":
        logger.info(
            "each TensorRT engine (every prefill bucket, the decode step) holds its own copy "
            "of these weights: %.1f MiB more per engine on this rank",
            (report.engine_bytes(1) - report.bytes_after) / 2**20,
        )
