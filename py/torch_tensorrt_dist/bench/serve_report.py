"""``bench --section serve``: the sizes of a run, what it measured, and its figures (pure).

    sizes = ServeSizes.full()            # or .quick(): smaller counts, same figures
    figures = serve_report(measured, sizes)

Every figure is a ratio or a time of one run; its goal comes from issue 27 (the step costs what
is live, paged KV) or issue 28 (chunked prefill, prefix caching), and ``met`` says whether this
run met it (None: no goal, or the figure could not be taken, with the reason in its note).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace

from torch_tensorrt_dist.bench.common import Figure
from torch_tensorrt_dist.bench.serve_scenarios import Join
from torch_tensorrt_dist.bench.serve_streams import ClientRun, Stream, slowest_ttft_share
from torch_tensorrt_dist.config.run import DEFAULT_CPU_GEMM
from torch_tensorrt_dist.errors import ConfigError

__all__ = ["SECTION", "ServeMeasured", "ServeSizes", "ThreadCPU", "serve_report"]

SECTION = "serve (CPU, TP 1, bench checkpoint)"
#: issue 27's cold warm-up at TP 1 before the paged step (every prefill bucket compiled)
COLD_WARMUP_BEFORE_S = 426.0
#: issue 28: vLLM's CPU build, time to first token p50 at 8 clients on the same checkpoint
VLLM_TTFT_P50_S = 0.124


@dataclass(frozen=True)
class ServeSizes:
    """The counts and lengths of a run (``full``: the issues' sizes)."""

    clients: tuple[int, ...] = (1, 8, 32)
    rounds: int = 3
    """Timed rounds of each server once warm, alternated with transformers serve's (both up
    at once, the order swapped each round): the ratio is the median of those pairs (a load
    that drifts within the run moves both rounds of a pair alike)."""
    requests_per_client: int = 2
    min_requests: int = 8
    """At least this many requests per client count: one client's 2 requests last well under a
    second, which this machine's noise swamps (rounds of the same server differed by 10 %)."""
    max_tokens: int = 64
    burst_requests: int = 32
    burst_tokens: int = 96
    join_streams: int = 7
    join_prompt: int = 2000
    stream_tokens: int = 256
    prefix: int = 1500
    suffix: int = 64
    caches: tuple[int, ...] = (256, 1024, 4096)
    live: int = 33
    step_rows: int = 8
    max_batch_size: int = 32
    max_seq_len: int = 2560
    kv_rows: int = 8
    kv_tokens: int = 512
    engine: str = "inductor"
    cpu_gemm: str = DEFAULT_CPU_GEMM
    """Our server's ``--cpu-gemm`` (and the in-process generator's, the decode step's)."""
    baseline: bool = True

    @classmethod
    def full(cls) -> ServeSizes:
        return cls()

    @classmethod
    def quick(cls) -> ServeSizes:
        """Fewer requests and tokens, shorter prompts, two cache lengths (a few minutes)."""
        return cls(
            rounds=2,
            requests_per_client=1,
            min_requests=2,
            max_tokens=24,
            burst_tokens=48,
            join_prompt=600,
            stream_tokens=128,
            prefix=400,
            suffix=32,
            caches=(256, 1024),
            max_seq_len=1024,
        )

    @property
    def kv_cache_tokens(self) -> int:
        """The KV memory of the burst (and of every run): ``kv_rows`` x ``kv_tokens`` tokens."""
        return self.kv_rows * self.kv_tokens

    def check(self, positions: int, *, prompt: int = 16) -> None:
        """ConfigError unless every request of the run fits the checkpoint's ``positions``,
        ``--max-seq-len`` and the KV memory (``prompt``: the longest text prompt in tokens),
        so that no request is refused or preempted."""
        if self.rounds < 1:
            raise ConfigError(f"serve bench sizes: rounds must be >= 1, got {self.rounds}")
        kv = self.kv_cache_tokens
        needs = {
            "--max-seq-len (the checkpoint's positions)": (self.max_seq_len, positions),
            "the longest cache length (the checkpoint's positions)": (max(self.caches), positions),
            "the joining prompt (--max-seq-len)": (self.join_prompt + 4, self.max_seq_len),
            "the shared prefix and a suffix (--max-seq-len)": (
                self.prefix + self.suffix + 4,
                self.max_seq_len,
            ),
            "--max-seq-len (the KV memory)": (self.max_seq_len, kv),
            "the streams and the joining prompt (the KV memory)": (
                self.join_streams * (prompt + self.stream_tokens) + self.join_prompt,
                kv,
            ),
            "the burst (the KV memory)": (self.burst_requests * (prompt + self.burst_tokens), kv),
            "the burst (--max-batch-size)": (self.burst_requests, self.max_batch_size),
            "the streams and the join (--max-batch-size)": (
                self.join_streams + 1,
                self.max_batch_size,
            ),
        }
        for what, (need, have) in needs.items():
            if need > have:
                raise ConfigError(f"serve bench sizes: {what} needs {need} tokens, has {have}")


@dataclass(frozen=True)
class ThreadCPU:
    """CPU seconds rank 0's step thread and HTTP thread used over one timed round."""

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
    how = f"torchtrt-dist serve --engine {s.engine} --cpu-gemm {s.cpu_gemm}, 1 thread" + (
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
            f"the order swapped each round); same checkpoint, prompts and client, 1 thread; "
            f"{load}",
        ),
        Figure(
            SECTION,
            f"ours over transformers serve (median of alternated rounds), C = {cs}",
            " / ".join(f"{ratios[c]:.2f}" for c in s.clients),
            "x",
            goal=">= 2x at C = 1 and 8",
            met=all(judged) if judged else None,
            note=f"{len(m.hf)} pairs" + (f", range {spread}" if spread else ""),
        ),
    ]


def _thread_figures(m: ServeMeasured, s: ServeSizes) -> list[Figure]:
    """Where our rounds' CPU went: the step thread's share of a core, the HTTP thread's CPU
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
                f"ours, round {i + 1}: step thread's share of a core; HTTP thread's CPU per "
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
        + _thread_figures(m, s)
        + _latency_figures(m, s)
        + _step_figures(m, s)
        + _prefill_figures(m, s)
    )
    if m.load:
        figs.append(Figure(SECTION, "machine load average (start / end of the section)", m.load))
    if s.cpu_gemm != DEFAULT_CPU_GEMM:  # a run of its own: told apart from the default run
        label = f"{SECTION[:-1]}, --cpu-gemm {s.cpu_gemm})"
        figs = [replace(f, section=label) for f in figs]
    return figs
