"""Compare what config.json implies with the checkpoint's safetensors headers, before anything
is built or allocated.

    check_checkpoint("path/to/ckpt", args)          # Llama / Mistral / Qwen2 / Qwen3
    check_checkpoint("path/to/ckpt", args, moe)     # Mixtral / Qwen2-MoE / Qwen3-MoE

Headers are small, so this runs in the launching process before any rank starts and again in
each loader. In order: the number of layers, the number of experts per sparse layer, then
every tensor the loader will read (name and full shape, from :func:`llama_tensors` /
:func:`moe_tensors`, pure functions of the config), then dtypes: a floating-point type, and the
one config.json names (``torch_dtype`` / ``dtype``) where it names one. A config that does not
describe these weights is refused in one line naming the tensor and the config field, so a
``num_hidden_layers`` of 100000 or a ``vocab_size`` of 1e12 never reaches an allocator, and a
header relabelled from BF16 to F16 never loads as other numbers.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import torch

from torch_tensorrt_dist.errors import CheckpointError
from torch_tensorrt_dist.models.checkpoint_files import checkpoint_tensors, load_config_json
from torch_tensorrt_dist.models.llama_args import ModelArgs
from torch_tensorrt_dist.models.moe_args import MoEArgs
from torch_tensorrt_dist.models.safetensors_io import TensorInfo

__all__ = ["check_checkpoint", "llama_tensors", "moe_tensors"]

Shape = tuple[int, ...]
_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.")
_EXPERT_RE = re.compile(r"model\.layers\.(\d+)\.(?:block_sparse_moe|mlp)\.experts\.(\d+)\.")
_BLOCK = {"mixtral": "block_sparse_moe", "qwen2_moe": "mlp", "qwen3_moe": "mlp"}
_EXPERT_NAMES = {
    "mixtral": ("w1", "w3", "w2"),
    "qwen2_moe": ("gate_proj", "up_proj", "down_proj"),
    "qwen3_moe": ("gate_proj", "up_proj", "down_proj"),
}
_CONFIG_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}


Dim = tuple[int, str]
"""A dimension and the config.json field(s) it comes from (named in messages)."""
Table = dict[str, tuple[Dim, ...]]


def _dims(args: ModelArgs, moe: MoEArgs | None = None) -> dict[str, Dim]:
    hd = args.head_dim
    out = {
        "D": (args.dim, "hidden_size"),
        "V": (args.vocab_size, "vocab_size"),
        "I": (args.intermediate_size, "intermediate_size"),
        "Q": (args.n_heads * hd, "num_attention_heads x head_dim"),
        "KV": (args.n_kv_heads * hd, "num_key_value_heads x head_dim"),
        "HD": (hd, "head_dim"),
        "1": (1, ""),
    }
    if moe is not None:
        size = "intermediate_size" if moe.style == "mixtral" else "moe_intermediate_size"
        experts = "num_local_experts" if moe.style == "mixtral" else "num_experts"
        out["E"] = (moe.n_experts, experts)
        out["X"] = (moe.expert_size, size)
        out["2X"] = (2 * moe.expert_size, f"2 x {size}")
        out["S"] = (moe.shared_expert_size, "shared_expert_intermediate_size")
    return out


def _attention(args: ModelArgs, x: dict[str, Dim], p: str) -> Table:
    d, q, kv = x["D"], x["Q"], x["KV"]
    out: Table = {
        f"{p}input_layernorm.weight": (d,),
        f"{p}post_attention_layernorm.weight": (d,),
        f"{p}self_attn.q_proj.weight": (q, d),
        f"{p}self_attn.k_proj.weight": (kv, d),
        f"{p}self_attn.v_proj.weight": (kv, d),
        f"{p}self_attn.o_proj.weight": (d, q),
    }
    if args.qkv_bias:
        for proj, dim in (("q", q), ("k", kv), ("v", kv)):
            out[f"{p}self_attn.{proj}_proj.bias"] = (dim,)
    if args.o_bias:
        out[f"{p}self_attn.o_proj.bias"] = (d,)
    if args.qk_norm:
        out[f"{p}self_attn.q_norm.weight"] = out[f"{p}self_attn.k_norm.weight"] = (x["HD"],)
    return out


def _swiglu(p: str, d: Dim, hidden: Dim) -> Table:
    return {
        f"{p}gate_proj.weight": (hidden, d),
        f"{p}up_proj.weight": (hidden, d),
        f"{p}down_proj.weight": (d, hidden),
    }


def _outer(args: ModelArgs, x: dict[str, Dim]) -> Table:
    out: Table = {"model.embed_tokens.weight": (x["V"], x["D"]), "model.norm.weight": (x["D"],)}
    if not args.tie_embeddings:
        out["lm_head.weight"] = (x["V"], x["D"])
    return out


def _llama_table(args: ModelArgs) -> Table:
    x = _dims(args)
    out = _outer(args, x)
    for i in range(args.n_layers):
        p = f"model.layers.{i}."
        out.update(_attention(args, x, p))
        out.update(_swiglu(f"{p}mlp.", x["D"], x["I"]))
    return out


def _moe_table(args: ModelArgs, moe: MoEArgs, names: Collection[str]) -> Table:
    x = _dims(args, moe)
    d, e, size = x["D"], x["E"], x["X"]
    block = _BLOCK[moe.style]
    sparse = set(moe.sparse_layers)
    out = _outer(args, x)
    for i in range(args.n_layers):
        p = f"model.layers.{i}."
        out.update(_attention(args, x, p))
        if i not in sparse:
            out.update(_swiglu(f"{p}mlp.", d, x["I"]))
            continue
        router = f"{p}{block}.gate.weight"
        if router not in names and f"{p}mlp.gate.weight" in names:
            router = f"{p}mlp.gate.weight"  # transformers' in-memory name
        out[router] = (e, d)
        fused = f"{p}mlp.experts."
        if f"{fused}gate_up_proj" in names and f"{fused}down_proj" in names:
            out[f"{fused}gate_up_proj"] = (e, x["2X"], d)
            out[f"{fused}down_proj"] = (e, d, size)
        else:
            gate, up, down = _EXPERT_NAMES[moe.style]
            for j in range(moe.n_experts):
                q = f"{p}{block}.experts.{j}."
                out[f"{q}{gate}.weight"] = out[f"{q}{up}.weight"] = (size, d)
                out[f"{q}{down}.weight"] = (d, size)
        if moe.shared_expert_size:
            out.update(_swiglu(f"{p}{block}.shared_expert.", d, x["S"]))
            out[f"{p}{block}.shared_expert_gate.weight"] = (x["1"], d)
    return out


def _sizes(table: Table) -> dict[str, Shape]:
    return {name: tuple(size for size, _ in dims) for name, dims in table.items()}


def llama_tensors(args: ModelArgs) -> dict[str, Shape]:
    """Checkpoint name -> full shape of every tensor ``load_llama`` reads for ``args``."""
    return _sizes(_llama_table(args))


def moe_tensors(args: ModelArgs, moe: MoEArgs, names: Collection[str]) -> dict[str, Shape]:
    """Checkpoint name -> full shape of every tensor ``load_moe`` reads. ``names``: the
    checkpoint's tensor names, which say how experts are stored (one tensor per expert, or
    fused ``mlp.experts.gate_up_proj`` [E, 2I, D] / ``down_proj`` [E, D, I]) and where the
    router is (``block_sparse_moe.gate`` or ``mlp.gate``)."""
    return _sizes(_moe_table(args, moe, names))


def _spans(ids: Collection[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    parts: list[str] = []
    for i in sorted(ids):
        if parts and parts[-1].split("-")[-1] == str(i - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{i}"
        else:
            parts.append(str(i))
    return ", ".join(parts[:6]) + (", ..." if len(parts) > 6 else "")


def _check_counts(
    root: Path,
    tensors: Mapping[str, tuple[Path, TensorInfo]],
    args: ModelArgs,
    moe: MoEArgs | None,
) -> None:
    """Layers (and experts per sparse layer) before the tables, whose size they multiply."""
    layers = {int(m.group(1)) for n in tensors if (m := _LAYER_RE.match(n))}
    if layers and layers != set(range(args.n_layers)):
        raise CheckpointError(
            f"config.json says num_hidden_layers={args.n_layers}, but {root} holds "
            f"{len(layers)} layers ({_spans(layers)}); the config and weights do not match"
        )
    if moe is None:
        return
    experts: dict[int, set[int]] = {}
    for n in tensors:
        if (m := _EXPERT_RE.match(n)) is not None:
            experts.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
    label = "num_local_experts" if moe.style == "mixtral" else "num_experts"
    for i in moe.sparse_layers:
        fused = tensors.get(f"model.layers.{i}.mlp.experts.gate_up_proj")
        if fused is not None and fused[1].shape:
            ok, have = fused[1].shape[0] == moe.n_experts, f"{fused[1].shape[0]} (fused)"
        else:
            ids = experts.get(i, set())
            ok, have = ids == set(range(moe.n_experts)), f"{len(ids)} ({_spans(ids) or 'none'})"
        if not ok:
            raise CheckpointError(
                f"config.json says {label}={moe.n_experts}, but layer {i} of {root} holds "
                f"experts {have}; the config and weights do not match"
            )


def _config_dtypes(cfg: Mapping[str, Any]) -> set[torch.dtype]:
    found = set()
    for key in ("torch_dtype", "dtype"):
        value = cfg.get(key)
        if isinstance(value, str) and value.removeprefix("torch.") in _CONFIG_DTYPES:
            found.add(_CONFIG_DTYPES[value.removeprefix("torch.")])
    return found


def check_checkpoint(path: str | Path, args: ModelArgs, moe: MoEArgs | None = None) -> None:
    """Refuse (CheckpointError, one line) a checkpoint whose tensors are not the ones its
    config.json describes: names, full shapes, layer and expert counts, dtypes."""
    root = Path(path)
    tensors = checkpoint_tensors(root)
    _check_counts(root, tensors, args, moe)
    table = _llama_table(args) if moe is None else _moe_table(args, moe, tensors.keys())
    family = "Llama/Mistral/Qwen2/Qwen3" if moe is None else "Mixtral/Qwen2-MoE/Qwen3-MoE"
    missing = [name for name in table if name not in tensors]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(
            f"{root} lacks tensor {missing[0]!r}{more}, which config.json implies; the "
            f"checkpoint is incomplete or not a {family} model"
        )
    for name, dims in table.items():
        file, info = tensors[name]
        shape = tuple(size for size, _ in dims)
        if info.shape != shape:
            rank_differs = len(info.shape) != len(shape)
            fields = [
                f"{label}={size}"
                for i, (size, label) in enumerate(dims)
                if label and (rank_differs or info.shape[i] != size)
            ]
            why = f" ({', '.join(dict.fromkeys(fields))})" if fields else ""
            raise CheckpointError(
                f"{file.name}: tensor {name!r} has shape {list(info.shape)}, but config.json "
                f"implies {list(shape)}{why}; the config and weights do not match"
            )
    cfg = load_config_json(root)
    if "quantization_config" in cfg:
        return  # quantized weights: integer and scale tensors are expected
    said = _config_dtypes(cfg)
    for name in table:
        file, info = tensors[name]
        if not info.dtype.is_floating_point or (said and info.dtype not in said):
            expected = " or ".join(sorted(str(d).removeprefix("torch.") for d in said))
            raise CheckpointError(
                f"{file.name}: tensor {name!r} is {str(info.dtype).removeprefix('torch.')}, "
                f"but config.json says the weights are {expected or 'floating point'}; the file "
                "is damaged or the config is not its own"
            )
