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
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from tqdm import tqdm

from torch_tensorrt_dist.errors import CheckpointError
from torch_tensorrt_dist.models.checkpoint_files import weight_map
from torch_tensorrt_dist.models.llama import ModelArgs, Transformer
from torch_tensorrt_dist.models.llama_args import read_config
from torch_tensorrt_dist.models.safetensors_io import SafetensorsReader
from torch_tensorrt_dist.models.stage import StageRole, cut_stage
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

__all__ = ["fill_parameters", "hf_name", "load_into", "load_llama", "random_llama"]

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


def load_into(
    param: torch.Tensor, reader: SafetensorsReader, name: str, sl: ShardSlice | None
) -> None:
    """Fill ``param`` with the tensor or its slice; straight into its memory when it can be
    (shared with ``moe_load``)."""
    dim, start, stop = (None, 0, None) if sl is None else (sl.dim, sl.start, sl.stop)
    rows = param
    if sl is not None and sl.padded > sl.stop - sl.start:
        # the last vocab shard: zero rows, sliced off after the gather
        param[sl.stop - sl.start :].zero_()
        rows = param[: sl.stop - sl.start]
    if rows.device.type == "cpu" and rows.dtype == reader.info(name).dtype:
        reader.read_into(rows, name, dim, start, stop)
    else:  # another dtype or device: one tensor-sized temporary
        rows.copy_(reader.read(name, dim, start, stop))


def fill_parameters(
    model: torch.nn.Module,
    root: Path,
    args: ModelArgs,
    layout: TPLayout,
    full_shapes: dict[str, tuple[int, ...]],
    *,
    progress: bool = True,
) -> int:
    """Fill every parameter of a sharded, materialised ``model`` with this rank's slice of its
    checkpoint tensor (``full_shapes``: the unsharded shapes, checked against the files);
    returns the checkpoint bytes read."""
    names = weight_map(root)
    by_file: dict[Path, list[tuple[str, torch.nn.Parameter, str]]] = {}
    for name, param in model.named_parameters():
        key = hf_name(name, args)
        if key not in names:
            raise CheckpointError(
                f"{root} lacks tensor {key!r} (for {name}); the checkpoint "
                "is incomplete or not a Llama/Mistral/Qwen2/Qwen3 model"
            )
        by_file.setdefault(names[key], []).append((name, param, key))
    show = progress and (not dist.is_initialized() or dist.get_rank() == 0)
    bar = tqdm(total=sum(map(len, by_file.values())), desc=f"loading {root.name}", disable=not show)
    total = 0
    with bar, torch.no_grad():
        for file, entries in by_file.items():
            with SafetensorsReader(file) as reader:
                for name, param, key in entries:
                    shape = reader.info(key).shape
                    if shape != full_shapes[name]:
                        raise CheckpointError(
                            f"{file.name}: tensor {key!r} has shape {list(shape)}, but "
                            f"config.json implies {list(full_shapes[name])}; the config and "
                            "weights do not match"
                        )
                    sl = shard_slice(name, layout)
                    if sl is not None and name.endswith(".bias") and sl.dim == 1:
                        sl = None  # a row-parallel bias stays whole (added after the reduce)
                    load_into(param, reader, key, sl)
                    bar.update(1)
                total += reader.bytes_read
    return total


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
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"checkpoint directory {root} does not exist")
    args = read_config(root, max_seq_len=max_seq_len)
    check_checkpoint(root, args)  # names, shapes, layer count, dtypes: before any allocation
    pg = resolve_tp_group(group, mesh_dim)
    rank, size = (dist.get_rank(pg), dist.get_world_size(pg)) if pg is not None else (0, 1)
    layout = tp_layout(args, rank, size, lm_head, embedding)
    with torch.device("meta"):
        model = Transformer(args)
    full_shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    full_shapes["output.weight"] = (args.vocab_size, args.dim)
    apply_tp(model, pg, lm_head=lm_head, embedding=embedding)
    if stage is not None:
        cut_stage(model, stage)
    model = model.to(dtype).to_empty(device=device)
    model.bytes_read = fill_parameters(model, root, args, layout, full_shapes, progress=progress)
    logger.info("loaded %s (tp rank %d of %d, %s)", root, rank, size, dtype)
    return model.requires_grad_(False).eval()


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
    gen = torch.Generator().manual_seed(seed)
    model = Transformer(args)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5 / p.shape[-1] ** 0.5)
    apply_tp(model, resolve_tp_group(group, mesh_dim), lm_head=lm_head, embedding=embedding)
    if stage is not None:
        cut_stage(model, stage)
    return model.to(dtype).requires_grad_(False).eval()
