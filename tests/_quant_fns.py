"""What the quantization tests run in spawned gloo ranks (module-level, importable)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from torch_tensorrt_dist.generation import Generator
from torch_tensorrt_dist.generation.perplexity import document_ids, perplexity
from torch_tensorrt_dist.models.demo import demo_checkpoint_path
from torch_tensorrt_dist.models.tokenizer import load_tokenizer
from torch_tensorrt_dist.parallel.llama_load import load_llama
from torch_tensorrt_dist.quantization import QuantConfig, quantize_model, weight_bytes

PROMPT = "The return statement"


def demo_tokenizer() -> Any:
    return load_tokenizer(demo_checkpoint_path(), vocab_size=1024)


def demo_tp(rank: int, world: int, text: str) -> dict[str, Any]:
    """The demo model at TP ``world``: greedy tokens of the README prompt and perplexity over
    ``text``, in fp32, int8 and int4 (group 64), plus each rank's weight bytes."""
    path = demo_checkpoint_path()
    tok = demo_tokenizer()
    ids = document_ids(text, tok)
    out: dict[str, Any] = {}
    for name, config in (
        ("fp32", None),
        ("int8", QuantConfig("int8")),
        ("int4", QuantConfig("int4", 64)),
    ):
        model = load_llama(path, group=dist.group.WORLD, progress=False)
        if config is not None:
            quantize_model(model, config, engine="none")
        nbytes = weight_bytes(model)
        ppl = perplexity(model, ids, window=64, stride=32).perplexity
        gen = Generator(model, engine="none", cache_len=64)
        tokens = gen.generate([tok.encode(PROMPT)], max_new_tokens=16).tokens[0]
        out[name] = {"tokens": tokens, "perplexity": ppl, "bytes": nbytes}
    torch._dynamo.reset()
    return out
