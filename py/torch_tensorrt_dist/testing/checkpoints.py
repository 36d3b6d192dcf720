"""Random-weight checkpoints made in-process (no downloads), for the tests and the benchmarks.

    model = hf_checkpoint(path, "mixtral", hidden_size=64, ...)   # transformers' class, saved
    write_checkpoint(path, config, {"name": (rows, cols), ...})   # exactly these tensors

:func:`hf_checkpoint` builds transformers' own class of a ``model_type`` from its config
fields, draws its weights (seeded) and saves it as transformers does; it returns the model, the
reference the tests compare with. :func:`write_checkpoint` writes ``config.json`` and one
``model.safetensors`` of the named tensors: a family transformers does not ship (the toy
family), or a size whose transformers model would be slow to build (the memory benchmarks,
with names from ``models/weights_check.py``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch_tensorrt_dist.models.llama_args import ModelArgs

__all__ = [
    "TINY",
    "TINY_EXPERTS",
    "first_layers_checkpoint",
    "hf_checkpoint",
    "hf_greedy",
    "llama_config",
    "random_hf_model",
    "write_checkpoint",
]

#: a tiny transformers config's sizes (two layers of 64, grouped-query attention, 256 tokens;
#: no bos or eos token), under transformers' field names: ``random_hf_model(kind, **TINY)``
TINY: dict[str, Any] = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=256,
    max_position_embeddings=256,
    pad_token_id=0,
    bos_token_id=None,
    eos_token_id=None,
)
#: tiny routed experts: 4 (under each family's name for their number), 2 per token, of 32
TINY_EXPERTS: dict[str, Any] = {
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts"), 4),
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
}


def random_hf_model(
    model_type: str,
    *,
    seed: int = 0,
    std: float | None = 0.3,
    attn_implementation: str | None = None,
    **config: Any,
) -> Any:
    """transformers' causal LM of ``model_type`` and ``config`` (fp32, eval); weights
    and stored floating buffers N(0, ``std``) drawn after ``torch.manual_seed(seed)`` (a large
    std gives clear argmax margins), or transformers' own initialisation when ``std`` is None."""
    import transformers

    cfg = transformers.CONFIG_MAPPING[model_type](**config)
    torch.manual_seed(seed)
    kwargs = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, **kwargs)
    if std is not None:
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, std)
            stored = model.state_dict()  # buffers a checkpoint holds (a router's bias)
            for name, b in model.named_buffers():
                if name in stored and b.is_floating_point():
                    b.normal_(0.0, std)
    return model.eval()


def hf_greedy(model: Any, prompts: list[list[int]], new: int) -> list[list[int]]:
    """transformers' own greedy ``generate`` of each prompt alone (exactly ``new`` tokens): the
    reference a checkpoint's tokens are compared with."""
    out = []
    for p in prompts:
        ids = model.generate(
            torch.tensor([p]), max_new_tokens=new, min_new_tokens=new, do_sample=False
        )
        out.append(ids[0, len(p) :].tolist())
    return out


def hf_checkpoint(
    path: str | Path,
    model_type: str,
    *,
    seed: int = 0,
    std: float | None = 0.3,
    shard_kb: int | None = None,
    **config: Any,
) -> Any:
    """Save :func:`random_hf_model` at ``path`` (split in files of ``shard_kb`` KB with an
    index, when given); return the model."""
    model = random_hf_model(model_type, seed=seed, std=std, **config)
    kwargs = {"max_shard_size": f"{shard_kb}KB"} if shard_kb else {}
    model.save_pretrained(path, **kwargs)
    return model


def write_checkpoint(
    path: str | Path,
    config: Mapping[str, Any],
    shapes: Mapping[str, tuple[int, ...]],
    *,
    seed: int = 0,
    std: float = 0.02,
) -> int:
    """``config.json`` and ``model.safetensors`` of the tensors ``shapes`` (fp32, N(0,
    ``std``), drawn in the given order from ``seed``); returns the bytes of the tensors."""
    from safetensors.torch import save_file

    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    tensors = {name: torch.randn(shape, generator=gen) * std for name, shape in shapes.items()}
    save_file(tensors, str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps(dict(config)))
    return sum(t.numel() * t.element_size() for t in tensors.values())


def llama_config(args: ModelArgs, **fields: Any) -> dict[str, Any]:
    """The ``config.json`` of a Llama of ``args`` (fp32, untied), ``fields`` added or
    replacing (another ``model_type`` and its own fields)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": args.dim,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads,
        "vocab_size": args.vocab_size,
        "intermediate_size": args.intermediate_size,
        "max_position_embeddings": args.max_seq_len,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        **fields,
    }


def first_layers_checkpoint(src: str | Path, dst: str | Path, n_layers: int) -> Path:
    """A Llama checkpoint of ``src``'s first ``n_layers`` layers, its embeddings, final norm
    and head (a draft model of ``src`` for speculative decoding: the same tokenizer, its
    files copied); returns ``dst``."""
    import shutil

    from safetensors import safe_open
    from safetensors.torch import save_file

    src, root = Path(src), Path(dst)
    root.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "config.json").read_text())
    if not 1 <= n_layers <= config["num_hidden_layers"]:
        raise ValueError(f"{n_layers} layers of {config['num_hidden_layers']}")
    config["num_hidden_layers"] = n_layers
    tensors = {}
    with safe_open(str(src / "model.safetensors"), "pt") as f:
        for name in f.keys():  # noqa: SIM118  (safe_open has no __iter__)
            parts = name.split(".")
            if "layers" in parts and int(parts[parts.index("layers") + 1]) >= n_layers:
                continue
            tensors[name] = f.get_tensor(name)
    save_file(tensors, str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (src / name).exists():
            shutil.copy(src / name, root / name)
    return root
