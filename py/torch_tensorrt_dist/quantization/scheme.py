"""What to quantize and how: the scheme, its group size, and the per-rank slice checks (pure).

    config = QuantConfig("int4", group_size=64)
    check_group_slices(args, tp=2, config=config)   # before any rank starts

``int8``: symmetric, one scale per output channel. ``int4``: symmetric, one scale per group of
``group_size`` consecutive weights along the input dimension (32, 64 or 128; TensorRT's INT4
block dequantization takes 64 and 128 only, :func:`check_engine_group`). Each rank
quantizes the slices it holds, so a row-parallel weight (attention ``wo``, MLP ``w2``) is
quantized on its own input columns: a group must never straddle two ranks' slices, which holds
exactly when the group size divides the slice (then rank ``r``'s groups are the global groups
``r * slice / g ...``, and per-rank quantization equals slicing the whole-model quantization).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.models.llama_args import ModelArgs

__all__ = [
    "GROUP_SIZES",
    "SCHEMES",
    "TENSORRT_GROUP_SIZES",
    "QuantConfig",
    "check_engine_group",
    "check_group_slices",
    "quant_config",
    "weight_slices",
]

SCHEMES = ("int8", "int4")
GROUP_SIZES = (32, 64, 128)
#: the int4 group sizes TensorRT's INT4 block dequantization takes (blocks of 64 or 128)
TENSORRT_GROUP_SIZES = (64, 128)
DEFAULT_GROUP_SIZE = 128


@dataclass(frozen=True)
class QuantConfig:
    """Weight-only quantization of the decoder's linear layers."""

    scheme: str
    """``int8`` (per output channel) or ``int4`` (groups along the input dimension)."""
    group_size: int | None = None
    """int4 only: weights per scale along the input dimension (32, 64, 128; default 128)."""
    embeddings: bool = False
    """Also quantize the (vocabulary-parallel) embedding and LM head: int8, one scale per row."""

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise ConfigError(
                f"--quantize {self.scheme!r} is not a scheme; use int8 (one scale per output "
                "channel) or int4 (groups along the input dimension, --group-size 32, 64 or 128)"
            )
        if self.scheme == "int8" and self.group_size is not None:
            raise ConfigError(
                f"--group-size {self.group_size} applies to int4; int8 has one scale per output "
                "channel: drop --group-size or use --quantize int4"
            )
        if self.scheme == "int4":
            if self.group_size is None:
                object.__setattr__(self, "group_size", DEFAULT_GROUP_SIZE)
            elif self.group_size not in GROUP_SIZES:
                raise ConfigError(
                    f"--group-size {self.group_size}: int4 groups are 32, 64 or 128 weights "
                    "along the input dimension"
                )

    @property
    def group(self) -> int:
        """The int4 group size (0 for int8)."""
        return self.group_size or 0

    def describe(self) -> str:
        text = self.scheme if self.scheme == "int8" else f"int4 (group {self.group_size})"
        return text + (", embeddings too" if self.embeddings else "")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> QuantConfig:
        return cls(str(data["scheme"]), data.get("group_size"), bool(data.get("embeddings", False)))


def quant_config(
    scheme: str | None, group_size: int | None = None, embeddings: bool = False
) -> QuantConfig | None:
    """The CLI's ``--quantize/--group-size/--quantize-embeddings`` as a config (None: off)."""
    if scheme is None:
        if group_size is not None or embeddings:
            flag = "--group-size" if group_size is not None else "--quantize-embeddings"
            raise ConfigError(f"{flag} needs --quantize int8 or --quantize int4")
        return None
    return QuantConfig(scheme, group_size, embeddings)


def check_engine_group(config: QuantConfig | None, engine: str | None) -> None:
    """int4 for ``engine='tensorrt'`` needs a group size TensorRT's block dequantization takes,
    else a ConfigError naming the ones that work (the inductor and eager engines take 32)."""
    if config is None or config.scheme != "int4" or engine != "tensorrt":
        return
    if config.group not in TENSORRT_GROUP_SIZES:
        raise ConfigError(
            f"--group-size {config.group} with --engine tensorrt: TensorRT's INT4 block "
            "quantization takes groups of 64 or 128; use --group-size 64 or 128, or another "
            "--engine"
        )


#: Quantized weights of the Llama plan: module suffix -> (sharding, input-width field)
_DENSE_WEIGHTS: dict[str, str] = {
    "attention.wq": "column",
    "attention.wk": "column",
    "attention.wv": "column",
    "attention.wo": "row",
    "feed_forward.w1": "column",
    "feed_forward.w3": "column",
    "feed_forward.w2": "row",
}


def weight_slices(
    args: ModelArgs, tp: int, *, expert_size: int | None = None
) -> dict[str, tuple[str, int]]:
    """Per-rank input width of each quantized weight: suffix -> (sharding, columns per rank).

    Column-parallel weights keep every input column (``dim``); row-parallel ones hold
    ``1/tp`` of theirs. ``expert_size``: a MoE model's expert MLP width (its ``w2`` is
    row-parallel over the expert's TP ranks).
    """
    out: dict[str, tuple[str, int]] = {}
    for name, kind in _DENSE_WEIGHTS.items():
        if kind == "column":
            out[name] = (kind, args.dim)
        elif name == "attention.wo":
            out[name] = (kind, args.n_heads * args.head_dim // tp)
        else:
            out[name] = (kind, args.intermediate_size // tp)
    if expert_size is not None:
        out["experts.w1/w3"] = ("column", args.dim)
        out["experts.w2"] = ("row", expert_size // tp)
    return out


def check_group_slices(
    args: ModelArgs,
    *,
    tp: int,
    config: QuantConfig | None,
    expert_size: int | None = None,
    engine: str | None = None,
) -> None:
    """int4: every quantized weight's per-rank input slice splits into whole groups, else a
    ConfigError naming the weight, its slice and the group sizes that fit (on ``engine``)."""
    if config is None or config.scheme != "int4":
        return
    g = config.group
    for name, (kind, width) in weight_slices(args, tp, expert_size=expert_size).items():
        if width % g == 0:
            continue
        sizes = TENSORRT_GROUP_SIZES if engine == "tensorrt" else GROUP_SIZES
        fits = [s for s in sizes if width % s == 0]
        advice = (
            f"use --group-size {' or '.join(map(str, fits))}"
            if fits
            else "no int4 group size divides it: use --quantize int8"
        )
        where = (
            f"its input slice of {width} columns per rank at tp={tp}; groups would straddle "
            "two ranks' slices"
            if kind == "row" and tp > 1
            else f"its {width} input columns"
        )
        raise ConfigError(
            f"int4 group size {g} does not divide {name}'s input ({where}); {advice}"
            + (", or a smaller --tp" if kind == "row" and tp > 1 else "")
        )
