"""Compiled artifacts as a model family (``--artifacts DIR``): the manifest says the layout,
lengths, rows and quantization; a rank loads its shard and graphs (``load.py``), never a
checkpoint, and compiles nothing."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch_tensorrt_dist.artifacts.load import load_generator, model_args
from torch_tensorrt_dist.artifacts.manifest import (
    check_layout,
    check_quantization,
    pick_bucket,
    read_manifest,
    verify_files,
)
from torch_tensorrt_dist.config.run import Parallel, RunConfig
from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.families.spec import ModelPlan, ModelSpec, Rank
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
        for flag, asked, compiled, fix in (
            ("--max-batch-size", cache.max_batch_size, manifest.max_batch_size, "--max-batch"),
            ("--max-seq-len", cache.max_seq_len, manifest.cache_len, "--max-seq-len"),
        ):
            if asked not in (None, compiled):
                what = "rows" if flag == "--max-batch-size" else "tokens per row"
                raise ConfigError(
                    f"{flag} {asked}: the artifacts were compiled for {compiled} {what}; leave "
                    f"it unset or recompile with {fix} {asked}"
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
        self,
        config: RunConfig,
        plan: ModelPlan,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
    ) -> int:
        """The compiled length, once a compiled bucket holds the request."""
        if any(not p for p in prompts):
            raise ConfigError("a prompt is empty; give at least one token of text")
        pick_bucket(plan.manifest, [len(p) for p in prompts], max_new_tokens)
        return int(plan.manifest.cache_len)

    def load(self, rank: Rank, *, progress: bool = False) -> Transformer:
        raise ConfigError("the artifacts hold compiled steps: run them through their generator")

    def generator(self, rank: Rank, *, rows: int, cache_len: int, progress: bool = False) -> Any:
        """The compiled graphs of this rank (its rows and length are the manifest's)."""
        p = rank.plan.parallel
        return load_generator(self.root, tp=p.tp, pp=p.pp)
