"""MoE prefill and decode speed against transformers' own MoE, on the same checkpoint, one run.

    torchtrt-dist bench --section moe        # with the communication and load-memory figures

Two checkpoints saved by transformers (random weights, its default initialisation): a
Qwen3-MoE-shaped one with many small experts (64 experts, top 8, hidden 256, expert size 128)
and a Mixtral-shaped one (8 experts, top 2, hidden 256, expert size 512), 4 layers each, fp32,
one thread. For each: the last position's logits of a prefill of 256 and of 1000 tokens, and
``DECODE`` greedy decode steps after the 256-token prompt, timed for

- transformers (eager; its default ``experts_implementation``, ``grouped_mm`` in 5.x), and
- ours: the MoE family's rank of the same files (``bench_rank``: as the commands build it),
  each step compiled by our backend (``inductor``): prefill runs the sorted, grouped experts
  (``ops/experts.py``); decode the "auto" choice (the gathered, fused "routed" form), and for
  comparison the grouped form forced.

Also the first MoE block alone (transformers' block, our SparseMoE in plain PyTorch), and the
Qwen3-MoE-shaped checkpoint again at EP 2 x TP 1 on 2 gloo ranks (each its 32 experts, one
thread each). transformers and ours run in turn, call by call, so that a shared machine's load
falls on both alike; a figure is the ratio of the fastest of ``REPEATS`` runs (the spread and
the ratio of CPU times, steadier on a loaded machine, are in the note). Logits are compared with
transformers' at every size, decode tokens with its greedy tokens. Our prefill attends
causally to the prompt's own keys (``is_causal``, as transformers does); the decode masks a
static KV cache, which the bench sizes to the prompt plus the decode steps (transformers' cache
grows with the sequence), so that it compares the rest of the step.
"""

from __future__ import annotations

import functools
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from torch_tensorrt_dist.bench.common import Figure

__all__ = ["SHAPES", "hf_checkpoint", "moe_speed", "speed_rank"]

_COMMON: dict[str, Any] = dict(
    hidden_size=256,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    vocab_size=1024,
    max_position_embeddings=2048,
    rms_norm_eps=1e-6,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
#: name -> (model_type, config)
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3_moe 64 experts top 8": (
        "qwen3_moe",
        dict(
            _COMMON,
            head_dim=32,
            intermediate_size=512,
            moe_intermediate_size=128,
            num_experts=64,
            num_experts_per_tok=8,
            norm_topk_prob=True,
        ),
    ),
    "mixtral 8 experts top 2": (
        "mixtral",
        dict(_COMMON, intermediate_size=512, num_local_experts=8, num_experts_per_tok=2),
    ),
}
PREFILL = (256, 1000)
DECODE = 16
REPEATS = 5
DECODE_REPEATS = 3
TOLERANCE = 1e-5


def hf_checkpoint(name: str, path: Path) -> Any:
    """Save a transformers model of shape ``SHAPES[name]`` (seed 0, transformers'
    initialisation) at ``path``; return it."""
    from torch_tensorrt_dist.testing.checkpoints import hf_checkpoint as write

    model_type, cfg = SHAPES[name]
    return write(path, model_type, std=None, **cfg)


Times = dict[str, list[float]]


def _timed(
    fns: Mapping[str, Callable[[], Any]], repeats: int = REPEATS
) -> tuple[dict[str, Any], dict[str, Times]]:
    """Each function's last result and times ({"s": wall, "cpu": this thread's CPU seconds}):
    one warm-up call each, then ``repeats`` rounds of one call of each in turn, so that the
    load of a shared machine falls on all of them alike (the CPU time is the steadier)."""
    out = {name: fn() for name, fn in fns.items()}
    times: dict[str, Times] = {name: {"s": [], "cpu": []} for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            wall, cpu = time.perf_counter(), time.thread_time()
            out[name] = fn()
            times[name]["cpu"].append(time.thread_time() - cpu)
            times[name]["s"].append(time.perf_counter() - wall)
    return out, times


CPU = torch.device("cpu")
BLOCK = 16  # setup_example's block size


def _setup(model: Any, tokens: int) -> None:
    """A paged cache of exactly one sequence of ``tokens`` tokens (blocks 1..)."""
    from torch_tensorrt_dist.generation.runner import setup_example

    setup_example(model, 1, tokens)


def _pool_blocks(model: Any) -> int:
    """The blocks of the one sequence :func:`_setup` made room for (the null block aside)."""
    return int(model.blocks[0].attention.kv_pages.k_pool.shape[0]) - 1


def _prompt(n: int) -> torch.Tensor:
    return torch.randint(
        0, _COMMON["vocab_size"], (1, n), generator=torch.Generator().manual_seed(1)
    )


def _hf_decode(hf: Any) -> Callable[[], dict[str, Any]]:
    """transformers' greedy decode after the first prompt (its prefill untimed)."""

    def run() -> dict[str, Any]:
        first = hf(_prompt(PREFILL[0]), use_cache=True)
        cache, tok = first.past_key_values, first.logits[:, -1].argmax(-1, keepdim=True)
        tokens, start = [], time.perf_counter()
        for _ in range(DECODE):
            tok = hf(tok, past_key_values=cache, use_cache=True).logits[:, -1].argmax(-1)[:, None]
            tokens.append(int(tok))
        return {"tokens": tokens, "s_per_step": (time.perf_counter() - start) / DECODE}

    return run


def _our_decode(model: Any, form: str) -> Callable[[], dict[str, Any]]:
    """Our compiled decode step with the experts' ``form``, after the first prompt (its
    prefill, plain PyTorch, untimed)."""
    from torch_tensorrt_dist.generation.runner import compile_step, paged_step
    from torch_tensorrt_dist.generation.step_inputs import StepLimits, step_inputs

    decode = compile_step(paged_step(model), "inductor")
    n = PREFILL[0]
    blocks = list(range(1, _pool_blocks(model) + 1))  # the pool of one sequence (_setup)
    limits = StepLimits(1, n, len(blocks), BLOCK)

    def run() -> dict[str, Any]:
        for moe in model.sparse_blocks:
            moe.compute = form
        prompt = _prompt(n)[0].tolist()
        tok = int(model.paged_step(*step_inputs([(prompt, 0, blocks)], limits, CPU)).argmax())
        tokens, start = [], time.perf_counter()
        for i in range(DECODE):
            inputs = step_inputs([([tok], n + i, blocks)], limits, CPU)
            tok = int(decode(*inputs).argmax())
            tokens.append(tok)
        return {"tokens": tokens, "s_per_step": (time.perf_counter() - start) / DECODE}

    return run


def _our_prefill(model: Any, form: str, n: int) -> tuple[Callable[[], Any], float]:
    """Our compiled prefill of ``n`` tokens with the experts' ``form``, and its compile time."""
    from torch_tensorrt_dist.generation.runner import compile_step, paged_step
    from torch_tensorrt_dist.generation.step_inputs import StepLimits, step_inputs

    step = compile_step(paged_step(model), "inductor")
    # the serving prefill: the prompt into its blocks, logits of its last token
    blocks = list(range(1, _pool_blocks(model) + 1))
    inputs = step_inputs(
        [(_prompt(n)[0].tolist(), 0, blocks)], StepLimits(1, n, len(blocks), BLOCK), CPU
    )

    def run() -> Any:
        for moe in model.sparse_blocks:
            moe.compute = form
        return step(*inputs)

    start = time.perf_counter()
    run()
    return run, time.perf_counter() - start


def measure(
    hf: Any | None,
    model: Any,
    forms: tuple[str, ...] = ("auto", "grouped"),
    prefill_forms: tuple[str, ...] = ("auto",),
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(transformers', ours): last-position prefill logits and times per size (ours with each
    experts form of ``prefill_forms``: key ``prefill_{n}`` for "auto", else
    ``prefill_{n}_{form}``), greedy decode tokens and seconds per step (ours with each of
    ``forms``); ours compiled by our backend (inductor). ``hf`` None: ours only (an EP rank)."""
    theirs: dict[str, Any] = {}
    ours: dict[str, Any] = {}
    with torch.no_grad():
        for n in PREFILL:
            # a cache just long enough, as transformers' grows with the sequence (the prefill
            # attends to the prompt's own keys only; the size matters to the decode after it)
            _setup(model, n + DECODE)
            fns: dict[str, Callable[[], Any]] = {}
            compile_s = {}
            for form in prefill_forms:
                key = f"prefill_{n}" if form == "auto" else f"prefill_{n}_{form}"
                fns[key], compile_s[key] = _our_prefill(model, form, n)
            if hf is not None:
                fns["hf"] = functools.partial(hf, _prompt(n), logits_to_keep=1)
            res, times = _timed(fns)
            for key in compile_s:
                ours[key] = {"logits": res[key][0], **times[key], "compile_s": compile_s[key]}
            if hf is not None:
                theirs[f"prefill_{n}"] = {"logits": res["hf"].logits[0, -1], **times["hf"]}
        _setup(model, PREFILL[0] + DECODE)
        steps = {f"decode_{form}": _our_decode(model, form) for form in forms}
        if hf is not None:
            steps["decode"] = _hf_decode(hf)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in steps}
        for _ in range(1 + DECODE_REPEATS):  # the first round compiles; then in turn
            for name, step in steps.items():
                runs[name].append(step())
        for moe in model.sparse_blocks:
            moe.compute = "auto"
    for name, results in runs.items():
        best = min(results[1:], key=lambda r: float(r["s_per_step"]))
        (theirs if name == "decode" else ours)[name] = best
    return theirs, ours


def speed_rank(rank: int, world: int, path: str) -> dict[str, Any]:
    """One rank of the EP run (``run_on_ranks(speed_rank, 2, path)``): ours only."""
    from torch_tensorrt_dist.bench.common import bench_rank

    model = bench_rank(path, rank=rank, world=world, ep=world).model()
    _, out = measure(None, model, forms=("auto",))
    for key in [k for k in out if k.startswith("prefill_")]:  # plain lists through the pipe
        out[key]["logits"] = out[key]["logits"].tolist()  # (a tensor would be shared memory)
    return out


def _spread(times: list[float]) -> str:
    ms = [1e3 * t for t in times]
    return f"min {min(ms):.1f} / median {statistics.median(ms):.1f} / max {max(ms):.1f} ms"


def _figures(
    label: str, hf: dict[str, Any], ours: dict[str, Any], *, speed_goals: bool = True
) -> list[Figure]:
    """Prefill speed and logits per size, decode speed and tokens. ``speed_goals=False`` (EP on
    gloo: 2 ranks on shared CPU cores) reports the times without a goal."""
    figures = []
    for n in PREFILL:
        h, o = hf[f"prefill_{n}"], ours[f"prefill_{n}"]
        speedup = min(h["s"]) / min(o["s"])
        want = (1.5 if n >= 1000 else 1.0) if speed_goals else None
        err = float((o["logits"] - h["logits"]).abs().max())
        figures += [
            Figure(
                "moe",
                f"{label}: prefill {n} tokens, transformers / ours time",
                round(speedup, 2),
                "x",
                goal=f">= {want}" if want else "",
                met=speedup >= want if want else None,
                note=f"transformers {_spread(h['s'])}; ours {_spread(o['s'])}; CPU time "
                f"{min(h['cpu']) / min(o['cpu']):.2f}x (compile {o['compile_s']:.0f} s)",
            ),
            Figure(
                "moe",
                f"{label}: prefill {n} tokens, max |logit - transformers'|",
                f"{err:.1e}",
                goal=f"<= {TOLERANCE:g}",
                met=err <= TOLERANCE,
                note=f"largest |logit| {float(h['logits'].abs().max()):.2f}",
            ),
        ]
        dense = ours.get(f"prefill_{n}_dense")
        if dense is not None:  # the dense form: what every prefill ran before the grouped op
            err = float((dense["logits"] - h["logits"]).abs().max())
            figures.append(
                Figure(
                    "moe",
                    f"{label}: prefill {n} tokens, ours dense / ours grouped time",
                    round(min(dense["s"]) / min(o["s"]), 2),
                    "x",
                    note=f"dense {_spread(dense['s'])}; CPU time "
                    f"{min(dense['cpu']) / min(o['cpu']):.2f}x; dense logits within {err:.1e}",
                )
            )
    h, o = hf["decode"], ours["decode_auto"]
    same = o["tokens"] == h["tokens"]
    note = f"transformers {1 / h['s_per_step']:.0f} tok/s; ours (auto: routed) "
    note += f"{1 / o['s_per_step']:.0f} tok/s"
    met = same and (not speed_goals or o["s_per_step"] <= h["s_per_step"])
    goal = "greedy tokens equal"
    if "decode_grouped" in ours:
        g = ours["decode_grouped"]
        met = met and g["tokens"] == h["tokens"] and o["s_per_step"] <= g["s_per_step"]
        note += f"; ours grouped {1 / g['s_per_step']:.0f} tok/s"
        goal = ">= 1 and auto >= grouped, greedy tokens equal"
    figures.append(
        Figure(
            "moe",
            f"{label}: decode tok/s, ours / transformers",
            round(h["s_per_step"] / o["s_per_step"], 2),
            "x",
            goal=goal,
            met=met,
            note=note,
        )
    )
    return figures


def block_run(hf: Any, model: Any) -> dict[str, Any]:
    """The first MoE block alone (transformers' sparse block, our SparseMoE in plain PyTorch:
    the grouped op the compiled prefill calls) on ``n`` random hidden states per size."""
    theirs, ours = hf.model.layers[0].mlp, model.sparse_blocks[0]
    out: dict[str, Any] = {}
    with torch.no_grad():
        for n in PREFILL:
            x = torch.randn(
                1, n, _COMMON["hidden_size"], generator=torch.Generator().manual_seed(2)
            )
            _, times = _timed(
                {"hf": functools.partial(theirs, x), "ours": functools.partial(ours, x)}
            )
            out[f"hf_{n}"], out[f"ours_{n}"] = times["hf"], times["ours"]
    return out


def _block_figures(label: str, times: dict[str, Any]) -> list[Figure]:
    figures = []
    for n in PREFILL:
        h, o = times[f"hf_{n}"], times[f"ours_{n}"]
        figures.append(
            Figure(
                "moe",
                f"{label}: MoE block alone, {n} tokens, transformers / ours time",
                round(min(h["s"]) / min(o["s"]), 2),
                "x",
                note=f"transformers {_spread(h['s'])}; ours {_spread(o['s'])}; CPU time "
                f"{min(h['cpu']) / min(o['cpu']):.2f}x",
            )
        )
    return figures


def _ep_result(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The EP ranks' prefill times (the slower rank of each run) and rank 0's logits and
    decode (the ranks step together: one all-reduce per MoE layer)."""
    out = dict(ranks[0])
    for key in [k for k in out if k.startswith("prefill_")]:
        out[key] = {
            **ranks[0][key],
            "logits": torch.tensor(ranks[0][key]["logits"]),
            "s": [max(t) for t in zip(*(r[key]["s"] for r in ranks))],
            "cpu": [max(t) for t in zip(*(r[key]["cpu"] for r in ranks))],
        }
    return out


def moe_speed() -> list[Figure]:
    from torch_tensorrt_dist.bench.common import bench_rank
    from torch_tensorrt_dist.testing import run_on_ranks

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    figures: list[Figure] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i, name in enumerate(SHAPES):
                path = Path(tmp) / str(i)
                hf = hf_checkpoint(name, path)
                torch._dynamo.reset()
                ours = bench_rank(path).model()
                figures += _block_figures(name, block_run(hf, ours))
                dense = ("auto", "dense") if i == 0 else ("auto",)  # the old prefill, once
                theirs, mine = measure(hf, ours, prefill_forms=dense)
                figures += _figures(name, theirs, mine)
                if i == 0:  # EP 2 x TP 1: each rank its half of the experts
                    ranks = run_on_ranks(speed_rank, 2, str(path), timeout=900)
                    ep = _ep_result(ranks)
                    figures += _figures(
                        f"{name}, ep 2 x tp 1 (gloo)", theirs, ep, speed_goals=False
                    )
    finally:
        torch.set_num_threads(threads)
    return figures
