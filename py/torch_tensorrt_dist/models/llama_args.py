"""``ModelArgs``: the hyper-parameters of a Llama-family decoder, named presets, HF configs
(``read_config``: a checkpoint's ``config.json``).

One dataclass serves Llama 2/3, Mistral, Qwen2 and Qwen3 checkpoints: they differ only in a few
fields (GQA head counts, q/k/v bias, tied embeddings, RoPE scaling, sliding window, an explicit
``head_dim``, Qwen3's per-head q/k RMSNorm).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.models.checkpoint_files import load_config_json
from torch_tensorrt_dist.validation import (
    FLOAT32_MAX,
    INT32_MAX,
    check_float,
    check_int,
    config_bool,
    config_float,
    config_int,
)

__all__ = ["DENSE_MODEL_TYPES", "PRESETS", "ModelArgs", "RopeScaling", "read_config"]

#: the ``model_type`` values of the dense checkpoints ``from_hf_config`` reads
DENSE_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling: ``"llama3"`` (Llama 3.1 wavelength bands) or ``"linear"``."""

    kind: str = "llama3"
    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.kind not in ("llama3", "linear"):
            raise ConfigError(
                f"RoPE scaling type {self.kind!r} is not supported; use 'llama3', 'linear' or none"
            )
        check_float(self.factor, name="RoPE scaling factor", low=1.0, high=FLOAT32_MAX)
        if self.kind == "llama3":
            check_float(
                self.low_freq_factor,
                name="RoPE low_freq_factor",
                low=0.0,
                low_open=True,
                high=FLOAT32_MAX,
            )
            check_float(
                self.high_freq_factor,
                name="RoPE high_freq_factor (> low_freq_factor)",
                low=self.low_freq_factor,
                low_open=True,
                high=FLOAT32_MAX,
            )
            check_int(
                self.original_max_position_embeddings,
                name="RoPE original_max_position_embeddings",
                low=1,
                high=INT32_MAX,
            )


@dataclass
class ModelArgs:
    """Hyper-parameters of the decoder (full model sizes; TP derives per-rank counts)."""

    dim: int = 4096
    """Hidden size."""
    n_layers: int = 32
    n_heads: int = 32
    """Query heads."""
    n_kv_heads: int = 0
    """Key/value heads (grouped-query attention); 0 means ``n_heads``."""
    vocab_size: int = 32000
    intermediate_size: int = 11008
    """Hidden size of the SwiGLU MLP."""
    head_dim: int = 0
    """Per-head size; 0 means ``dim // n_heads``."""
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_seq_len: int = 2048
    """Longest sequence (prompt + generated) the RoPE tables and KV cache are built for."""
    qkv_bias: bool = False
    """Bias on the q/k/v projections (Qwen2; Llama with ``attention_bias``)."""
    o_bias: bool = False
    """Bias on the attention output projection (Llama with ``attention_bias``, not Qwen2)."""
    qk_norm: bool = False
    """RMSNorm over each query and key head (its ``head_dim`` values) before RoPE (Qwen3)."""
    tie_embeddings: bool = False
    """The LM head reuses the token embedding matrix."""
    sliding_window: int | None = None
    """Keys older than this many positions are masked (Mistral); None for full attention."""
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.n_kv_heads == 0:
            self.n_kv_heads = self.n_heads
        if self.head_dim == 0:
            if self.n_heads <= 0 or self.dim % self.n_heads:
                raise ConfigError(
                    f"dim={self.dim} is not divisible by n_heads={self.n_heads}; set head_dim"
                )
            self.head_dim = self.dim // self.n_heads
        for name in (
            "dim",
            "n_layers",
            "n_heads",
            "n_kv_heads",
            "vocab_size",
            "intermediate_size",
            "head_dim",
            "max_seq_len",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"ModelArgs.{name} must be > 0, got {getattr(self, name)}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}"
            )
        if self.head_dim % 2:
            raise ConfigError(f"head_dim={self.head_dim} must be even for RoPE")
        # float32 RoPE tables and norms: NaN, infinities and values float32 cannot hold refused
        check_float(
            self.norm_eps,
            name="ModelArgs.norm_eps",
            low=0.0,
            high=1.0,
            low_open=True,
            high_open=True,
        )
        check_float(
            self.rope_theta, name="ModelArgs.rope_theta", low=0.0, high=FLOAT32_MAX, low_open=True
        )
        if self.sliding_window is not None:
            check_int(self.sliding_window, name="ModelArgs.sliding_window", low=1)

    @classmethod
    def from_name(cls, name: str, **overrides: Any) -> ModelArgs:
        """A named preset (see ``PRESETS``), with optional field overrides."""
        if name not in PRESETS:
            raise ConfigError(f"unknown model preset {name!r}; known: {', '.join(sorted(PRESETS))}")
        return dataclasses.replace(PRESETS[name], **overrides)

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any], *, max_seq_len: int | None = None) -> ModelArgs:
        """Translate a Hugging Face ``config.json`` (llama, mistral, qwen2, qwen3) into ModelArgs.

        Every field is checked by name (type, range, finite): a missing or null required
        field, a string where a number belongs, NaN or infinity are refused in one line."""
        model_type = cfg.get("model_type", "llama")
        if model_type not in DENSE_MODEL_TYPES:
            raise ConfigError(
                f"config.json has model_type={model_type!r}; the dense family reads "
                f"{', '.join(DENSE_MODEL_TYPES)}"
            )
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"config.json has hidden_act={act!r}; only 'silu' (SwiGLU) works")
        if config_bool(cfg, "mlp_bias", default=False):
            raise ConfigError("config.json sets mlp_bias=true, which this model does not support")
        rope = _rope_fields(cfg)
        theta = config_float(
            rope,
            "rope_theta",
            default=cfg.get("rope_theta", 10000.0),
            low=0.0,
            low_open=True,
            high=FLOAT32_MAX,
        )
        partial = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor"))
        if (
            check_float(
                1.0 if partial is None else partial,
                name="config.json partial_rotary_factor",
                low=0.0,
                high=1.0,
            )
            != 1.0
        ):
            raise ConfigError("partial_rotary_factor != 1 is not supported")
        kind = rope.get("rope_type", rope.get("type", "default"))
        scaling = None
        if kind != "default":
            src = "config.json " + (
                "rope_parameters" if cfg.get("rope_parameters") else "rope_scaling"
            )
            scaling = RopeScaling(
                kind=str(kind),
                factor=config_float(
                    rope, "factor", default=1.0, low=1.0, high=FLOAT32_MAX, file=src
                ),
                low_freq_factor=config_float(rope, "low_freq_factor", default=1.0, file=src),
                high_freq_factor=config_float(rope, "high_freq_factor", default=4.0, file=src),
                original_max_position_embeddings=config_int(
                    rope, "original_max_position_embeddings", default=8192, file=src
                ),
            )
        window = config_int(cfg, "sliding_window", default=0, low=0)
        use_window = config_bool(cfg, "use_sliding_window", default=False)
        qwen = model_type in ("qwen2", "qwen3")
        if qwen and not use_window:
            window = 0
        elif qwen and window:
            raise ConfigError(
                f"{model_type} per-layer sliding windows (use_sliding_window) are not supported"
            )
        eos = cfg.get("eos_token_id")
        eos_list = eos if isinstance(eos, list) else ([] if eos is None else [eos])
        eos_ids = tuple(
            check_int(i, name="config.json eos_token_id", low=0, high=INT32_MAX) for i in eos_list
        )
        bos = cfg.get("bos_token_id")
        n_heads = config_int(cfg, "num_attention_heads")
        attention_bias = config_bool(cfg, "attention_bias", default=False)
        return cls(
            dim=config_int(cfg, "hidden_size"),
            n_layers=config_int(cfg, "num_hidden_layers"),
            n_heads=n_heads,
            n_kv_heads=config_int(cfg, "num_key_value_heads", default=n_heads, low=0) or n_heads,
            vocab_size=config_int(cfg, "vocab_size"),
            intermediate_size=config_int(cfg, "intermediate_size"),
            head_dim=config_int(cfg, "head_dim", default=0, low=0),
            norm_eps=config_float(
                cfg, "rms_norm_eps", default=1e-6, low=0.0, high=1.0, low_open=True, high_open=True
            ),
            rope_theta=theta,
            rope_scaling=scaling,
            max_seq_len=max_seq_len or config_int(cfg, "max_position_embeddings", default=2048),
            qkv_bias=attention_bias or model_type == "qwen2",  # Qwen3: attention_bias alone
            o_bias=attention_bias and model_type != "qwen2",
            qk_norm=model_type == "qwen3",
            tie_embeddings=config_bool(cfg, "tie_word_embeddings", default=False),
            sliding_window=window or None,
            bos_token_id=None
            if bos is None
            else check_int(bos, name="config.json bos_token_id", low=0, high=INT32_MAX),
            eos_token_ids=eos_ids,
        )


def _rope_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """The RoPE settings: ``rope_parameters`` (transformers >= 5) over legacy ``rope_scaling``."""
    parts = []
    for key in ("rope_scaling", "rope_parameters"):
        value = cfg.get(key)
        if value is not None and not isinstance(value, dict):
            raise ConfigError(f"config.json {key} must be an object or null, got {value!r}")
        parts.append(value or {})
    return {**parts[0], **parts[1]}


_LLAMA3_ROPE = RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)

PRESETS: dict[str, ModelArgs] = {
    # Deterministic random weights; what the CLI falls back to when no checkpoint is available.
    "tiny": ModelArgs(
        dim=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=256,
        intermediate_size=128,
        max_seq_len=256,
        tie_embeddings=True,
    ),
    "llama-2-7b": ModelArgs(
        dim=4096,
        n_layers=32,
        n_heads=32,
        vocab_size=32000,
        intermediate_size=11008,
        max_seq_len=4096,
    ),
    "llama-3.1-8b": ModelArgs(
        dim=4096,
        n_layers=32,
        n_heads=32,
        n_kv_heads=8,
        vocab_size=128256,
        intermediate_size=14336,
        norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=_LLAMA3_ROPE,
        max_seq_len=8192,
    ),
    "llama-3.1-70b": ModelArgs(
        dim=8192,
        n_layers=80,
        n_heads=64,
        n_kv_heads=8,
        vocab_size=128256,
        intermediate_size=28672,
        rope_theta=500000.0,
        rope_scaling=_LLAMA3_ROPE,
        max_seq_len=8192,
    ),
    "mistral-7b": ModelArgs(
        dim=4096,
        n_layers=32,
        n_heads=32,
        n_kv_heads=8,
        vocab_size=32000,
        intermediate_size=14336,
        rope_theta=1000000.0,
        max_seq_len=8192,
    ),
    "qwen2-0.5b": ModelArgs(
        dim=896,
        n_layers=24,
        n_heads=14,
        n_kv_heads=2,
        vocab_size=151936,
        intermediate_size=4864,
        norm_eps=1e-6,
        rope_theta=1000000.0,
        max_seq_len=4096,
        qkv_bias=True,
        tie_embeddings=True,
    ),
}


def read_config(path: str | Path, *, max_seq_len: int | None = None) -> ModelArgs:
    """ModelArgs from ``path/config.json``."""
    cfg = load_config_json(path)
    return ModelArgs.from_hf_config(cfg, max_seq_len=max_seq_len)
