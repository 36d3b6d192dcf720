"""The toy family: a parallel-block decoder (``models/toy.py: ToyLM``), its TP plan
(``parallel/plans.py: toy_lm_tp``) and this spec, and nothing else: docs/families.md's worked
example of adding a family, run by tests/test_toy_family.py.

Its checkpoint is ``config.json`` (``model_type: toy_parallel`` and the Llama field names)
and safetensors named as the model's own parameters; the generic loader
(``parallel/sharded_load.py``) reads each rank's slices.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from torch_tensorrt_dist.config.run import RunConfig
from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.families.spec import ModelPlan, ModelSpec, Rank
from torch_tensorrt_dist.models.checkpoint_files import load_config_json
from torch_tensorrt_dist.models.llama_args import ModelArgs
from torch_tensorrt_dist.models.toy import ToyLM
from torch_tensorrt_dist.parallel.llama import tp_layout
from torch_tensorrt_dist.parallel.llama_load import DenseShards
from torch_tensorrt_dist.parallel.plans import toy_lm_tp
from torch_tensorrt_dist.parallel.sharded_load import check_sharded

__all__ = ["ToyShards", "ToySpec", "toy_args"]


def toy_args(path: Path) -> ModelArgs:
    """The model's sizes from ``config.json`` (the Llama field names)."""
    cfg = load_config_json(path)
    try:
        return ModelArgs(
            dim=int(cfg["hidden_size"]),
            n_layers=int(cfg["num_hidden_layers"]),
            n_heads=int(cfg["num_attention_heads"]),
            n_kv_heads=int(cfg.get("num_key_value_heads", 0)),
            vocab_size=int(cfg["vocab_size"]),
            intermediate_size=int(cfg["intermediate_size"]),
            max_seq_len=int(cfg.get("max_position_embeddings", 2048)),
        )
    except KeyError as exc:
        raise ConfigError(f"{path}/config.json lacks {exc.args[0]!r}") from None


class ToyShards(DenseShards):
    """The generic loader's questions, answered for the toy decoder: the dense family's reads
    (the same modules, the same slices), under the model's own parameter names."""

    def build(self) -> ToyLM:
        return ToyLM(self.args)

    def shard(self, model: nn.Module) -> None:
        assert isinstance(model, ToyLM)
        toy_lm_tp(model, self.group, lm_head=self.lm_head, embedding=self.embedding)

    def key(self, name: str) -> str:
        return name


class ToySpec(ModelSpec):
    family = "toy"
    model_types = ("toy_parallel",)
    describe = "a toy parallel-block decoder, docs/families.md"
    refused = {"compile": "compile: the toy family runs `generate` and `serve` only"}

    def plan(self, config: RunConfig) -> ModelPlan:
        self.check_command(config)
        if self.path is None:
            raise ConfigError("the toy family is a checkpoint (--model DIR)")
        args = toy_args(self.path)
        m = config.model
        tp_layout(args, 0, config.parallel.tp or 1, m.lm_head, m.embedding)  # the split
        check_sharded(self.path, ToyShards(args))  # names and shapes, before any allocation
        return self.checkpoint_plan(config, args)

    def shards(self, rank: Rank) -> ToyShards:
        group = rank.group if rank.stage is None else rank.stage.tp_group
        m = rank.config.model
        return ToyShards(rank.plan.args, group, m.lm_head, m.embedding)
