"""Tiny random-weight checkpoints of transformers' own model classes (built here from their
config classes, no downloads) for the transformers-family tests, and HF's greedy reference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from torch_tensorrt_dist.testing.checkpoints import TINY, random_hf_model

#: model_type -> config overrides: windows short enough that the prompts cross them
CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {},
    "qwen3": {},
    "gemma2": dict(sliding_window=8, query_pre_attn_scalar=24),  # soft-capping, window
    "gemma3_text": dict(sliding_window=8, query_pre_attn_scalar=24),
    "phi3": {},
    "olmo2": {},
    "granite": dict(logits_scaling=2.0, attention_multiplier=0.2, residual_multiplier=0.5),
    "smollm3": {},
    "gpt_oss": dict(sliding_window=8, num_local_experts=4, num_experts_per_tok=2),
    "glm4": {},
    "mistral": dict(sliding_window=8),
    # multi-head latent attention: K of 16 + 8, V of 12; layer 0 dense, layer 1 routed experts
    # (stored one by one, fused by the loader as transformers' conversion does) and a router
    # bias (a stored buffer)
    # experts stored one by one (mixtral under its own names, block_sparse_moe.experts.{e}.w1):
    # the loader fuses them as transformers' load-time conversion does
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
    "deepseek_v3": dict(
        kv_lora_rank=16,
        q_lora_rank=24,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        head_dim=8,
        v_head_dim=12,
        num_key_value_heads=4,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        first_k_dense_replace=1,
        n_group=1,
        topk_group=1,
    ),
}

#: prompts of 19, 3 and 5 tokens: chunked prefill (budget 8), past several blocks of 4
PROMPTS = [[1, 5, 7, 9, 11, 13, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14], [3, 4, 8], [20, 21]]


def hf_model(kind: str, seed: int = 0, **overrides: Any) -> Any:
    """transformers' causal LM of ``kind``, fp32, weights and stored buffers (deepseek_v3's
    router bias) of std 0.2 (clear argmax margins)."""
    cfg = {**TINY, **CONFIGS[kind], **overrides}
    return random_hf_model(kind, seed=seed, std=0.2, attn_implementation="eager", **cfg)


def save(kind: str, root: Path, **overrides: Any) -> tuple[Path, Any]:
    """The checkpoint directory of ``kind`` under ``root`` and its transformers model."""
    model = hf_model(kind, **overrides)
    path = root / kind
    model.save_pretrained(path)
    return path, model


def tp_rank_generate(rank: int, world: int, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """In a spawned gloo rank: each job's checkpoint through the transformers family (or the
    job's ``impl``, with its ``quantize`` scheme if any) at the world's TP, its greedy tokens,
    the bytes this rank read, its pools' bytes per token and the plan's estimate of them
    (``check_kv_cache``'s)."""
    import torch.distributed as dist

    from torch_tensorrt_dist.config import GenerateJob, ModelOptions, Parallel, RunConfig
    from torch_tensorrt_dist.families import Rank, checkpoint_spec
    from torch_tensorrt_dist.generation.generate import Generator
    from torch_tensorrt_dist.generation.kv_memory import kv_layout_for
    from torch_tensorrt_dist.quantization.scheme import QuantConfig

    out = []
    for job in jobs:
        impl = job.get("impl", "transformers")
        model_options = ModelOptions(model=job["path"], model_impl=impl)
        config = RunConfig("generate", model_options, Parallel(tp=world), GenerateJob())
        if job.get("quantize"):
            config = config.with_(quantize=QuantConfig(*job["quantize"]))
        spec = checkpoint_spec(config)
        place = Rank(config, spec, spec.plan(config), rank, world, group=dist.group.WORLD)
        model = place.model()
        gen = Generator(
            model,
            engine=job["engine"],
            max_batch_size=4,
            cache_len=64,
            block_size=4,
            max_prefill_tokens=8,
        )
        res = gen.generate(job["prompts"], max_new_tokens=job["new"])
        out.append({"tokens": res.tokens, "bytes_read": model.bytes_read})
        if impl == "transformers":  # (the native model's pools are its layers')
            pools = sum(p.k_pool[0, 0].nbytes + p.v_pool[0, 0].nbytes for p in model.kv_pools)
            estimate = kv_layout_for(place.plan.args, tp=world, dtype=torch.float32, block_size=1)
            out[-1]["kv_bytes"] = (pools, estimate.bytes_per_token)
    return out
