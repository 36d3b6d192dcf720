"""The transformers family's decode step against the native family's on one Llama checkpoint
(``bench --section hf_family``), TP 1, at 1 and 8 rows, through the ``eager`` engine (our
backend's graphs run without Inductor) and the ``inductor`` engine; and native Qwen3's decode
step against native Llama's of the same shape (Inductor, 1 and 8 rows).

The checkpoints are small random-weight models built with transformers' own config classes and
saved as checkpoint directories. For the first figure both families load the Llama one
(``--model-impl native`` / ``transformers``), decode the same prompts greedily and must give
the same tokens. The second loads a Qwen3 and a Llama of the same sizes (Qwen3: per-head q / k
RMSNorm, no qkv bias) through the native family. Each figure is the ratio of two mean decode
step times (``GenerationResult.decode_s / decode_steps``: the step as the serving core runs it),
each the best of 5 runs, the two models' runs alternating, after a warm-up run that compiles
every shape class.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from torch_tensorrt_dist.bench.common import Figure

__all__ = ["checkpoint", "hf_family", "llama_checkpoint", "qwen3_figures", "step_ms"]

SECTION = "hf_family (CPU, TP 1, Llama)"
#: the goal: the transformers family's decode step within this factor of the native one's
GOAL = 1.15
QWEN3_SECTION = "hf_family (CPU, TP 1, native Qwen3 vs Llama)"


def checkpoint(
    root: Path, model_type: str = "llama", *, layers: int = 4, hidden: int = 256, vocab: int = 512
) -> Path:
    """A random-weight checkpoint of ``model_type`` (llama, qwen3) saved by transformers: GQA
    8 / 4 heads of ``hidden / 8``, an untied head."""
    import torch
    import transformers

    config_class: Any = transformers.CONFIG_MAPPING[model_type]
    cfg = config_class(
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=hidden // 8,
        vocab_size=vocab,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.05)
    path = root / model_type
    model.save_pretrained(path)
    return path


def llama_checkpoint(root: Path, **sizes: int) -> Path:
    """:func:`checkpoint` of a Llama."""
    return checkpoint(root, "llama", **sizes)


def _model(path: Path, impl: str) -> Any:
    from torch_tensorrt_dist.config import GenerateJob, ModelOptions, Parallel, RunConfig
    from torch_tensorrt_dist.families import Rank, checkpoint_spec

    config = RunConfig(
        "generate", ModelOptions(model=str(path), model_impl=impl), Parallel(tp=1), GenerateJob()
    )
    spec = checkpoint_spec(config)
    return Rank(config, spec, spec.plan(config)).model()


def step_ms(
    models: dict[str, Any], engine: str, rows: int, *, tokens: int = 32, repeats: int = 5
) -> dict[str, tuple[float, list[list[int]]]]:
    """Per model: the best mean decode step time (ms) of ``rows`` prompts decoding ``tokens``
    tokens together, and their tokens; the models' runs alternate (a burst of load on the
    machine falls on both)."""
    from torch_tensorrt_dist.generation.generate import Generator

    prompts = [[1 + (7 * r + i) % 500 for i in range(6 + r)] for r in range(rows)]
    gens = {
        name: Generator(model, engine=engine, max_batch_size=rows, cache_len=128, block_size=16)
        for name, model in models.items()
    }
    for gen in gens.values():
        gen.generate(prompts, max_new_tokens=tokens)  # warm-up: every shape class compiled
    out: dict[str, tuple[float, list[list[int]]]] = {n: (float("inf"), []) for n in gens}
    for _ in range(repeats):
        for name, gen in gens.items():
            res = gen.generate(prompts, max_new_tokens=tokens)
            ms = 1e3 * res.decode_s / max(res.decode_steps, 1)
            out[name] = (min(out[name][0], ms), res.tokens)
    return out


def hf_family(
    engines: tuple[str, ...] = ("eager", "inductor"), rows: tuple[int, ...] = (1, 8)
) -> list[Figure]:
    figures = []
    with tempfile.TemporaryDirectory() as tmp:
        path = llama_checkpoint(Path(tmp))
        models = {impl: _model(path, impl) for impl in ("native", "transformers")}
        for engine in engines:
            for r in rows:
                got = step_ms(models, engine, r)
                (native, native_tokens), (hf, hf_tokens) = got["native"], got["transformers"]
                ratio = hf / native
                figures.append(
                    Figure(
                        SECTION,
                        f"transformers / native decode step, {engine}, {r} row(s)",
                        round(ratio, 3),
                        "x",
                        goal=f"<= {GOAL}",
                        met=ratio <= GOAL and hf_tokens == native_tokens,
                        note=f"{hf:.2f} vs {native:.2f} ms/step; same tokens: "
                        f"{hf_tokens == native_tokens}",
                    )
                )
    return figures + qwen3_figures(rows, engine="inductor")


def qwen3_figures(rows: tuple[int, ...] = (1, 8), engine: str = "inductor") -> list[Figure]:
    """Native Qwen3's decode step over native Llama's, the same shape (the goal: <= 1)."""
    import torch

    torch._dynamo.reset()  # a fresh Dynamo state: the figures do not depend on what ran before
    figures = []
    with tempfile.TemporaryDirectory() as tmp:
        models = {t: _model(checkpoint(Path(tmp), t), "native") for t in ("qwen3", "llama")}
        for r in rows:
            got = step_ms(models, engine, r)
            ratio = got["qwen3"][0] / got["llama"][0]
            figures.append(
                Figure(
                    QWEN3_SECTION,
                    f"qwen3 / llama decode step (native), {engine}, {r} row(s)",
                    round(ratio, 3),
                    "x",
                    goal="<= 1.0",
                    met=ratio <= 1.0,
                    note=f"{got['qwen3'][0]:.2f} vs {got['llama'][0]:.2f} ms/step",
                )
            )
    return figures
