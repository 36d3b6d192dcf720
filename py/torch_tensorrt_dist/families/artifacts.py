"""Compiled artifacts as a model family (``--artifacts DIR``): the manifest says the layout,
lengths, rows and quantization; a rank loads its shard and graphs (``load.py``), never a
checkpoint, and compiles nothing."""

from __future__ import annotations

import os
from pathlib import Path

from torch_tensorrt_dist.artifacts.checks import check_layout, check_length, check_quantization
from torch_tensorrt_dist.artifacts.load import check_options, load_generator, model_args
from torch_tensorrt_dist.artifacts.manifest import read_manifest, verify_files
from torch_tensorrt_dist.config.run import Parallel, RunConfig
from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.families.spec import (
    Draft,
    ModelPlan,
    ModelSpec,
    Prompts,
    Rank,
    model_salt,
)
from torch_tensorrt_dist.generation.generate import Generator
from torch_tensorrt_dist.models.llama import Transformer
from torch_tensorrt_dist.runtime.env import is_launched, plan_from_env

__all__ = ["ArtifactsSpec"]


class ArtifactsSpec(ModelSpec):
    family = "artifacts"
    refused = {
        "eval": "eval --artifacts: the artifacts hold compiled steps, not a model to score; "
        "evaluate the checkpoint",
        "compile": "compile --artifacts: the artifacts are compiled already",
    }

    def __init__(self, root: str) -> None:
        super().__init__(Path(root), None)
        self.root, self.given = Path(root), root

    def plan(self, config: RunConfig) -> ModelPlan:
        self.check_command(config)
        manifest = read_manifest(self.root)  # checked against its own digest
        p, cache = config.parallel, config.cache
        if is_launched(os.environ):
            world = plan_from_env(os.environ, rendezvous=False).world_size
        else:  # the ranks this command will start
            world = (p.tp or manifest.tp) * p.pp
        check_layout(manifest, world_size=world, tp=p.tp, pp=p.pp)
        check_quantization(manifest, None if config.quantize is None else config.quantize.to_dict())
        # the rows, lengths, blocks and pool are constants of the compiled graphs
        check_options(
            manifest,
            {
                "max_batch_size": cache.max_batch_size,
                "max_seq_len": cache.max_seq_len,
                "kv_cache_memory": cache.kv_cache_memory,
                "block_size": cache.block_size,
                "max_prefill_tokens": cache.max_prefill_tokens,
            },
        )
        if manifest.tokenizer:  # before the tokenizer is parsed: a damaged file is named
            verify_files(self.root, manifest.tokenizer)
        tokenizer = self.root / "tokenizer"
        return ModelPlan(
            self.family,
            model_args(manifest),
            Parallel(tp=manifest.tp, pp=manifest.pp),
            source=f"artifacts:{self.given}",
            name=self.root.resolve().name,
            path=self.root,
            tokenizer_dir=tokenizer if tokenizer.is_dir() else None,
            dtype=manifest.dtype,
            quantize=manifest.quantization,
            manifest=manifest,
        )

    def request_len(
        self, config: RunConfig, plan: ModelPlan, prompts: Prompts, max_new_tokens: int
    ) -> int:
        """The compiled length, once it holds the request."""
        if any(not p for p in prompts):
            raise ConfigError("a prompt is empty; give at least one token of text")
        manifest = plan.manifest
        if manifest is None:
            raise ConfigError("this plan holds no manifest: plan it with the artifacts' spec")
        check_length(manifest, max(len(p) for p in prompts), max_new_tokens)
        return int(manifest.cache_len)

    def load(self, rank: Rank, *, progress: bool = False) -> Transformer:
        raise ConfigError("the artifacts hold compiled steps: run them through their generator")

    def generator(
        self, rank: Rank, *, rows: int, cache_len: int, progress: bool = False, draft: Draft = None
    ) -> Generator:
        """The compiled graphs of this rank (its rows and length are the manifest's)."""
        if draft is not None:
            raise ConfigError("--speculative runs without --artifacts (no verify graph in them)")
        p, config = rank.plan.parallel, rank.config
        return load_generator(
            self.root,
            tp=p.tp,
            pp=p.pp,
            prefix_caching=config.cache.prefix_caching,
            salt=model_salt(config),
        )
