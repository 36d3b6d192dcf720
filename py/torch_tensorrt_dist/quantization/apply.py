"""Quantize a loaded (sharded) model in place, on each rank, layer by layer.

    model = load_llama(path, group=tp_group, dtype=torch.bfloat16)    # this rank's slices
    report = quantize_model(model, QuantConfig("int8"), engine="inductor")

Every linear of the decoder blocks (attention q/k/v/o, the MLP, a MoE's experts and shared
expert; not a MoE router) is replaced by a :class:`WeightOnlyLinear` holding the codes of the
slice this rank holds: a column-parallel weight's scales cover its own output rows, a
row-parallel weight is quantized on its own input columns (``scheme.check_group_slices`` has
refused group sizes that would straddle ranks). The embedding and the LM head stay in the
model dtype unless ``config.embeddings`` (then int8, one scale per vocabulary row). Each
full-precision matrix is dropped as soon as its codes exist, so a rank's peak is its
full-precision slice plus one matrix's quantization temporaries, never the whole model.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.quantization.modules import QuantizedEmbedding, WeightOnlyLinear
from torch_tensorrt_dist.quantization.scheme import QuantConfig

__all__ = ["QuantReport", "check_shape", "layer_kind", "quantize_model", "weight_bytes"]

logger = logging.getLogger(__name__)

#: module-path suffixes of the linears that are quantized (a MoE router ``gate`` is not)
QUANTIZED_SUFFIXES = (
    "attention.wq",
    "attention.wk",
    "attention.wv",
    "attention.wo",
    "feed_forward.w1",
    "feed_forward.w2",
    "feed_forward.w3",
    "shared.w1",
    "shared.w2",
    "shared.w3",
)
#: torch's CPU int4 kernel packs output rows in blocks of 16
_CPU_INT4_ROWS = 16


@dataclass
class QuantReport:
    """What :func:`quantize_model` did on this rank."""

    config: QuantConfig
    kind: str
    """Storage layout of the quantized linears (``kernels.KINDS``)."""
    layers: int
    bytes_before: int
    """Bytes of the replaced weights in the model dtype."""
    bytes_after: int
    """Bytes of their codes and scales."""

    def engine_bytes(self, engines: int) -> int:
        """Bytes this rank holds for the quantized weights once ``engines`` TensorRT engines
        use them (every prefill bucket and the decode step is one; 0 for inductor and eager,
        which read the module's tensors): the module's codes and scales, plus one copy in each
        engine, which freezes them as constants (``lowering/freeze_constants.py``)."""
        if engines < 0:
            raise ValueError(f"engines must be >= 0, got {engines}")
        return self.bytes_after * (1 + engines)


def layer_kind(config: QuantConfig, *, engine: str, device_type: str) -> str:
    """The storage layout for ``engine`` on ``device_type`` (see ``kernels.weight_only_mm``)."""
    if config.scheme == "int8":
        return "int8"
    if engine == "tensorrt":
        return "int4_nibbles"  # TensorRT's INT4 block dequantize takes plain packed nibbles
    if device_type == "cpu":
        return "int4_cpu"
    raise ConfigError(
        f"--quantize int4 on {device_type} runs through TensorRT's INT4 dequantize only; torch's "
        "int4 kernels here are CPU ones: use --engine tensorrt, or --quantize int8"
    )


def weight_bytes(model: nn.Module) -> int:
    """Bytes of this rank's weights (parameters and buffers, without the KV caches and RoPE
    tables that ``setup_caches`` adds)."""
    skip = ("k_cache", "v_cache", "rope_cos", "rope_sin", "key_slots")
    tensors: dict[int, torch.Tensor] = {id(t): t for t in model.parameters()}
    tensors.update({id(t): t for n, t in model.named_buffers() if not n.endswith(skip)})
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _targets(model: nn.Module) -> list[tuple[str, str]]:
    """(parent path, child name) of every linear to quantize; names, not modules, so that each
    float weight can be freed as soon as it is replaced."""
    out = []
    for name, module in model.named_modules():
        for child_name, child in module.named_children():
            path = f"{name}.{child_name}" if name else child_name
            if isinstance(child, nn.Linear) and path.endswith(QUANTIZED_SUFFIXES):
                out.append((name, child_name))
    return out


def check_shape(path: str, weight: torch.Tensor, config: QuantConfig, kind: str) -> None:
    """ConfigError naming ``path`` where this rank's slice ``weight`` [N, K] does not fit
    ``kind`` (an int4 group over its columns, the CPU int4 kernel's blocks of rows)."""
    rows, cols = weight.shape  # this rank's slice
    if config.scheme == "int4" and cols % config.group:
        raise ConfigError(
            f"int4 group size {config.group} does not divide {path}'s {cols} input columns on "
            "this rank; use a group size that divides it, or --quantize int8"
        )
    if kind == "int4_cpu" and rows % _CPU_INT4_ROWS:
        raise ConfigError(
            f"{path} has {rows} output rows on this rank; torch's CPU int4 "
            f"kernel needs a multiple of {_CPU_INT4_ROWS}: use --quantize int8 or a smaller --tp"
        )


def quantize_model(
    model: nn.Module, config: QuantConfig, *, engine: str = "inductor"
) -> QuantReport:
    """Replace this rank's linears (and, with ``config.embeddings``, embedding and head) by
    quantized ones, in place; ``engine`` picks the int4 layout (``layer_kind``)."""
    from torch_tensorrt_dist.quantization.experts import quantize_experts

    device = next(model.parameters()).device
    kind = layer_kind(config, engine=engine, device_type=device.type)
    targets = _targets(model)
    for parent, child_name in targets:
        linear = getattr(model.get_submodule(parent), child_name)
        check_shape(f"{parent}.{child_name}", linear.weight, config, kind)
    before = after = 0
    with torch.no_grad():
        for parent, child_name in targets:
            owner = model.get_submodule(parent)
            linear = getattr(owner, child_name)
            before += linear.weight.numel() * linear.weight.element_size()
            quantized = _quantized_linear(linear, config, kind)
            if engine == "tensorrt":  # its weight-only layer at every size, int8 kept
                quantized.dense_rows = None
            after += sum(b.nbytes for b in quantized.buffers())
            setattr(owner, child_name, quantized)
            del linear  # the last reference: its float weight is freed here
        moved = quantize_experts(model, config, kind)
        before, after = before + moved[0], after + moved[1]
        if config.embeddings:
            moved = _quantize_vocab(model)
            before, after = before + moved[0], after + moved[1]
    logger.info(
        "quantized %d linears to %s (%s): %d -> %d bytes",
        len(targets),
        config.scheme,
        kind,
        before,
        after,
    )
    return QuantReport(config, kind, len(targets), before, after)


def _quantized_linear(linear: nn.Linear, config: QuantConfig, kind: str) -> WeightOnlyLinear:
    from torch_tensorrt_dist.quantization.experts import QuantizedQKNormLinear, is_qk_norm

    if is_qk_norm(linear):
        return QuantizedQKNormLinear.from_qk_norm(linear, config, kind=kind)
    return WeightOnlyLinear.from_linear(linear, config, kind=kind)


def _quantize_vocab(model: nn.Module) -> tuple[int, int]:
    """The embedding (and the untied or separately sharded LM head) as int8 rows."""
    before = after = 0
    for name in ("tok_embeddings", "output"):
        module = getattr(model, name, None)
        if module is None or isinstance(module, QuantizedEmbedding | WeightOnlyLinear):
            continue
        w = cast(torch.Tensor, module.weight)
        before += w.numel() * w.element_size()
        if name == "tok_embeddings":
            quantized: nn.Module = QuantizedEmbedding.from_embedding(module)
        else:
            quantized = WeightOnlyLinear.from_linear(module, QuantConfig("int8"), kind="int8")
        after += sum(b.nbytes for b in quantized.buffers())
        setattr(model, name, quantized)
    return before, after
