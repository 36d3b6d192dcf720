"""``bench --section serve``: what a run measured, and its figures (pure; its sizes:
``serve_sizes``).

    figures = serve_report(measured, ServeSizes.full())

Every figure is a ratio or a time of one run; its goal comes from issue 27 (the step costs what
is live, paged KV) or issue 28 (chunked prefill, prefix caching), and ``met`` says whether this
run met it (None: no goal, or the figure could not be taken, with the reason in its note).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from torch_tensorrt_dist.bench.common import Figure
from torch_tensorrt_dist.bench.serve_scenarios import Join
from torch_tensorrt_dist.bench.serve_sizes import ServeSizes
from torch_tensorrt_dist.bench.serve_streams import ClientRun, Stream, slowest_ttft_share

__all__ = ["SECTION", "ServeMeasured", "ThreadCPU", "serve_report"]

SECTION = "serve (CPU, TP 1, bench checkpoint)"
#: issue 27's cold warm-up at TP 1 before the paged step (every prefill bucket compiled)
COLD_WARMUP_BEFORE_S = 426.0
#: issue 28: vLLM's CPU build, time to first token p50 at 8 clients on the same checkpoint
VLLM_TTFT_P50_S = 0.124


@dataclass(frozen=True)
class ThreadCPU:
    """CPU seconds rank 0's step thread and its HTTP process used over one
    timed round."""

    step_s: float
    http_s: float


@dataclass
class ServeMeasured:
    """What one run of the section measured (seconds unless named otherwise)."""

    ours: list[dict[int, ClientRun]]
    """Our server's rounds (the first on a cold start, then warm), by concurrent clients."""
    threads: list[dict[int, ThreadCPU]] = field(default_factory=list)
    """Per round of ours, by concurrent clients: its rank 0 threads' CPU over that round."""
    hf: list[dict[int, ClientRun]] = field(default_factory=list)
    """transformers serve's rounds: ``hf[i]`` alternated with ``ours[i + 1]``."""
    loop: str = ""
    """Our server's HTTP event loop (its ready line)."""
    hf_reason: str = ""
    """Why ``transformers serve`` gave no figures ("" when it did)."""
    first: list[str] = field(default_factory=list)
    """The server started first (``ours`` or ``hf``) in each pair of ``hf``."""
    order_reason: str = ""
    """Why the pairs with transformers serve started first are missing ("" when they ran)."""
    warmup_s: tuple[float, float] = (0.0, 0.0)
    """Our server's warm-up, cold (an empty Inductor cache) and warm."""
    graphs: int = 0
    generate: list[float] = field(default_factory=list)
    """``generate``'s decode tok/s, timed once after each warm round of ours (``ours[i + 1]``)."""
    step_s: dict[int, float] = field(default_factory=dict)
    """Median decode step by cache length (``step_rows`` rows at ``live`` tokens)."""
    kv_bytes: tuple[float, float, int] = (0.0, 0.0, 0)
    """KV bytes per live token: paged, static cache of the longest length; bytes per token."""
    block_size: int = 16
    burst: ClientRun | None = None
    join: Join | None = None
    prefix: tuple[Stream, Stream] | None = None
    load: str = ""
    """The machine's load while it ran (``os.getloadavg`` at start and end)."""
    defaults: list[dict[int, tuple[float, float]]] = field(default_factory=list)
    """Each server at its default threads: per alternated round, by concurrent clients, (our
    tok/s, transformers serve's tok/s)."""
    default_threads: int = 0
    """The threads both took by default (the cores this run was given)."""
    defaults_reason: str = ""
    """Why that comparison gave no figures ("" when it did)."""


def _tps(runs: dict[int, ClientRun], c: int) -> float:
    return runs[c].tokens_per_s if c in runs else 0.0


def _median_tps(rounds: list[dict[int, ClientRun]], c: int) -> float:
    return statistics.median(_tps(r, c) for r in rounds) if rounds else 0.0


def _pairs(m: ServeMeasured, c: int) -> list[float]:
    """Ours over transformers serve, round by round (each warm round of ours with the round of
    theirs run beside it)."""
    return [_tps(o, c) / _tps(h, c) for o, h in zip(m.ours[1:], m.hf) if _tps(h, c) > 0]


def _ratio(a: float, b: float) -> float:
    return round(a / b, 2) if b > 0 else 0.0


def _client_figures(m: ServeMeasured, s: ServeSizes) -> list[Figure]:
    cs = " / ".join(str(c) for c in s.clients)
    load = (
        f"{s.requests_per_client} requests per client (at least {s.min_requests}) x "
        f"{s.max_tokens} tokens, streamed"
    )
    how = f"torchtrt-dist serve --engine {s.engine}, 1 thread" + (
        f", HTTP on {m.loop}" if m.loop else ""
    )
    figs = [
        Figure(
            SECTION,
            f"ours, round {i + 1} ({'cold start' if i == 0 else 'warm'}): output tok/s, C = {cs}",
            " / ".join(f"{_tps(r, c):.1f}" for c in s.clients),
            "tok/s",
            note=f"{load}; {how}",
        )
        for i, r in enumerate(m.ours)
    ]
    if not m.hf:
        return [
            *figs,
            Figure(
                SECTION,
                f"transformers serve --continuous-batching: output tok/s, C = {cs}",
                "skipped",
                goal=">= 2x at C = 1 and 8 (ours over it)",
                note=m.hf_reason,
            ),
        ]
    pairs = {c: _pairs(m, c) for c in s.clients}
    ratios = {c: statistics.median(p) if p else 0.0 for c, p in pairs.items()}
    judged = [ratios[c] >= 2 for c in s.clients if c in (1, 8)]
    spread = "; ".join(
        f"C = {c}: {min(p):.2f}-{max(p):.2f}" for c, p in pairs.items() if len(p) > 1
    )
    return [
        *figs,
        Figure(
            SECTION,
            f"transformers serve --continuous-batching: output tok/s, C = {cs}",
            " / ".join(f"{_median_tps(m.hf, c):.1f}" for c in s.clients),
            "tok/s",
            note=f"median of {len(m.hf)} rounds, each beside a warm round of ours (both up, "
            f"the order swapped each round, each server started first in half); same "
            f"checkpoint, prompts and client, 1 thread; {load}",
        ),
        Figure(
            SECTION,
            f"ours over transformers serve (median of alternated rounds), C = {cs}",
            " / ".join(f"{ratios[c]:.2f}" for c in s.clients),
            "x",
            goal=">= 2x at C = 1 and 8",
            met=all(judged) if judged else None,
            note=_order_note(m) + (f", range {spread}" if spread else ""),
        ),
    ]


def _order_note(m: ServeMeasured) -> str:
    """How many pairs ran with each server started first (a server started before another
    runs slower: ``serve._halves``), and why the second order is missing where it is."""
    ours = sum(1 for f in m.first if f == "ours")
    note = (
        f"{len(m.hf)} pairs ({ours} with ours started first, {len(m.first) - ours} with "
        "transformers serve first)"
    )
    return note + (f"; {m.order_reason}" if m.order_reason else "")


def _default_figures(m: ServeMeasured, s: ServeSizes) -> list[Figure]:
    """Ours over transformers serve with each at its default threads (no goal of its own: the
    goal is judged on one thread each, the stricter comparison; this says what a user who
    starts both as they come gets on this machine)."""
    if not s.defaults or m.hf_reason:
        return []
    cs = [c for c in s.defaults if all(c in r for r in m.defaults)]
    if not m.defaults or not cs:
        return [
            Figure(
                SECTION,
                "ours over transformers serve, each at its default threads",
                "skipped",
                note=m.defaults_reason or "no rounds ran",
            )
        ]
    pairs = {c: [o / h for r in m.defaults for o, h in [r[c]] if h > 0] for c in cs}
    ratio = {c: statistics.median(p) if p else 0.0 for c, p in pairs.items()}
    ours = " / ".join(f"{statistics.median(r[c][0] for r in m.defaults):.1f}" for c in cs)
    theirs = " / ".join(f"{statistics.median(r[c][1] for r in m.defaults):.1f}" for c in cs)
    spread = "; ".join(f"C = {c}: {min(p):.2f}-{max(p):.2f}" for c, p in pairs.items() if p)
    return [
        Figure(
            SECTION,
            "ours over transformers serve, each at its default threads (median of alternated "
            f"rounds), C = {' / '.join(str(c) for c in cs)}",
            " / ".join(f"{ratio[c]:.2f}" for c in cs),
            "x",
            note=f"{len(m.defaults)} pairs (half with each started first), range {spread}; "
            f"ours {ours}, transformers serve "
            f"{theirs} tok/s; neither given OMP_NUM_THREADS: ours took {m.default_threads} "
            "(the cores given over its ranks), transformers serve torch's default",
        )
    ]


def _thread_figures(m: ServeMeasured, s: ServeSizes) -> list[Figure]:
    """Where our rounds' CPU went: the step thread's share of a core, the HTTP server's CPU
    per output token (no goal: they say what limits the rate, ``docs/performance.md``)."""
    figs = []
    for i, (runs, cpu) in enumerate(zip(m.ours, m.threads)):
        cs = [c for c in s.clients if c in cpu and c in runs and runs[c].wall_s > 0]
        if not cs:
            continue
        share = " / ".join(f"{cpu[c].step_s / runs[c].wall_s:.2f}" for c in cs)
        per_token = " / ".join(f"{1e6 * cpu[c].http_s / max(runs[c].tokens, 1):.0f}" for c in cs)
        figs.append(
            Figure(
                SECTION,
                f"ours, round {i + 1}: step thread's share of a core; HTTP's CPU per "
                f"output token, C = {' / '.join(str(c) for c in cs)}",
                f"{share}; {per_token} us",
                note="rank 0's threads (/metrics: torchtrt_thread_cpu_seconds_total) over the "
                "timed round, in clock ticks (10 ms: a short round's figure is coarse); a step "
                "thread short of a core while rows run waits (the GIL, the CPU)",
            )
        )
    return figs


def _latency_figures(m: ServeMeasured, s: ServeSizes) -> list[Figure]:
    figs: list[Figure] = []
    last = m.ours[-1] if m.ours else {}
    pairs = [
        (r[1].decode_tokens_per_s(), g) for r, g in zip(m.ours[1:], m.generate) if 1 in r and g > 0
    ]
    if pairs:
        ratios = [one / g for one, g in pairs]
        ratio = statistics.median(ratios)
        figs.append(
            Figure(
                SECTION,
                "one client's decode tok/s over generate's (same checkpoint, 1 thread)",
                round(ratio, 2),
                "x",
                goal=">= 0.8x",
                met=ratio >= 0.8,
                note=f"median of {len(pairs)} pairs, generate timed after each warm round "
                f"({min(ratios):.2f}-{max(ratios):.2f}); ours "
                f"{statistics.median(o for o, _ in pairs):.1f}, generate "
                f"{statistics.median(g for _, g in pairs):.1f} tok/s (tokens after the first "
                "over their time)",
            )
        )
    if 8 in last:
        ttft = last[8].ttft_p(0.5)
        theirs = m.hf[-1] if m.hf else {}
        hf = f"; transformers serve {1e3 * theirs[8].ttft_p(0.5):.0f} ms" if 8 in theirs else ""
        figs.append(
            Figure(
                SECTION,
                "time to first token p50 / p99, C = 8",
                f"{1e3 * ttft:.0f} / {1e3 * last[8].ttft_p(0.99):.0f}",
                "ms",
                goal=f"p50 <= {1e3 * VLLM_TTFT_P50_S:.0f} ms (vLLM CPU, issue 28)",
                met=ttft <= VLLM_TTFT_P50_S,
                note=f"the last round{hf}",
            )
        )
    if m.burst is not None and m.burst.streams:
        share = slowest_ttft_share(m.burst.streams)
        figs.append(
            Figure(
                SECTION,
                f"{s.burst_requests} requests x {s.burst_tokens} tokens at once, KV memory of "
                f"{s.kv_rows} x {s.kv_tokens} tokens: slowest TTFT / median latency",
                round(share, 3),
                goal="<= 0.5",
                met=share <= 0.5,
                note=f"--max-batch-size {s.max_batch_size}; slowest TTFT "
                f"{1e3 * max(x.ttft for x in m.burst.streams):.0f} ms",
            )
        )
    return figs


def _step_figures(m: ServeMeasured, s: ServeSizes) -> list[Figure]:
    figs: list[Figure] = []
    if m.step_s:
        caches = sorted(m.step_s)
        lo, hi = m.step_s[caches[0]], m.step_s[caches[-1]]
        figs += [
            Figure(
                SECTION,
                f"decode step, {s.step_rows} rows x {s.live} live tokens, cache "
                + " / ".join(str(c) for c in caches),
                " / ".join(f"{1e3 * m.step_s[c]:.2f}" for c in caches),
                "ms",
                note="median of interleaved rounds, 1 thread, one compiled graph per cache",
            ),
            Figure(
                SECTION,
                f"decode step at cache {caches[-1]} over {caches[0]}",
                _ratio(hi, lo),
                "x",
                goal="<= 1.3x" if caches[-1] >= 4096 else "<= 1.3x (at 4096)",
                met=hi <= 1.3 * lo,
            ),
        ]
    cold, warm = m.warmup_s
    if cold or warm:
        figs.append(
            Figure(
                SECTION,
                "server warm-up, cold / warm (Inductor cache empty / filled)",
                f"{cold:.1f} / {warm:.1f}",
                "s",
                goal=f"cold <= {COLD_WARMUP_BEFORE_S:.0f} s (issue 27, before)",
                met=cold <= COLD_WARMUP_BEFORE_S,
                note=f"{m.graphs} compiled graphs per rank (warmup_all, counted by Dynamo)",
            )
        )
    paged, static, per_token = m.kv_bytes
    if paged:
        figs.append(
            Figure(
                SECTION,
                f"KV bytes per live token ({s.live} live tokens)",
                round(paged),
                "B",
                note=f"K and V of a token: {per_token} B; whole blocks of {m.block_size}; "
                f"a static row of {max(s.caches)} tokens: {static:,.0f} B",
            )
        )
    return figs


def _prefill_figures(m: ServeMeasured, s: ServeSizes) -> list[Figure]:
    figs: list[Figure] = []
    if m.join is not None:
        j = m.join
        figs.append(
            Figure(
                SECTION,
                f"{len(j.streams)} streams run, a {s.join_prompt}-token prompt joins: "
                "largest gap / its TTFT",
                round(j.gap_share, 3),
                goal="<= 0.35",
                met=j.gap_share <= 0.35,
                note=f"gap {1e3 * j.gap:.0f} ms, TTFT {1e3 * j.join.ttft:.0f} ms"
                + ("" if j.covered else "; a stream ended before the join's first token"),
            )
        )
    if m.prefix is not None:
        first, second = m.prefix
        share = second.ttft / first.ttft
        expect = s.prefix // m.block_size * m.block_size
        figs += [
            Figure(
                SECTION,
                f"a request sharing a {s.prefix}-token prefix: its TTFT / the first's",
                round(share, 3),
                goal="<= 0.25",
                met=share <= 0.25,
                note=f"{1e3 * second.ttft:.0f} vs {1e3 * first.ttft:.0f} ms; prompts "
                f"{first.prompt_tokens} and {second.prompt_tokens} tokens",
            ),
            Figure(
                SECTION,
                "its cached prompt tokens (usage.prompt_tokens_details)",
                second.cached_tokens,
                "tokens",
                goal=f">= {expect} (the prefix's full blocks)",
                met=second.cached_tokens >= expect,
                note=f"the first request: {first.cached_tokens}",
            ),
        ]
    return figs


def serve_report(m: ServeMeasured, s: ServeSizes) -> list[Figure]:
    """The section's figures, in the order of the issues' goals."""
    figs = (
        _client_figures(m, s)
        + _default_figures(m, s)
        + _thread_figures(m, s)
        + _latency_figures(m, s)
        + _step_figures(m, s)
        + _prefill_figures(m, s)
    )
    if m.load:
        figs.append(Figure(SECTION, "machine load average (start / end of the section)", m.load))
    return figs
