"""The serving benchmark's checkpoint: the issues' random-weight Llama, made in-process.

    path = bench_checkpoint(tmp_dir)       # config.json, model.safetensors, tokenizer files

A Llama of hidden 256, 8 layers, 8 heads / 4 KV heads, fp32, 4096 positions, random weights
(seed 0), with the demo model's tokenizer (``data/demo``: a 1024-token BPE; a real tokenizer,
so prompts are text both servers tokenize alike, and ``transformers serve`` loads it as is).
The end-of-text token's output row is zero: its logit is 0 while the others spread both ways,
so greedy decoding never stops early and every request runs to its token limit on both servers
(random weights would otherwise end some requests after a few tokens, which makes tokens/s
depend on the prompt).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

__all__ = ["CHECKPOINT", "bench_checkpoint"]

#: the checkpoint's shape (transformers ``LlamaConfig`` arguments)
CHECKPOINT: dict[str, Any] = dict(
    hidden_size=256,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=4,
    intermediate_size=768,
    vocab_size=1024,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)


def bench_checkpoint(out_dir: str | Path, *, seed: int = 0) -> Path:
    """Write the benchmark checkpoint (fp32) and the demo tokenizer to ``out_dir``."""
    import torch

    from torch_tensorrt_dist.models.demo import demo_checkpoint_path
    from torch_tensorrt_dist.testing.checkpoints import random_hf_model

    demo = Path(demo_checkpoint_path())
    special = json.loads((demo / "config.json").read_text())
    bos, eos = int(special["bos_token_id"]), int(special["eos_token_id"])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = random_hf_model(
        "llama", seed=seed, std=None, **CHECKPOINT, bos_token_id=bos, eos_token_id=eos
    )
    with torch.no_grad():
        model.lm_head.weight[eos].zero_()  # greedy never ends a request early (docstring)
    model.save_pretrained(out, safe_serialization=True)
    shutil.copy(demo / "tokenizer.json", out / "tokenizer.json")
    tok_config = json.loads((demo / "tokenizer_config.json").read_text())
    tok_config["model_max_length"] = CHECKPOINT["max_position_embeddings"]
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    return out
