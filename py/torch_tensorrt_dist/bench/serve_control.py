"""``bench --section serve_control``: the demo model served at TP 1 and 2, and HF's batching.

For TP 1 and TP 2 (the demo model, Inductor engine, 8 KV-cache rows), a server process on
127.0.0.1 gets the same streamed requests from 1 and then from 8 concurrent asyncio clients
(``serve_load.py``): output tokens/s, time to first token and inter-token latency (p50/p99, as
the clients see them), and the control channel's cost per decode step. HF transformers'
continuous batching (``generate_batch``) runs the same prompts on the same checkpoint, greedy,
in this process, for the same tokens. Every figure of one run is compared within that run.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

from torch_tensorrt_dist.bench.common import Figure
from torch_tensorrt_dist.bench.serve_load import Load, ServerProcess, run_load

__all__ = ["PROMPTS", "hf_generate_batch", "serve_figures"]

#: prompts of the demo model that run to the token limit without an end-of-text token
PROMPTS = [
    "The for statement is used",
    "A class definition defines a class object",
    "Python",
    "Exceptions",
    "The while statement is used for repeated execution",
    "A function definition defines a user-defined function object",
    "The try statement specifies exception handlers",
    "The with statement is used to wrap the execution of a block",
]
SECTION = "serve_control (CPU, gloo, demo model)"


def hf_generate_batch(prompts: list[list[int]], max_tokens: int) -> tuple[float, list[list[int]]]:
    """HF transformers' continuous batching on the demo checkpoint: (tokens/s, tokens)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    from torch_tensorrt_dist.models.demo import demo_checkpoint_path

    saved = torch.get_num_threads()
    torch.set_num_threads(1)  # as each of our ranks runs
    try:
        model = AutoModelForCausalLM.from_pretrained(demo_checkpoint_path(), dtype=torch.float32)
        cfg = GenerationConfig(
            max_new_tokens=max_tokens, do_sample=False, eos_token_id=1, pad_token_id=0
        )
        model.eval().generate_batch(inputs=prompts[:1], generation_config=cfg)  # warm-up
        start = time.perf_counter()
        out = model.generate_batch(inputs=prompts, generation_config=cfg)
        wall = time.perf_counter() - start
    finally:
        torch.set_num_threads(saved)
    tokens = [list(o.generated_tokens) for o in out.values()]
    return sum(map(len, tokens)) / wall, tokens


def _delta(after: dict[str, float], before: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def _serve_tp(tp: int, engine: str, requests: int, max_tokens: int) -> dict[str, Any]:
    args = [
        "--tp",
        str(tp),
        "--engine",
        engine,
        "--max-batch-size",
        "8",
        "--max-seq-len",
        "64",
        "--served-model-name",
        "demo",
    ]
    out: dict[str, Any] = {"loads": {}}
    with ServerProcess(args) as server:
        for c in (1, 8):
            # a short round first: the clients' connections are open before timing starts
            asyncio.run(run_load(server.url, PROMPTS, requests=c, concurrency=c, max_tokens=4))
            before = server.metrics()
            load = run_load(
                server.url, PROMPTS, requests=requests, concurrency=c, max_tokens=max_tokens
            )
            out["loads"][c] = asyncio.run(load)
            after = server.metrics()
            steps = _delta(after, before, "torchtrt_step_seconds_count") or 1.0
            out[f"step_ms_{c}"] = 1e3 * _delta(after, before, "torchtrt_step_seconds_sum") / steps
            out[f"control_ms_{c}"] = (
                1e3 * _delta(after, before, "torchtrt_control_seconds_sum") / steps
            )
        out["latency_ms"] = 1e3 * server.metrics().get("torchtrt_control_latency_seconds", 0.0)
    summaries = re.findall(r"rank (\d+): \d+ decode steps.*?\(([\d.]+) %\)", server.output())
    out["rank_control_pct"] = {int(r): float(p) for r, p in summaries}
    out["exit"] = server.returncode
    return out


def serve_figures(
    requests: int = 16, max_tokens: int = 32, engine: str = "inductor"
) -> list[Figure]:
    from torch_tensorrt_dist.models.demo import demo_checkpoint_path
    from torch_tensorrt_dist.models.tokenizer import load_tokenizer

    runs = {tp: _serve_tp(tp, engine, requests, max_tokens) for tp in (1, 2)}
    tok = load_tokenizer(demo_checkpoint_path(), vocab_size=1024)
    ids = [tok.encode(p) for p in PROMPTS]
    try:
        hf_tps, hf_tokens = hf_generate_batch(ids, max_tokens)
    except ImportError as exc:  # transformers is a dev dependency
        hf_tps, hf_tokens = 0.0, []
        missing = f"skipped: {exc.name} is not installed (pip install -e '.[dev]')"
    else:
        missing = ""
    hf_texts = [tok.decode([i for i in t if i not in tok.eos_ids]) for t in hf_tokens]
    figures: list[Figure] = []
    for tp, run in runs.items():
        one, eight = run["loads"][1], run["loads"][8]
        name = f"TP {tp}"
        figures += [
            Figure(
                SECTION,
                f"{name}: output tokens/s, C = 1 / C = 8",
                f"{one.tokens_per_s:.1f} / {eight.tokens_per_s:.1f}",
                "tok/s",
                note=f"{requests} requests x {max_tokens} tokens, {engine}",
            ),
            Figure(
                SECTION,
                f"{name}: C = 8 over C = 1",
                round(eight.tokens_per_s / max(one.tokens_per_s, 1e-9), 2),
                "x",
                goal=">= 4x at TP 2" if tp == 2 else "",
                met=eight.tokens_per_s >= 4 * one.tokens_per_s if tp == 2 else None,
            ),
            Figure(
                SECTION,
                f"{name}: time to first token p50 / p99, C = 8",
                f"{1e3 * eight.p('ttft', 0.5):.0f} / {1e3 * eight.p('ttft', 0.99):.0f}",
                "ms",
                note=f"C = 1: {1e3 * one.p('ttft', 0.5):.0f} / {1e3 * one.p('ttft', 0.99):.0f}",
            ),
            Figure(
                SECTION,
                f"{name}: inter-token latency p50 / p99, C = 8",
                f"{1e3 * eight.p('itl', 0.5):.1f} / {1e3 * eight.p('itl', 0.99):.1f}",
                "ms",
                note=f"C = 1: {1e3 * one.p('itl', 0.5):.1f} / "
                f"{1e3 * one.p('itl', 0.99):.1f}; decode step {run['step_ms_8']:.1f} ms",
            ),
        ]
        if tp > 1:
            share = run["latency_ms"] / max(run["step_ms_8"], 1e-9)
            ranks = ", ".join(
                f"rank {r} {p:.1f} %" for r, p in sorted(run["rank_control_pct"].items())
            )
            figures += [
                Figure(
                    SECTION,
                    f"{name}: control channel share of a decode step",
                    f"{100 * share:.2f} %",
                    goal="< 5 %",
                    met=share < 0.05,
                    note=f"header one-way {1e3 * run['latency_ms']:.0f} us vs step "
                    f"{run['step_ms_8']:.1f} ms (C = 8)",
                ),
                Figure(
                    SECTION,
                    f"{name}: time in the control exchange per decode step",
                    f"{run['control_ms_8']:.2f}",
                    "ms",
                    note=f"rank 0 (sends); whole run by rank: {ranks} (a rank != 0 also "
                    "waits there for rank 0's host work: HTTP, text, scheduling)",
                ),
            ]
    ours: Load = runs[2]["loads"][8]
    same = bool(hf_texts) and ours.texts[: len(hf_texts)] == hf_texts
    figures += [
        Figure(
            SECTION,
            "HF generate_batch, 8 requests, 1 process",
            round(hf_tps, 1),
            "tok/s",
            note=missing or "transformers continuous batching, same prompts, greedy, 1 thread",
        ),
        Figure(
            SECTION,
            "TP 2, C = 8 over HF generate_batch",
            round(ours.tokens_per_s / max(hf_tps, 1e-9), 2),
            "x",
            goal="> 1x",
            met=ours.tokens_per_s > hf_tps if hf_tps else None,
        ),
        Figure(
            SECTION,
            "same greedy text as HF generate_batch",
            same,
            goal="True",
            met=same if hf_texts else None,
        ),
        Figure(
            SECTION,
            "servers drained on SIGTERM, exit 0",
            all(r["exit"] == 0 for r in runs.values()),
            goal="True",
            met=all(r["exit"] == 0 for r in runs.values()),
        ),
    ]
    return figures
