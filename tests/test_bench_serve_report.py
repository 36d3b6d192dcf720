"""``bench --section serve``'s report from hand-made measurements: each figure named, its goal
judged (or said to be skipped, and why), the alternated pairs and the rounds at the default
threads."""

from __future__ import annotations

import pytest

from torch_tensorrt_dist.bench.serve_report import (
    ServeMeasured,
    ThreadCPU,
    serve_report,
)
from torch_tensorrt_dist.bench.serve_scenarios import Join
from torch_tensorrt_dist.bench.serve_sizes import ServeSizes
from torch_tensorrt_dist.bench.serve_streams import ClientRun

from ._bench_serve import stream


def _measured(hf_scale: float, second: float | None = None) -> ServeMeasured:
    """Ours: a cold round and two warm ones, the same figures; transformers serve: one round
    beside each warm one, ``hf_scale`` and ``second`` times as fast as ``runs(1.0)``."""

    def runs(scale: float) -> dict[int, ClientRun]:
        # C clients, 10 tokens each, over 1 s / scale
        return {c: ClientRun(1.0 / scale, [stream(0.0, [0.1] * 10)] * c) for c in (1, 8, 32)}

    one = stream(0.0, [0.05 + 0.01 * i for i in range(10)])  # 900 decode tok/s... x 0.01 s
    ours = runs(1.0)
    ours[1] = ClientRun(0.5, [one, one])
    return ServeMeasured(
        ours=[ours, ours, ours],
        # round 1: the step thread busy 0.45 s of C = 1's 0.5 s; 0.002 s of HTTP for 20 tokens
        threads=[{1: ThreadCPU(0.45, 0.002), 8: ThreadCPU(0.9, 0.016)}, {}, {}],
        hf=[runs(hf_scale), runs(second or hf_scale)] if hf_scale else [],
        first=["ours", "hf"] if hf_scale else [],
        loop="uvloop",
        hf_reason="" if hf_scale else "transformers serve did not run: why",
        warmup_s=(100.0, 20.0),
        graphs=4,
        generate=[100.0, 80.0],
        step_s={256: 0.010, 1024: 0.011, 4096: 0.014},
        kv_bytes=(11915.6, 1016800.0, 8192),
        burst=ClientRun(1.0, [stream(0.0, [0.2, 1.0]), stream(0.0, [0.1, 2.0])]),
        join=Join([stream(0.0, [0.1, 0.2, 0.5, 0.6])], stream(0.15, [1.15])),
        prefix=(stream(0.0, [1.0], prompt=1564), stream(2.0, [2.1], cached=1488, prompt=1564)),
        load="3.0 / 4.0",
    )


def test_report_names_goals_and_judges_them() -> None:
    figs = {f.name: f for f in serve_report(_measured(0.25, 0.5), ServeSizes.full())}
    ratio = figs["ours over transformers serve (median of alternated rounds), C = 1 / 8 / 32"]
    # ours: 40 tok/s at C = 1 (20 tokens in 0.5 s), 80 and 320; transformers: 10 C tokens in
    # 4 s, then in 2 s: the pairs are 16 and 8 at C = 1, 4 and 2 at C = 8 and 32
    assert ratio.value == "12.00 / 3.00 / 3.00" and ratio.met is True
    assert ratio.note == (
        "2 pairs (1 with ours started first, 1 with transformers serve first), range "
        "C = 1: 8.00-16.00; C = 8: 2.00-4.00; C = 32: 2.00-4.00"
    )
    m = _measured(0.25, 0.5)
    m.hf, m.first, m.order_reason = m.hf[:1], m.first[:1], "the pairs ... first: it failed"
    note = next(f.note for f in serve_report(m, ServeSizes.full()) if f.name.startswith("ours ov"))
    assert note == (
        "1 pairs (1 with ours started first, 0 with transformers serve first); "
        "the pairs ... first: it failed"
    )
    hf = figs["transformers serve --continuous-batching: output tok/s, C = 1 / 8 / 32"]
    assert hf.value == "3.8 / 30.0 / 120.0" and hf.note.startswith("median of 2 rounds")
    assert figs["ours, round 1 (cold start): output tok/s, C = 1 / 8 / 32"].note.endswith(
        "1 thread, HTTP on uvloop"
    )
    assert "ours, round 3 (warm): output tok/s, C = 1 / 8 / 32" in figs
    slower = serve_report(_measured(0.25, 1.0), ServeSizes.full())  # pairs 4 and 1 at C = 8
    judged = next(f for f in slower if f.name.startswith("ours over"))
    assert judged.value == "10.00 / 2.50 / 2.50" and judged.met is True
    behind = serve_report(_measured(0.5, 1.0), ServeSizes.full())  # pairs 2 and 1 at C = 8
    judged = next(f for f in behind if f.name.startswith("ours over"))
    assert judged.value == "6.00 / 1.50 / 1.50" and judged.met is False
    decode = figs["one client's decode tok/s over generate's (same checkpoint, 1 thread)"]
    # ours 100 tok/s after its first token in both warm rounds; generate 100, then 80
    assert decode.value == 1.12 and decode.met is True and decode.goal == ">= 0.8x"
    assert decode.note.startswith("median of 2 pairs") and "(1.00-1.25)" in decode.note
    step = figs["decode step at cache 4096 over 256"]
    assert step.value == 1.4 and step.met is False and step.goal == "<= 1.3x"
    assert figs["server warm-up, cold / warm (Inductor cache empty / filled)"].met is True
    burst = next(f for k, f in figs.items() if k.startswith("32 requests"))
    assert burst.value == pytest.approx(0.2 / 1.5, abs=1e-3) and burst.met is True
    join = next(f for k, f in figs.items() if "prompt joins" in k)
    assert join.value == 0.3 and join.met is True  # gap 0.3 over TTFT 1.0
    prefix = figs["a request sharing a 1500-token prefix: its TTFT / the first's"]
    assert prefix.value == 0.1 and prefix.met is True
    cached = figs["its cached prompt tokens (usage.prompt_tokens_details)"]
    assert cached.value == 1488 and cached.met is True and cached.goal.startswith(">= 1488")
    ttft = figs["time to first token p50 / p99, C = 8"]
    assert ttft.met is True and "transformers serve 100 ms" in ttft.note
    # C = 8: 0.9 s of 1 s, and 0.016 s over 80 tokens; C = 32 and round 2 have no CPU figures
    threads = figs[
        "ours, round 1: step thread's share of a core; HTTP's CPU per output token, C = 1 / 8"
    ]
    assert threads.value == "0.90 / 0.90; 100 / 200 us" and threads.met is None
    assert not any(k.startswith("ours, round 2: step thread") for k in figs)
    assert all(f.goal for f in figs.values() if f.met is not None)
    # no rounds at default threads in this measurement: said, not invented
    defaults = next(
        f for k, f in figs.items() if k.startswith("ours over transformers serve, each")
    )
    assert defaults.value == "skipped" and defaults.note == "no rounds ran"


def test_report_at_default_threads() -> None:
    m = _measured(0.25)
    m.defaults = [{1: (300.0, 100.0), 8: (900.0, 300.0)}, {1: (240.0, 120.0), 8: (1000.0, 400.0)}]
    m.default_threads = 2
    figs = {f.name: f for f in serve_report(m, ServeSizes.full())}
    name = (
        "ours over transformers serve, each at its default threads (median of alternated "
        "rounds), C = 1 / 8"
    )
    fig = figs[name]
    # pairs C = 1: 3.0 and 2.0; C = 8: 3.0 and 2.5 (no goal of its own: one thread each is judged)
    assert fig.value == "2.50 / 2.75" and fig.met is None and not fig.goal
    assert fig.note.startswith(
        "2 pairs (half with each started first), range C = 1: 2.00-3.00; C = 8: 2.50-3.00; "
        "ours 270.0 / "
    )
    assert "transformers serve 110.0 / 350.0 tok/s" in fig.note and "ours took 2" in fig.note
    m.defaults, m.defaults_reason = [], "a server did not start: boom"
    skipped = next(
        f
        for f in serve_report(m, ServeSizes.full())
        if f.name.startswith("ours over transformers serve, each")
    )
    assert skipped.value == "skipped" and skipped.note == "a server did not start: boom"
    m.hf_reason = "transformers serve did not run: why"  # no baseline: no comparison at all
    assert not any("each at its default" in f.name for f in serve_report(m, ServeSizes.full()))
    off = ServeSizes(defaults=())
    assert not any("each at its default" in f.name for f in serve_report(_measured(0.25), off))


def test_report_without_the_baseline_says_why() -> None:
    figs = serve_report(_measured(hf_scale=0.0), ServeSizes.full())
    hf = next(f for f in figs if f.name.startswith("transformers serve"))
    assert hf.value == "skipped" and hf.met is None and "did not run: why" in hf.note
    assert not any(f.name.startswith("ours over") for f in figs)
