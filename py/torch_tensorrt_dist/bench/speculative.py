"""Speculative decoding (prompt lookup, a draft model) on the demo model, TP 1, in one process.

    speculative_figures()                    # Inductor, as generate and serve run on a CPU
    speculative_figures(engine="none")       # plain PyTorch
    speculative_figures(cpu_time=True)       # the process's CPU time, not the wall clock
    verify_cost_figures(torch.bfloat16)      # the verify-cost figures alone, of one dtype
    draft_figures()                          # the draft model's figures alone

Figures, each from blocks alternated in the same run (each variant's best block: load only
ever slows one):

- the verify call of R rows x (k + 1) tokens against a decode step of R rows (k = 4, R = 1,
  4 and 8), the compiled graphs the core calls, at position 64 of each row; and against a
  decode step of R x (k + 1) rows, the same token rows: what the verify call's own path
  (attention over k + 1 tokens, the logits of each) costs beyond the tokens it computes; with
  the weights in float32 and in bfloat16 (:data:`DTYPES`; both sides of a ratio in one dtype:
  ``verify_cost_figures``);
- ``generate``'s decode speed (tokens after the first / time after the first) with and
  without prompt lookup, on quoting prompts (a pydoc passage the model was trained on, then
  its first words again) and on text that matches nothing, with the mean tokens a step;
- (with ``cpu_time`` the ``generate`` figures are the process's CPU time after each prompt's
  first token: on a machine shared with other busy processes the wall clock measures the
  load)
- whether speculation turns 0.8 of its tokens per step into speed-up (speed-up >= 0.8 x
  tokens a step / verify-cost ratio at R = 1);
- with a draft model (``draft_figures``): its acceptance rate and the decode speed-up over
  plain decoding, the 8 prompts batched, runs alternated. No smaller model was trained with
  the demo model's tokenizer: the draft is the demo model's own first
  :data:`DRAFT_LAYERS` layers with its embeddings, final norm and head
  (``testing/checkpoints.first_layers_checkpoint``), about half its weights.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from torch_tensorrt_dist.bench.common import Figure
from torch_tensorrt_dist.generation.generate import Generator
from torch_tensorrt_dist.generation.sampling import SamplingConfig
from torch_tensorrt_dist.generation.speculative import SpeculativeConfig
from torch_tensorrt_dist.generation.step_inputs import step_inputs
from torch_tensorrt_dist.models.dtypes import dtype_name

__all__ = ["draft_figures", "speculative_figures", "verify_cost_figures"]

SECTION = "speculative"
K = 4
CACHE = 256
#: the first characters of a pydoc topic, then its first words again
TOPICS = ("for", "while", "return", "if")
#: the draft model: the demo model's first layers (of 4), its k
DRAFT_LAYERS, DRAFT_K = 2, 2
#: the weights' dtypes of the verify-cost figures: float32 (what ``generate`` loads by default)
#: and bfloat16 (``--dtype bf16``, as LLMs are served: its products go to oneDNN, with AMX
#: where the CPU has it, whose time grows little from 8 token rows to 40)
DTYPES = (torch.float32, torch.bfloat16)
OTHER = (
    "zebra quantum pickle harmonica velvet 7 lantern",
    "orbit marmalade cactus 42 trombone glacier",
    "whisker saxophone nebula 9 porcelain meadow",
    "kayak tundra bagel 3 lighthouse xylophone",
)


def _best_blocks(
    fns: list[Callable[[], Any]], blocks: int, calls: int, clock: Callable[[], float]
) -> list[float]:
    """Each function's best block of ``calls`` calls (s per call), blocks alternated."""
    best = [float("inf")] * len(fns)
    for _ in range(blocks):
        for i, fn in enumerate(fns):
            start = clock()
            for _ in range(calls):
                fn()
            best[i] = min(best[i], (clock() - start) / calls)
    return best


def _step_costs(
    gen: Generator, rows: int, blocks: int, calls: int, clock: Callable[[], float]
) -> tuple[float, float, float]:
    """(decode step s, verify call s, decode step of rows x (k + 1) rows s) of ``rows`` rows
    at position 64, k = :data:`K`."""
    run = gen.runner
    bs, pos = run.block_size, 64
    per = -(-(pos + K + 1) // bs)

    def inputs(n: int, tokens: int) -> tuple[torch.Tensor, ...]:
        tables = [list(range(1 + i * per, 1 + (i + 1) * per)) for i in range(n)]
        spans = [([5] * tokens, pos, t) for t in tables]
        return step_inputs(
            spans, run.limits, run.device, mark_dynamic=run.mark_dynamic, pack=run.pack
        )

    one, many, wide = inputs(rows, 1), inputs(rows, K + 1), inputs(rows * (K + 1), 1)
    verify = run.verify
    assert verify is not None
    fns = [lambda: run.step(*one), lambda: verify(*many), lambda: run.step(*wide)]
    with torch.no_grad():
        for _ in range(3):  # compile and confirm every shape class
            for fn in fns:
                fn()
        decode_s, verify_s, wide_s = _best_blocks(fns, blocks, calls, clock)
    return decode_s, verify_s, wide_s


def _prompts(tok: Any) -> tuple[list[list[int]], list[list[int]]]:
    import pydoc_data.topics as topics

    quoting = []
    for name in TOPICS:
        text = topics.topics[name].strip()
        quoting.append(tok.encode(text[:160] + "\n\n" + text[:30]))
    return quoting, [tok.encode(t) for t in OTHER]


def _generate(
    gen: Generator,
    spec: SpeculativeConfig | None,
    prompts: list[list[int]],
    tokens: int,
    cpu_time: bool = False,
) -> tuple[float, float]:
    """(decode tokens / s, tokens a step) over ``prompts`` one at a time: the tokens after the
    first over the time after the first (the prefill, the same with or without a proposer,
    left out); ``cpu_time``: the process's CPU time, else the wall clock."""
    gen.speculative = spec  # the next core speculates, or not (the verify graph stays)
    out, seconds, steps = 0, 0.0, 0
    for ids in prompts:
        first: list[float] = []

        def on_step(new: list[list[int]], first: list[float] = first) -> None:
            if not first and new[0]:  # the first token came: decoding starts
                first.append(time.process_time())

        res = gen.generate([ids], max_new_tokens=tokens, sampling=SamplingConfig(), on_step=on_step)
        out += len(res.tokens[0]) - 1
        seconds += time.process_time() - first[0] if cpu_time else res.decode_s
        steps += res.decode_steps
    return out / seconds, out / max(steps, 1)


def _load(engine: str, dtype: torch.dtype = torch.float32) -> tuple[Generator, Any]:
    """The demo model's generator (rows for the verify calls of 8 rows) and tokenizer."""
    from torch_tensorrt_dist.models.demo import demo_checkpoint_path
    from torch_tensorrt_dist.models.tokenizer import load_tokenizer
    from torch_tensorrt_dist.parallel.llama_load import load_llama

    path = demo_checkpoint_path()
    tok = load_tokenizer(path, vocab_size=1024)
    model = load_llama(path, progress=False, dtype=dtype)
    spec = SpeculativeConfig(num_tokens=K)
    gen = Generator(
        model, engine=engine, max_batch_size=8 * (K + 1), cache_len=CACHE, speculative=spec
    )
    return gen, tok


def _where(engine: str, cpu_time: bool, dtype: torch.dtype | None = None) -> str:
    where = f"demo model, {engine}, TP 1, {torch.get_num_threads()} threads"
    where += f", {dtype_name(dtype)}" if dtype is not None else ""
    return where + (", CPU time" if cpu_time else "")


def verify_cost_figures(
    dtype: torch.dtype = torch.float32,
    *,
    engine: str = "inductor",
    blocks: int = 3,
    calls: int = 10,
    cpu_time: bool = False,
    gen: Generator | None = None,
) -> tuple[list[Figure], dict[int, float]]:
    """The verify call / decode step figures (R = 1, 4, 8) with the weights in ``dtype``, and
    the ratios by R."""
    gen = gen or _load(engine, dtype)[0]
    clock = time.process_time if cpu_time else time.perf_counter
    where = _where(engine, cpu_time, dtype)
    figures, ratios = [], {}
    for rows in (1, 4, 8):
        decode_s, verify_s, wide_s = _step_costs(gen, rows, blocks, calls, clock)
        ratio = verify_s / decode_s
        ratios[rows] = ratio
        figures.append(
            Figure(
                SECTION,
                f"verify call / decode step, {rows} row{'s' * (rows > 1)} x {K + 1} tokens, "
                f"{dtype_name(dtype)}",
                round(ratio, 3),
                "x",
                "<= 1.3",
                ratio <= 1.3,
                f"{1e3 * verify_s:.2f} ms vs {1e3 * decode_s:.2f} ms ({where})",
            )
        )
        figures.append(
            Figure(
                SECTION,
                f"verify call / decode step of the same token rows, {rows} x {K + 1} vs "
                f"{rows * (K + 1)} x 1, {dtype_name(dtype)}",
                round(verify_s / wide_s, 3),
                "x",
                note=f"{1e3 * verify_s:.2f} ms vs {1e3 * wide_s:.2f} ms ({where})",
            )
        )
    return figures, ratios


def speculative_figures(
    *,
    engine: str = "inductor",
    blocks: int = 3,
    calls: int = 10,
    tokens: int = 32,
    cpu_time: bool = False,
) -> list[Figure]:
    gen, tok = _load(engine)
    spec = gen.speculative
    assert spec is not None
    where = _where(engine, cpu_time)
    figures, ratios = verify_cost_figures(
        engine=engine, blocks=blocks, calls=calls, cpu_time=cpu_time, gen=gen
    )
    for dtype in DTYPES[1:]:  # the float32 generator's figures above; the others' own
        figures += verify_cost_figures(
            dtype, engine=engine, blocks=blocks, calls=calls, cpu_time=cpu_time
        )[0]
    quoting, other = _prompts(tok)
    for name, prompts, goal in (("quoting", quoting, 1.15), ("non-matching", other, 0.95)):
        # warm: every graph both runs take compiled (a verify call of a past length the
        # warm-up did not reach compiled in a timed run: 42 tok/s in that run, this AMD EPYC)
        _generate(gen, spec, prompts, tokens)
        _generate(gen, None, prompts, tokens)
        plain_best, spec_best, per_step = 0.0, 0.0, 0.0
        for _ in range(blocks + 2):  # alternated, the best of each (a run is ~0.1 s: noisy)
            plain_best = max(plain_best, _generate(gen, None, prompts, tokens, cpu_time)[0])
            rate, per_step = _generate(gen, spec, prompts, tokens, cpu_time)
            spec_best = max(spec_best, rate)
        speedup = spec_best / plain_best
        figures.append(
            Figure(
                SECTION,
                f"generate decode speed-up with prompt lookup, {name} prompts",
                round(speedup, 3),
                "x",
                f">= {goal}",
                speedup >= goal,
                f"{spec_best:.1f} vs {plain_best:.1f} tok/s; {per_step:.2f} tokens a step "
                f"(n 2-3, k {K}; {len(prompts)} prompts x {tokens} tokens; {where})",
            )
        )
        if name == "quoting":
            figures.append(
                Figure(
                    SECTION,
                    "mean tokens a step with prompt lookup, quoting prompts",
                    round(per_step, 3),
                    "tokens",
                    note=f"accepted proposals + 1, greedy, k {K}",
                )
            )
            turned = speedup / (per_step / ratios[1])
            figures.append(
                Figure(
                    SECTION,
                    "speed-up / (tokens a step / verify ratio), quoting prompts",
                    round(turned, 3),
                    "",
                    ">= 0.8",
                    turned >= 0.8,
                    f"{speedup:.2f} / ({per_step:.2f} / {ratios[1]:.2f}), 1 row",
                )
            )
    return figures + draft_figures(engine=engine, blocks=blocks, tokens=tokens, cpu_time=cpu_time)


def _batched(
    gen: Generator,
    spec: SpeculativeConfig | None,
    prompts: list[list[int]],
    tokens: int,
    clock: Callable[[], float],
) -> tuple[float, int, int]:
    """(tokens / s, proposed, accepted) of ``prompts`` together through the core, greedy."""
    from torch_tensorrt_dist.generation.core import Request

    gen.speculative = spec
    core = gen.core()
    sched = gen.scheduler(core)
    for i, ids in enumerate(prompts):
        sched.add(Request(i, tuple(ids), tokens, SamplingConfig(), ()))
    out, start = 0, clock()
    while not sched.idle():
        out += sum(len(e.tokens) for e in core.step(sched.plan()))
    return out / (clock() - start), core.spec_proposed, core.spec_accepted


def draft_figures(
    *, engine: str = "inductor", blocks: int = 3, tokens: int = 32, cpu_time: bool = False
) -> list[Figure]:
    """The draft model's acceptance rate and speed-up (the demo model's first
    :data:`DRAFT_LAYERS` layers drafting :data:`DRAFT_K` tokens for it), the 8 prompts of
    :func:`speculative_figures` batched, with and without the draft alternated."""
    import tempfile

    from torch_tensorrt_dist.models.demo import demo_checkpoint_path
    from torch_tensorrt_dist.models.tokenizer import load_tokenizer
    from torch_tensorrt_dist.parallel.llama_load import load_llama
    from torch_tensorrt_dist.testing.checkpoints import first_layers_checkpoint

    path = demo_checkpoint_path()
    quoting, other = _prompts(load_tokenizer(path, vocab_size=1024))
    prompts = quoting + other
    model = load_llama(path, progress=False)
    with tempfile.TemporaryDirectory() as tmp:
        draft = load_llama(first_layers_checkpoint(path, tmp, DRAFT_LAYERS), progress=False)
    spec = SpeculativeConfig(method="draft", num_tokens=DRAFT_K)
    gen = Generator(
        model,
        engine=engine,
        max_batch_size=len(prompts),
        cache_len=CACHE,
        speculative=spec,
        draft=draft,
    )
    clock = time.process_time if cpu_time else time.perf_counter
    for _ in range(2):  # warm: every graph both runs take compiled
        _batched(gen, spec, prompts, 8, clock)
        _batched(gen, None, prompts, 8, clock)
    plain_best, spec_best, proposed, accepted = 0.0, 0.0, 0, 0
    for _ in range(blocks // 2 + 1):  # alternated, the best of each
        plain_best = max(plain_best, _batched(gen, None, prompts, tokens, clock)[0])
        rate, proposed, accepted = _batched(gen, spec, prompts, tokens, clock)
        spec_best = max(spec_best, rate)
    where = _where(engine, cpu_time)
    what = f"draft: its first {DRAFT_LAYERS} of 4 layers, k {DRAFT_K}"
    acceptance = accepted / max(proposed, 1)
    return [
        Figure(
            SECTION,
            "draft model acceptance rate",
            round(acceptance, 3),
            "",
            note=f"{accepted} of {proposed} proposals, greedy ({what}; {where})",
        ),
        Figure(
            SECTION,
            "generate decode speed-up with a draft model, 8 prompts batched",
            round(spec_best / plain_best, 3),
            "x",
            note=f"{spec_best:.1f} vs {plain_best:.1f} tok/s, every token over the whole run "
            f"({len(prompts)} prompts x {tokens} tokens; {what}; {where})",
        ),
    ]
