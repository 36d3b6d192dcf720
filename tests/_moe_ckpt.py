"""Tiny Mixtral / Qwen2-MoE checkpoints (made here with transformers, no downloads) and the
function the multi-rank MoE tests run in spawned gloo ranks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from torch_tensorrt_dist.testing.checkpoints import hf_checkpoint, random_hf_model

_COMMON = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=130,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)

#: name -> (model_type, config overrides). 4 experts, top 2; Qwen2-MoE with a
#: shared expert, no top-k renormalisation and its second layer dense (mlp_only_layers);
#: Qwen3-MoE with its per-head q/k norms.
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "mixtral": ("mixtral", dict(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2)),
    "qwen2_moe": (
        "qwen2_moe",
        dict(
            intermediate_size=64,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
            mlp_only_layers=[1],
        ),
    ),
    "qwen3_moe": (
        "qwen3_moe",
        dict(
            intermediate_size=64,
            moe_intermediate_size=16,
            num_experts=4,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            head_dim=16,
        ),
    ),
}


def hf_model(name: str, seed: int = 0, **overrides: Any) -> Any:
    """A transformers MoE model with weights of std 0.3 (clear argmax margins)."""
    kind, cfg = CONFIGS[name]
    return random_hf_model(kind, seed=seed, **{**_COMMON, **cfg, **overrides})


def save_checkpoint(name: str, path: Path, **overrides: Any) -> Any:
    kind, cfg = CONFIGS[name]
    return hf_checkpoint(path, kind, **{**_COMMON, **cfg, **overrides})


def moe_suite(rank: int, world: int, spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Every job of spec["jobs"] ({path, ep, tp, prompts, max_new_tokens, engine?}) on this
    rank: generated tokens, prefill logits, bytes read and held, the compiled graphs'
    collectives (op, group ranks, module)."""
    from torch_tensorrt_dist.backend import recording
    from torch_tensorrt_dist.generation import Generator
    from torch_tensorrt_dist.parallel.moe import make_moe_mesh, moe_groups
    from torch_tensorrt_dist.parallel.moe_load import load_moe

    out = []
    for job in spec["jobs"]:
        torch._dynamo.reset()
        groups = moe_groups(make_moe_mesh(job["ep"], job["tp"]))
        model = load_moe(job["path"], groups=groups, progress=False)
        held = sum(p.numel() * p.element_size() for p in model.parameters())
        model.setup_caches(1, 16)
        with torch.no_grad():
            logits = model(torch.tensor([job["prompts"][0]]), torch.arange(len(job["prompts"][0])))
        gen = Generator(model, engine=job.get("engine", "none"), max_batch_size=1, cache_len=64)
        with recording() as graphs:
            tokens = [
                gen.generate([p], max_new_tokens=job["max_new_tokens"]).tokens[0]
                for p in job["prompts"]
            ]
        out.append(
            {
                "tokens": tokens,
                "logits": logits.tolist(),
                "bytes_read": model.bytes_read,
                "bytes_held": held,
                "graphs": [
                    [(c.op, list(c.group_ranks), c.module) for c in g.collectives] for g in graphs
                ],
            }
        )
    return out
