"""A checkpoint's ``config.json`` read by transformers, and what our core can run of it, checked
before any weight is read.

    cfg = read_hf_config(path)              # refused: remote code, unknown model_type, no LM
    check_runnable(cfg, tp=2)               # refused: attention kinds, no TP plan, heads
    args, kv = model_args(cfg, tp=2), kv_shape(cfg, tp=2)

transformers is an optional dependency of this path (``pip install
'torch_tensorrt_dist[transformers]'``); nothing from a checkpoint's own code is executed
(``trust_remote_code`` is never set).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.models.checkpoint_files import load_config_json
from torch_tensorrt_dist.models.hf_model import KVShape
from torch_tensorrt_dist.models.llama_args import ModelArgs

__all__ = [
    "ATTENTION_LAYER_TYPES",
    "causal_lm_class",
    "check_runnable",
    "kv_shape",
    "model_args",
    "read_hf_config",
    "transformers_version",
]

#: the ``layer_types`` our paged cache holds (a layer of any other kind is refused)
ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention")
INSTALL = "pip install 'torch_tensorrt_dist[transformers]'"


def transformers_version() -> str:
    """The installed transformers' version (ConfigError naming the install line if absent)."""
    try:
        import transformers
    except ImportError as exc:
        raise ConfigError(
            f"the transformers model family needs the transformers package ({exc}); {INSTALL}"
        ) from None
    return str(transformers.__version__)


def read_hf_config(path: str | Path) -> Any:
    """``config.json`` as transformers' config class of its ``model_type`` (its text part for a
    multimodal one). Refused: a checkpoint with its own code (``auto_map``), a ``model_type``
    transformers does not know (naming its version), one without a causal-LM class."""
    raw = load_config_json(path)
    kind = raw.get("model_type")
    if "auto_map" in raw:
        raise ConfigError(
            f"{path}/config.json names its own code (auto_map: {sorted(raw['auto_map'])}): "
            "code from a checkpoint is never executed (no trust_remote_code); use a model "
            "whose model_type transformers ships"
        )
    version = transformers_version()
    from transformers import CONFIG_MAPPING, AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if not isinstance(kind, str) or kind not in CONFIG_MAPPING:
        raise ConfigError(
            f"{path}/config.json has model_type={kind!r}, which transformers {version} does "
            "not know; upgrade transformers, or use a checkpoint of a known model type"
        )
    if kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ConfigError(
            f"model_type {kind!r} has no causal-LM class in transformers {version} "
            "(AutoModelForCausalLM): only decoder language models run"
        )
    return AutoConfig.from_pretrained(str(path), trust_remote_code=False)


def causal_lm_class(cfg: Any) -> Any:
    """transformers' causal-LM class of ``cfg``."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM._model_mapping[type(cfg)]


def _text(cfg: Any) -> Any:
    return cfg.get_text_config()


def check_runnable(cfg: Any, *, tp: int) -> None:
    """What the paged core cannot hold, refused by name: a layer that is not attention
    (linear attention, state-space layers), a model whose attention does not go through
    transformers' ``AttentionInterface``; for ``tp`` > 1, no ``base_model_tp_plan`` or head
    counts that ``tp`` does not divide."""
    text, kind = _text(cfg), cfg.model_type
    other = sorted(set(getattr(text, "layer_types", None) or ()) - set(ATTENTION_LAYER_TYPES))
    if other:
        raise ConfigError(
            f"model_type {kind!r} has layers of kind {', '.join(other)}: the paged KV cache "
            f"holds attention layers only ({', '.join(ATTENTION_LAYER_TYPES)})"
        )
    cls = causal_lm_class(cfg)
    if not getattr(cls, "_supports_attention_backend", False):
        raise ConfigError(
            f"{cls.__name__} ({kind!r}) does not call transformers' AttentionInterface (its "
            "attention, or state-space layers, cannot use the paged KV cache); use --model-impl "
            "native where a native family runs it"
        )
    if tp > 1:
        if not getattr(text, "base_model_tp_plan", None):
            raise ConfigError(
                f"model_type {kind!r} has no base_model_tp_plan in transformers "
                f"{transformers_version()}: it runs with --tp 1 only"
            )
        heads = text.num_attention_heads
        kv_heads = getattr(text, "num_key_value_heads", None) or heads
        if text.vocab_size % tp:
            raise ConfigError(
                f"--tp {tp} does not divide the vocabulary of {kind!r} ({text.vocab_size}): "
                "the LM head's logits are gathered from equal shards; use a --tp that divides it"
            )
        if heads % tp or kv_heads % tp:
            raise ConfigError(
                f"--tp {tp} does not divide the attention heads of {kind!r} ({heads} query, "
                f"{kv_heads} key/value heads): use a --tp that divides both"
            )


def kv_shape(cfg: Any, *, tp: int) -> KVShape:
    """One rank's K/V heads (as the model's TP plan splits them) and head sizes (multi-head
    latent attention: K = nope + rope dims, V its own, one KV head per query head)."""
    text = _text(cfg)
    heads = text.num_attention_heads
    if getattr(text, "qk_nope_head_dim", None) is not None:  # MLA
        k_dim = text.qk_nope_head_dim + text.qk_rope_head_dim
        return KVShape(heads // tp, k_dim, text.v_head_dim)
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    if tp > 1:  # the plan may keep every head on every rank (a gathered qkv, none at all)
        from transformers.distributed.tensor_parallel import get_kv_heads_per_rank

        kv_heads = get_kv_heads_per_rank(text.base_model_tp_plan or {}, kv_heads, tp)
    return KVShape(kv_heads, head_dim, head_dim)


def model_args(cfg: Any, *, tp: int = 1) -> ModelArgs:
    """The sizes the core reads of a model (vocabulary, layers, heads, positions, the MLP's
    width for the scheduler's estimate) as :class:`ModelArgs`. Its KV heads and head size are
    those whose estimate (``generation/kv_memory.kv_layout_for`` at this ``tp``) is what a
    rank's pools hold (:meth:`KVShape.layout`: K and V of different sizes, a plan that keeps
    every KV head on every rank)."""
    text = _text(cfg)
    heads = text.num_attention_heads
    kv_heads, head_dim = kv_shape(cfg, tp=tp).layout()  # one rank's
    if heads % (kv_heads * tp):  # as one head per rank of all of them (tp divides heads)
        kv_heads, head_dim = 1, kv_heads * head_dim
    eos = getattr(text, "eos_token_id", None)
    ffn = getattr(text, "intermediate_size", None) or 4 * text.hidden_size
    return ModelArgs(
        dim=text.hidden_size,
        n_layers=text.num_hidden_layers,
        n_heads=heads,
        n_kv_heads=kv_heads * tp,
        vocab_size=text.vocab_size,
        intermediate_size=ffn,
        head_dim=head_dim,
        max_seq_len=getattr(text, "max_position_embeddings", None) or 2048,
        tie_embeddings=bool(getattr(text, "tie_word_embeddings", False)),
        bos_token_id=getattr(text, "bos_token_id", None),
        eos_token_ids=tuple(eos if isinstance(eos, list) else () if eos is None else (eos,)),
    )
