"""What a grammar (structured output) costs a decode step at 8 rows (issue 29's goal: < 10 %).

One process, the demo model on the generation core (``Generator.core``, TP 1), 8 rows decoding
together. The same 8 prompts run twice, taking turns block by block: plain (temperature 1,
seeded) and each row under a JSON schema (an array of at least 40 small objects, so no row
ends within the run; llguidance, ``generation/grammar.py``). Only steps where every row
decodes are timed (no prefill in the step), each block's figure its median step; the
variants' order swaps from one pair of blocks to the next, and the cost is the median over the
pairs of the grammar block's step over the plain one's (on this shared 2-core machine a
block's plain step moves by 10-25 % from one block to the next, and the best block of each
variant can come from different moments; the paired median follows the machine, the best of
each is in the note). Also timed: the stepping thread's CPU time a step (``time.thread_time``),
which a busy machine inflates far less than the wall time. The
grammar's cost is what the step takes more: on the CPU all of it is on the stepping thread
once the graph has returned (``sampler.StepMasks``): the masks computed row by row, the
float32 copy of the rows with the masks applied (one C++ op, ``ops/cpu_bitmask``, loaded
before the timed steps), each matcher advanced. Also printed: the 8 rows' masks alone, each
step at a new state (what the step computes; the same state again is far cheaper).

    torchtrt-dist bench --section grammar          # or, in Python:
    grammar_cost(engine="none")                     # plain PyTorch instead of Inductor
    grammar_cost(tools=True)                        # a forced tool call's grammar instead
    sampling_cost()                                 # the sampling path alone, no model
    sampling_cost(tools=True, mixed=True)           # half the rows plain, half with a grammar

``tools=True`` times the grammar of ``tool_choice`` "required" (``serving/tools/forced.py``:
compact JSON, a list of calls of two functions) with at least 40 calls, so no row ends.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from torch_tensorrt_dist.bench.common import Figure
from torch_tensorrt_dist.generation.generate import Generator
from torch_tensorrt_dist.generation.grammar import Grammars, GrammarSpec, new_bitmask
from torch_tensorrt_dist.generation.grammar_masks import unpack_bitmask
from torch_tensorrt_dist.generation.plan import Request
from torch_tensorrt_dist.generation.sampling import SamplingConfig

__all__ = ["SCHEMA", "TOOL_SCHEMA", "grammar_cost", "sampling_cost"]

SECTION = "serve: grammar cost"
ROWS = 8
#: long enough that no row ends within the timed steps
SCHEMA: dict[str, Any] = {
    "type": "array",
    "minItems": 40,
    "items": {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
        "required": ["name", "n"],
    },
}
_PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
}
_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": _PARAMS}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]


def _tool_schema() -> dict[str, Any]:
    from torch_tensorrt_dist.serving.tools.forced import required_schema

    return {**required_schema(_TOOLS, parallel=True), "minItems": 40}


#: ``tool_choice`` "required" over two functions, long enough that no row ends
TOOL_SCHEMA = _tool_schema()

PROMPTS = ("The return statement", "Lists", "Python", "Exceptions", "The for loop", "A pet:")


def _requests(tok: Any, grammar: GrammarSpec | None, first_rid: int, steps: int) -> list[Request]:
    return [
        Request(
            first_rid + i,
            tuple(tok.encode(PROMPTS[i % len(PROMPTS)])),
            steps + 4,
            SamplingConfig(temperature=1.0, seed=i, ignore_eos=True),
            (),
            grammar=grammar,
        )
        for i in range(ROWS)
    ]


def _block(
    gen: Generator, grammars: Grammars, reqs: list[Request], steps: int
) -> list[tuple[float, float, float]]:
    """Seconds of each step where every row of ``reqs`` decodes (one token each): wall time,
    CPU time of the stepping thread (``time.thread_time``), and that thread's CPU time in the
    step's graph call."""
    core = gen.core()
    core.grammars = grammars
    graph_step, in_graph = core._step, [0.0]

    def timed(*inputs: torch.Tensor) -> torch.Tensor:
        start = time.thread_time()
        try:
            return graph_step(*inputs)
        finally:
            in_graph[0] += time.thread_time() - start

    core._step = timed
    try:
        sched = gen.scheduler(core)
        for r in reqs:
            sched.add(r)
        times: list[tuple[float, float, float]] = []
        while not sched.idle() and len(times) < steps:
            plan = sched.plan()
            decoding = plan.steady and len(core.running) == ROWS
            start, cpu, in_graph[0] = time.perf_counter(), time.thread_time(), 0.0
            emitted = core.step(plan)
            if decoding:
                times.append((time.perf_counter() - start, time.thread_time() - cpu, in_graph[0]))
            failed = [e.error for e in emitted if e.error is not None]
            if failed:
                raise RuntimeError(f"a row failed while timing: {failed[0]}")
        for r in reqs:  # leave nothing running (the next block starts afresh)
            sched.cancel(r.rid)
        core.step(sched.plan())
    finally:
        core._step = graph_step
    return times


def _mask_s(grammars: Grammars, spec: GrammarSpec, steps: int = 40, repeats: int = 3) -> float:
    """CPU seconds of this thread to compute 8 rows' masks one by one, as a CPU step does,
    each step at a new state (each row then takes a seeded random allowed token): the median
    step of the best of ``repeats`` walks (the same tokens each time)."""
    best = float("inf")
    for _ in range(repeats):
        matchers = [grammars.compile(spec) for _ in range(ROWS)]
        rows = [(m, i) for i, m in enumerate(matchers)]
        g, times = torch.Generator().manual_seed(0), []
        for _ in range(steps):
            bitmask = new_bitmask(ROWS, grammars.vocab_size)
            start = time.thread_time()
            grammars.fill_bitmask(rows, bitmask, parallel=False)
            times.append(time.thread_time() - start)
            allowed = unpack_bitmask(bitmask, grammars.vocab_size)
            for m, i in rows:
                ids = allowed[i].nonzero().flatten()
                m.accept(int(ids[torch.randint(len(ids), (1,), generator=g)]))
        best = min(best, statistics.median(times))
    return best


def grammar_cost(
    *, engine: str = "inductor", steps: int = 16, blocks: int = 12, tools: bool = False
) -> list[Figure]:
    from torch_tensorrt_dist.bench.common import bench_rank
    from torch_tensorrt_dist.models.demo import demo_checkpoint_path
    from torch_tensorrt_dist.ops import cpu_bitmask

    cpu_bitmask.available()  # the masks' C++ op built or loaded now, not in a timed step
    rank = bench_rank(demo_checkpoint_path(), engine=engine)
    vocab = rank.plan.args.vocab_size
    tok = rank.tokenizer()
    eos = tuple(tok.eos_ids) or (1,)
    grammars = Grammars.for_tokenizer(tok, vocab_size=vocab, eos_ids=eos)
    spec = GrammarSpec.json_schema(TOOL_SCHEMA if tools else SCHEMA)
    what = "a forced tool call's grammar" if tools else "a JSON-schema grammar"
    gen = rank.generator(rows=ROWS, cache_len=256)
    rid = 0
    # each block's median step (wall s, the stepping thread's CPU s, its CPU s outside the
    # graph call), by variant
    medians: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
    with torch.no_grad():
        gen.warmup_all()
        for block in range(blocks):
            for grammar in (False, True) if block % 2 == 0 else (True, False):
                reqs = _requests(tok, spec if grammar else None, rid, steps)
                rid += ROWS
                times = _block(gen, grammars, reqs, steps)
                if not times:
                    raise RuntimeError("no step of the block decoded every row")
                medians[grammar].append(
                    (
                        statistics.median(t for t, _, _ in times),
                        statistics.median(c for _, c, _ in times),
                        statistics.median(c - g for _, c, g in times),
                    )
                )
    wall, cpu = _paired(medians, 0), _paired(medians, 1)
    mask = _mask_s(grammars, spec)
    plain = statistics.median(m[0] for m in medians[False])
    with_grammar = statistics.median(m[0] for m in medians[True])
    # outside the graph call: what the grammar adds there, over a plain step's CPU
    outside = {g: statistics.median(m[2] for m in medians[g]) for g in (False, True)}
    plain_cpu = statistics.median(m[1] for m in medians[False])
    added = (outside[True] - outside[False]) / plain_cpu
    return [
        Figure(
            SECTION,
            f"decode step with {what} on each of {ROWS} rows over a plain one "
            f"(demo model, {engine}, TP 1)",
            round(100 * wall.cost, 1),
            "%",
            goal="< 10 %",
            met=wall.cost < 0.10,
            note=f"median of {blocks} block pairs ({wall.spread}); medians "
            f"{with_grammar * 1e3:.2f} vs {plain * 1e3:.2f} ms per step, each block its median "
            f"of <= {steps} decode steps, the order swapped a pair; best block of each "
            f"{wall.best}",
        ),
        Figure(
            SECTION,
            f"the stepping thread's CPU time a decode step with {what} on each of {ROWS} rows "
            "over a plain one",
            round(100 * cpu.cost, 1),
            "%",
            note=f"median of the same {blocks} block pairs ({cpu.spread}; time.thread_time: a "
            f"busy machine preempts the thread, not its CPU time); best block of each {cpu.best}",
        ),
        Figure(
            SECTION,
            f"the stepping thread's CPU time outside the graph call that {what} adds to a "
            f"decode step of {ROWS} rows, over a plain step's CPU time",
            round(100 * added, 1),
            "%",
            note=f"outside the graph {outside[True] * 1e3:.3f} vs {outside[False] * 1e3:.3f} ms a "
            f"step (masks, the masked copy and draw, each row advanced) of {plain_cpu * 1e3:.2f} "
            f"ms; medians of the same blocks (the graph's work is the same in both: the "
            f"machine's noise in it cancels here)",
        ),
        Figure(
            SECTION,
            f"the {ROWS} rows' grammar masks computed alone, each step at a new state",
            round(mask * 1e3, 3),
            "ms",
            note=f"{100 * mask / plain:.1f} % of a plain step; thread CPU, median of 40 steps",
        ),
    ]


@dataclass(frozen=True)
class _Paired:
    cost: float
    """the median over the block pairs of grammar / plain - 1"""
    spread: str
    best: str


def _paired(medians: dict[bool, list[tuple[float, float, float]]], k: int) -> _Paired:
    """What the grammar costs by the blocks' medians' element ``k`` (0 wall, 1 CPU): block pair
    by block pair, and by each variant's best block."""
    plain, grammar = [m[k] for m in medians[False]], [m[k] for m in medians[True]]
    ratios = sorted(g / p - 1 for p, g in zip(plain, grammar))
    best = min(grammar) / min(plain) - 1
    return _Paired(
        statistics.median(ratios),
        f"pairs {100 * ratios[0]:+.1f} to {100 * ratios[-1]:+.1f} %",
        f"{100 * best:+.1f} % ({min(grammar) * 1e3:.2f} vs {min(plain) * 1e3:.2f} ms)",
    )


def _sampling_block(
    grammars: Grammars,
    spec: GrammarSpec | None,
    logits: list[torch.Tensor],
    steps: int,
    mixed: bool = False,
) -> float:
    """The stepping thread's median CPU seconds a step of 8 rows on the sampling path alone:
    the masks noted, a 0.5 ms sleep for the graph (not counted), the masks computed (CPU
    logits: on this thread), ``sample_step``, each row advanced. ``mixed``: ``spec`` on the
    odd rows only."""
    from torch_tensorrt_dist.generation.sampler import RowSampling, StepMasks, sample_step

    cfgs = [SamplingConfig(temperature=1.0, seed=i, ignore_eos=True) for i in range(ROWS)]
    specs = [None if mixed and i % 2 == 0 else spec for i in range(ROWS)]
    rows = [
        RowSampling(Request(i, (1,), steps, c, grammar=s), grammars)
        for i, (c, s) in enumerate(zip(cfgs, specs))
    ]
    cpu, times = torch.device("cpu"), []
    for step in range(steps):
        start = time.thread_time()
        masks = StepMasks.start(grammars, rows, cpu)
        time.sleep(5e-4)
        bitmask, failed = masks.wait()
        picks = sample_step(logits[step % len(logits)], rows, bitmask, failed, masks.forbid)
        for pick, row in zip(picks, rows):
            row.accept(getattr(pick, "token", 0))
        times.append(time.thread_time() - start)
    return statistics.median(times)


def sampling_cost(
    *, tools: bool = False, blocks: int = 12, steps: int = 40, mixed: bool = False
) -> list[Figure]:
    """What a grammar adds to the stepping thread's CPU on the sampling path alone (no model:
    random logits over the demo vocabulary), plain and grammar blocks alternating, each
    variant's best block. ``mixed``: the grammar on half the rows (a batch of plain and
    grammar requests) instead of all."""
    from torch_tensorrt_dist.models.demo import demo_checkpoint_path
    from torch_tensorrt_dist.models.tokenizer import load_tokenizer

    vocab = 1024
    tok = load_tokenizer(demo_checkpoint_path(), vocab_size=vocab)
    grammars = Grammars.for_tokenizer(tok, vocab_size=vocab, eos_ids=tuple(tok.eos_ids) or (1,))
    spec = GrammarSpec.json_schema(TOOL_SCHEMA if tools else SCHEMA)
    g = torch.Generator().manual_seed(0)
    logits = [torch.randn(ROWS, vocab, generator=g) * 3 for _ in range(16)]
    best: dict[bool, float] = {}
    for _ in range(blocks):
        for grammar in (False, True):
            t = _sampling_block(grammars, spec if grammar else None, logits, steps, mixed)
            best[grammar] = min(best.get(grammar, t), t)
    what = "a forced tool call's grammar" if tools else "a JSON-schema grammar"
    return [
        Figure(
            SECTION,
            f"sampling path alone: the stepping thread's CPU a step with {what} on "
            f"{'half' if mixed else 'each'} of {ROWS} rows over a plain one",
            round((best[True] - best[False]) * 1e6),
            "us",
            note=f"{best[True] * 1e6:.0f} vs {best[False] * 1e6:.0f} us a step (masks, "
            f"sample_step, accept; a 0.5 ms sleep for the graph not counted); best of "
            f"{blocks} alternating blocks of {steps} steps",
        )
    ]
