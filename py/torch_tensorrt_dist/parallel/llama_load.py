"""Load a Hugging Face Llama/Mistral/Qwen2/Qwen3 checkpoint directory, each rank reading only its
slices.

    model = load_llama("path/to/ckpt", group=tp_group, dtype=torch.bfloat16)

The model is built on the meta device, sharded by the TP plan (``llama.py`` beside it), then
materialised; every parameter is filled with positioned reads of its rows or columns only
(``SafetensorsReader``, no memory map), so a rank never reads or holds another rank's part of a
sharded weight, and its peak memory is the weights it keeps. The directory holds
``config.json`` and ``*.safetensors`` (with or without ``model.safetensors.index.json``). The
RoPE layout is HF's own ``rotate_half`` one, so q/k weights load without a permutation.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from torch_tensorrt_dist.errors import CheckpointError
from torch_tensorrt_dist.models.llama import ModelArgs, Transformer
from torch_tensorrt_dist.models.llama_args import read_config
from torch_tensorrt_dist.models.stage import StageRole
from torch_tensorrt_dist.models.weights_check import check_checkpoint
from torch_tensorrt_dist.parallel.llama import (
    Embedding,
    LMHead,
    ShardSlice,
    TPLayout,
    apply_tp,
    resolve_tp_group,
    shard_slice,
    tp_layout,
)
from torch_tensorrt_dist.parallel.sharded_load import (
    Read,
    checkpoint_dir,
    load_sharded,
    param_reads,
    random_sharded,
)

__all__ = ["DenseShards", "hf_name", "load_llama", "random_llama", "tp_slice"]

logger = logging.getLogger(__name__)

_LAYER_NAMES = {
    "attention.wq": "self_attn.q_proj",
    "attention.wk": "self_attn.k_proj",
    "attention.wv": "self_attn.v_proj",
    "attention.wo": "self_attn.o_proj",
    "feed_forward.w1": "mlp.gate_proj",
    "feed_forward.w3": "mlp.up_proj",
    "feed_forward.w2": "mlp.down_proj",
    "attention_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_LAYER_RE = re.compile(r"layers\.(\d+)\.(.+)\.(weight|bias)$")
_QK_NORM_RE = re.compile(r"layers\.(\d+)\.attention\.w([qk])\.norm\.weight$")


def hf_name(name: str, args: ModelArgs) -> str:
    """The Hugging Face tensor name of our parameter ``name``."""
    if name == "tok_embeddings.weight" or (name == "output.weight" and args.tie_embeddings):
        return "model.embed_tokens.weight"
    if name == "output.weight":
        return "lm_head.weight"
    if name == "norm.weight":
        return "model.norm.weight"
    if (qk := _QK_NORM_RE.match(name)) is not None:  # Qwen3's per-head q/k RMSNorm
        return f"model.layers.{qk.group(1)}.self_attn.{qk.group(2)}_norm.weight"
    if name.endswith("attention.wo_bias"):
        return f"model.{name.removesuffix('attention.wo_bias')}self_attn.o_proj.bias"
    m = _LAYER_RE.match(name)
    if m is None or m.group(2) not in _LAYER_NAMES:
        raise CheckpointError(f"no checkpoint name is known for parameter {name!r}")
    return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{m.group(3)}"


@dataclass(frozen=True)
class DenseShards:
    """The dense family's part of the generic loader (``sharded_load.py``): the Llama decoder,
    its TP plan (``llama.py`` beside it), one checkpoint tensor per parameter."""

    args: ModelArgs
    group: dist.ProcessGroup | None = None
    lm_head: LMHead = "vocab_parallel"
    embedding: Embedding = "vocab_parallel"

    def build(self) -> Transformer:
        return Transformer(self.args)

    def shard(self, model: nn.Module) -> None:
        assert isinstance(model, Transformer)
        apply_tp(model, self.group, lm_head=self.lm_head, embedding=self.embedding)

    def layout(self) -> TPLayout:
        pg = self.group
        rank, size = (dist.get_rank(pg), dist.get_world_size(pg)) if pg is not None else (0, 1)
        return tp_layout(self.args, rank, size, self.lm_head, self.embedding)

    def reads(
        self, model: nn.Module, names: dict[str, Path], full: dict[str, tuple[int, ...]]
    ) -> list[Read]:
        layout = self.layout()
        full = {**full, "output.weight": (self.args.vocab_size, self.args.dim)}
        return param_reads(model, full, self.key, lambda n: tp_slice(n, layout))

    def key(self, name: str) -> str:
        """The checkpoint tensor of parameter ``name``."""
        return hf_name(name, self.args)


def tp_slice(name: str, layout: TPLayout) -> ShardSlice | None:
    """This rank's slice of the checkpoint tensor of parameter ``name``: the TP plan's, but a
    row-parallel bias stays whole (added after the reduce)."""
    sl = shard_slice(name, layout)
    return None if sl is not None and name.endswith(".bias") and sl.dim == 1 else sl


def load_llama(
    path: str | Path,
    *,
    group: dist.ProcessGroup | DeviceMesh | None = None,
    mesh_dim: int | str | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    lm_head: LMHead = "vocab_parallel",
    embedding: Embedding = "vocab_parallel",
    max_seq_len: int | None = None,
    progress: bool = True,
    stage: StageRole | None = None,
) -> Transformer:
    """Build the (sharded) model of checkpoint ``path``, reading only this rank's slices
    (``stage``: only a pipeline stage's parts, ``models/stage.py``). ``model.bytes_read`` says
    how many checkpoint bytes this rank read."""
    root = checkpoint_dir(path)
    args = read_config(root, max_seq_len=max_seq_len)
    check_checkpoint(root, args)  # names, shapes, layers, dtypes: before any allocation
    shards = DenseShards(args, resolve_tp_group(group, mesh_dim), lm_head, embedding)
    model = load_sharded(root, shards, dtype=dtype, device=device, stage=stage, progress=progress)
    layout = shards.layout()
    logger.info("loaded %s (tp rank %d of %d, %s)", path, layout.rank, layout.size, dtype)
    return cast(Transformer, model)


def random_llama(
    args: ModelArgs,
    *,
    seed: int = 0,
    group: dist.ProcessGroup | DeviceMesh | None = None,
    mesh_dim: int | str | None = None,
    dtype: torch.dtype = torch.float32,
    lm_head: LMHead = "vocab_parallel",
    embedding: Embedding = "vocab_parallel",
    stage: StageRole | None = None,
) -> Transformer:
    """A model with deterministic random weights (same on every rank), then sharded (and cut to
    a pipeline ``stage``: the whole model's weights, so a stage equals its part of it)."""
    shards = DenseShards(args, resolve_tp_group(group, mesh_dim), lm_head, embedding)
    return cast(Transformer, random_sharded(shards, seed=seed, dtype=dtype, stage=stage))
