"""Tiny Hugging Face checkpoints (made here with transformers, no downloads) for the Llama tests,
and the functions the multi-rank Llama tests run in spawned gloo ranks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from torch_tensorrt_dist.testing.checkpoints import hf_checkpoint, random_hf_model

_COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)

#: name -> (transformers model type, config overrides). GQA, bias, tied, scaled RoPE, window;
#: Qwen3's per-head q/k norms with a head_dim (24) that is not hidden_size / heads (16).
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama_gqa": (
        "llama",
        dict(
            num_key_value_heads=2,
            vocab_size=160,
            attention_bias=True,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        ),
    ),
    "qwen2_tied": ("qwen2", dict(num_key_value_heads=2, vocab_size=130, tie_word_embeddings=True)),
    "mistral_window": (
        "mistral",
        dict(num_key_value_heads=1, vocab_size=128, sliding_window=6, head_dim=16),
    ),
    "qwen3_hd24": ("qwen3", dict(num_key_value_heads=2, vocab_size=128, head_dim=24)),
}


def hf_model(name: str, seed: int = 0, **overrides: Any) -> Any:
    """A transformers model of config ``name`` with weights of std 0.3 (clear argmax margins)."""
    kind, cfg = CONFIGS[name]
    return random_hf_model(kind, seed=seed, **{**_COMMON, **cfg, **overrides})


def save_checkpoint(name: str, path: Path, *, shard_kb: int | None = None, **overrides: Any) -> Any:
    kind, cfg = CONFIGS[name]
    return hf_checkpoint(path, kind, shard_kb=shard_kb, **{**_COMMON, **cfg, **overrides})


def hf_greedy(model: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    out = model.generate(
        torch.tensor([prompt]),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        min_new_tokens=max_new_tokens,
    )
    return out[0, len(prompt) :].tolist()


def rank_suite(rank: int, world: int, spec: dict[str, Any]) -> dict[str, Any]:
    """Everything the multi-rank Llama tests check, in one spawn of ``world`` gloo ranks.

    spec["logits"]: [(path, lm_head, embedding)] -> prefill and decode logits of the sharded
    model, and the shapes of its vocabulary matrices;
    spec["generate"]: [{path, prompts, max_new_tokens, engine?, sampling?, lm_head?}] ->
    generated tokens, and the number of graphs the backend compiled for the job.
    """
    import torch.distributed as dist

    from torch_tensorrt_dist.backend import recording
    from torch_tensorrt_dist.generation import Generator, SamplingConfig
    from torch_tensorrt_dist.parallel.llama_load import load_llama

    group = dist.group.WORLD
    out: dict[str, Any] = {"logits": [], "generate": []}
    for path, lm_head, embedding in spec.get("logits", []):
        model = load_llama(path, group=group, lm_head=lm_head, embedding=embedding, progress=False)
        prefill, decode = _prefill_decode(model)
        attn = model.blocks[0].attention
        out["logits"].append(
            {
                "prefill": prefill.tolist(),
                "decode": decode.tolist(),
                "heads": (attn.n_heads, attn.n_kv_heads),
                "wk": list(attn.wk.weight.shape),
                "embedding_rows": model.tok_embeddings.weight.shape[0],
                "head_rows": None if model.output is None else model.output.weight.shape[0],
            }
        )
    for job in spec.get("generate", []):
        torch._dynamo.reset()
        model = load_llama(
            job["path"], group=group, lm_head=job.get("lm_head", "vocab_parallel"), progress=False
        )
        gen = Generator(
            model,
            engine=job.get("engine", "none"),
            max_batch_size=max(len(p) for p in job["batches"]),
            cache_len=64,
        )
        sampling = SamplingConfig(**job.get("sampling", {}))
        with recording() as graphs:
            tokens = [
                gen.generate(
                    prompts, max_new_tokens=job["max_new_tokens"], sampling=sampling
                ).tokens
                for prompts in job["batches"]
            ]
        out["generate"].append({"tokens": tokens, "graphs": len(graphs)})
    return out


def _prefill_decode(model: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of a left-padded batch prefill and one decode step."""
    model.setup_caches(2, 32)
    tokens = torch.randint(
        0, model.args.vocab_size, (2, 10), generator=torch.Generator().manual_seed(5)
    )
    pad = torch.tensor([0, 3])
    with torch.no_grad():
        prefill = model(tokens, torch.arange(10), pad)
        decode = model(tokens[:, :1], torch.tensor([10]), pad)
    return prefill, decode
