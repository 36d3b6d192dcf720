"""``MoEArgs``: the mixture-of-experts hyper-parameters on top of ``ModelArgs``.

Mixtral, Qwen2-MoE and Qwen3-MoE are Llama-family decoders whose MLP is (in some or all layers)
a sparse block: a router picks ``top_k`` of ``n_experts`` SwiGLU experts per token. Qwen2-MoE
adds a shared expert (every token) scaled by ``sigmoid(shared_expert_gate(x))``; Qwen3-MoE
normalises each query and key head (RMSNorm) before RoPE, as dense Qwen3 does
(``ModelArgs.qk_norm``).

    args, moe = moe_args_from_hf_config(json.load(open("config.json")))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.models.checkpoint_files import load_config_json
from torch_tensorrt_dist.models.llama_args import ModelArgs
from torch_tensorrt_dist.validation import check_int, config_bool, config_int

__all__ = [
    "MOE_MODEL_TYPES",
    "MoEArgs",
    "is_moe_config",
    "moe_args_from_hf_config",
    "read_moe_config",
]

#: HF model_type -> the dense ModelArgs family it shares attention and norms with.
MOE_MODEL_TYPES = {"mixtral": "mistral", "qwen2_moe": "qwen2", "qwen3_moe": "qwen3"}


@dataclass(frozen=True)
class MoEArgs:
    """The sparse MLP of a MoE decoder (full sizes; expert/tensor parallel derives shards)."""

    n_experts: int
    """Routed experts per sparse layer."""
    top_k: int
    """Experts each token is routed to."""
    expert_size: int
    """Hidden size of one routed expert's SwiGLU."""
    norm_topk_prob: bool = True
    """Renormalise the top-k probabilities to sum to 1 (Mixtral: always)."""
    shared_expert_size: int = 0
    """Hidden size of the shared expert (Qwen2-MoE); 0 when the model has none."""
    sparse_layers: tuple[int, ...] = field(default_factory=tuple)
    """Indices of the layers whose MLP is sparse (the others keep a dense SwiGLU)."""
    style: str = "mixtral"
    """Checkpoint naming: ``"mixtral"`` (block_sparse_moe.experts.N.w1), ``"qwen2_moe"`` or
    ``"qwen3_moe"`` (mlp.experts.N.gate_proj)."""

    def __post_init__(self) -> None:
        for name in ("n_experts", "top_k", "expert_size"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"MoEArgs.{name} must be > 0, got {getattr(self, name)}")
        if self.top_k > self.n_experts:
            raise ConfigError(
                f"top_k={self.top_k} exceeds the {self.n_experts} experts; use top_k <= "
                f"{self.n_experts}"
            )
        if self.shared_expert_size < 0:
            raise ConfigError(f"shared_expert_size must be >= 0, got {self.shared_expert_size}")
        if self.style not in MOE_MODEL_TYPES:
            raise ConfigError(f"MoE style {self.style!r}; use one of {sorted(MOE_MODEL_TYPES)}")


def is_moe_config(cfg: dict[str, Any]) -> bool:
    """True when a HF ``config.json`` describes a MoE model this package runs."""
    return cfg.get("model_type") in MOE_MODEL_TYPES


def moe_args_from_hf_config(
    cfg: dict[str, Any], *, max_seq_len: int | None = None
) -> tuple[ModelArgs, MoEArgs]:
    """Translate a Mixtral, Qwen2-MoE or Qwen3-MoE ``config.json`` into ``(ModelArgs, MoEArgs)``."""
    kind = cfg.get("model_type")
    if kind not in MOE_MODEL_TYPES:
        raise ConfigError(
            f"config.json has model_type={kind!r}; the MoE models supported are "
            f"{', '.join(sorted(MOE_MODEL_TYPES))}"
        )
    n_layers = config_int(cfg, "num_hidden_layers")
    dense = dict(cfg, model_type=MOE_MODEL_TYPES[kind])
    if kind == "mixtral":
        moe = MoEArgs(
            n_experts=config_int(cfg, "num_local_experts", default=8),
            top_k=config_int(cfg, "num_experts_per_tok", default=2),
            expert_size=config_int(cfg, "intermediate_size"),
            norm_topk_prob=True,
            sparse_layers=tuple(range(n_layers)),
            style="mixtral",
        )
    else:
        step = config_int(cfg, "decoder_sparse_step", default=1)
        only = cfg.get("mlp_only_layers") or []
        if not isinstance(only, list):
            raise ConfigError(
                f"config.json mlp_only_layers must be a list of layer indices, got {only!r}"
            )
        dense_only = {check_int(i, name="config.json mlp_only_layers entry", low=0) for i in only}
        n_experts = config_int(
            cfg,
            "num_experts",
            default=config_int(cfg, "num_local_experts", default=0, low=0),
            low=0,
        )
        moe = MoEArgs(
            n_experts=n_experts,
            top_k=config_int(cfg, "num_experts_per_tok", default=1),
            expert_size=config_int(cfg, "moe_intermediate_size"),
            norm_topk_prob=config_bool(cfg, "norm_topk_prob", default=False),
            shared_expert_size=config_int(cfg, "shared_expert_intermediate_size", default=0, low=0),
            sparse_layers=tuple(
                i for i in range(n_layers) if i not in dense_only and (i + 1) % step == 0
            ),
            style=kind,
        )
    args = ModelArgs.from_hf_config(dense, max_seq_len=max_seq_len)
    if kind == "qwen2_moe":  # its config says qkv_bias (default true) instead of attention_bias
        args.qkv_bias = config_bool(cfg, "qkv_bias", default=True)
    return args, moe


def read_moe_config(
    path: str | Path, *, max_seq_len: int | None = None
) -> tuple[ModelArgs, MoEArgs]:
    """``(ModelArgs, MoEArgs)`` from ``path/config.json``."""
    cfg = load_config_json(path)
    return moe_args_from_hf_config(cfg, max_seq_len=max_seq_len)
