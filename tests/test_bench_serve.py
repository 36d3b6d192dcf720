"""``bench --section serve``: its figures from hand-made streams, its options, and one small
run against our server (no timed assertions: the figures are printed, not judged here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from torch_tensorrt_dist.bench import QUICK_SECTIONS, SECTIONS
from torch_tensorrt_dist.bench.serve import http_loop, our_server_args, warmup_seconds
from torch_tensorrt_dist.bench.serve_checkpoint import CHECKPOINT
from torch_tensorrt_dist.bench.serve_hf import HF_READY, hf_serve_command
from torch_tensorrt_dist.bench.serve_report import (
    ServeMeasured,
    ThreadCPU,
    serve_report,
)
from torch_tensorrt_dist.bench.serve_scenarios import Join, random_ids
from torch_tensorrt_dist.bench.serve_sizes import ServeSizes
from torch_tensorrt_dist.bench.serve_step import kv_bytes_per_live_token
from torch_tensorrt_dist.bench.serve_streams import (
    ClientRun,
    Stream,
    max_gap_during,
    slowest_ttft_share,
)
from torch_tensorrt_dist.cli import build_parser
from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.kv_memory import KVLayout


def stream(sent: float, times: list[float], *, cached: int = 0, prompt: int = 5) -> Stream:
    return Stream(
        sent, times, "x" * len(times), len(times), prompt_tokens=prompt, cached_tokens=cached
    )


def test_stream_and_run_figures() -> None:
    a = stream(0.0, [0.5, 0.6, 0.8, 1.0])  # ttft 0.5, 3 tokens after the first in 0.5 s
    b = stream(0.2, [0.4, 2.2])  # ttft 0.2, latency 2.0
    assert a.ttft == 0.5 and a.latency == 1.0 and a.decode_tokens_per_s == pytest.approx(6.0)
    assert a.gaps == pytest.approx([0.1, 0.2, 0.2])
    run = ClientRun(2.0, [a, b])
    assert run.tokens == 6 and run.tokens_per_s == 3.0
    assert run.decode_tokens_per_s() == pytest.approx((6.0 + 1 / 1.8) / 2)  # b: 1 in 1.8 s
    # slowest TTFT 0.5 over the median latency (1.0 and 2.0: 1.5)
    assert slowest_ttft_share([a, b]) == pytest.approx(0.5 / 1.5)
    # gaps overlapping [0.55, 0.65]: a's 0.5-0.6 and 0.6-0.8, b's 0.4-2.2 (1.8)
    assert max_gap_during([a, b], 0.55, 0.65) == pytest.approx(1.8)
    assert max_gap_during([a], 0.55, 0.65) == pytest.approx(0.2)
    assert max_gap_during([a], 5.0, 6.0) == 0.0
    assert Stream(1.0).ttft == float("inf")  # no token: never counted as fast


def test_join_share_and_coverage() -> None:
    running = [stream(0.0, [0.1, 0.2, 0.3, 0.7, 0.8]), stream(0.0, [0.15, 0.25, 0.5])]
    join = Join(running, stream(0.25, [0.75]))  # prefilled from 0.25 to 0.75
    assert join.gap == pytest.approx(0.4)  # 0.3 -> 0.7
    assert join.gap_share == pytest.approx(0.8)
    assert not join.covered  # the second stream ended at 0.5, before 0.75
    assert Join(running[:1], join.join).covered


def test_random_ids_are_seeded_and_avoid_specials() -> None:
    ids = random_ids(500, vocab=8, seed=3, avoid=[0, 1])
    assert ids == random_ids(500, vocab=8, seed=3, avoid=[0, 1])
    assert len(ids) == 500 and set(ids) == set(range(2, 8))
    assert ids != random_ids(500, vocab=8, seed=4, avoid=[0, 1])


def test_kv_bytes_per_live_token() -> None:
    # the bench checkpoint: 8 layers, 4 KV heads of 32, fp32: 2 x 8 x 4 x 32 x 4 = 8192 B/token
    layout = KVLayout(layers=8, kv_heads=4, head_dim=32, element_size=4, block_size=16)
    paged, static = kv_bytes_per_live_token(layout, live=33, cache_len=4096)
    assert layout.bytes_per_token == 8192
    assert paged == pytest.approx(48 * 8192 / 33)  # 3 blocks of 16 tokens
    assert static == pytest.approx(4096 * 8192 / 33)


def test_sizes_fit_the_checkpoint_and_the_kv_memory() -> None:
    positions = CHECKPOINT["max_position_embeddings"]
    for sizes in (ServeSizes.full(), ServeSizes.quick()):
        sizes.check(positions)
    full = ServeSizes.full()
    assert full.kv_cache_tokens == 8 * 512 and full.clients == (1, 8, 32)
    assert (full.join_prompt, full.prefix, full.caches) == (2000, 1500, (256, 1024, 4096))
    with pytest.raises(ConfigError, match=r"joining prompt \(--max-seq-len\) needs 3004"):
        ServeSizes(join_prompt=3000).check(positions)
    with pytest.raises(ConfigError, match=r"burst \(the KV memory\) needs 8192 tokens, has 4096"):
        ServeSizes(burst_tokens=240).check(positions)
    with pytest.raises(ConfigError, match="rounds must be >= 1, got 0"):
        ServeSizes(rounds=0).check(positions)


def test_server_options_parse() -> None:
    sizes = ServeSizes.full()
    args = our_server_args(Path("/ckpt"), sizes, 8 * 512 * 8192)
    ns = build_parser().parse_args(["serve", "--port", "0", *args])
    assert (ns.max_batch_size, ns.max_seq_len, ns.engine) == (32, 2560, "inductor")
    assert ns.kv_cache_memory == str(32 * 2**20)
    bench = build_parser().parse_args(["bench", "--section", "serve", "--quick"])
    assert bench.quick and bench.section == ["serve"]
    assert "serve" in QUICK_SECTIONS and "serve_control" in SECTIONS


def test_warmup_and_baseline_lines() -> None:
    line = "serving bench at http://127.0.0.1:4242/v1 (tp=1 ep=1, engine inductor, 32 rows x "
    assert warmup_seconds(line + "2560 tokens, warm-up 41.3 s)\n") == 41.3
    assert http_loop(line + "2560 tokens, HTTP on uvloop, warm-up 41.3 s)\n") == "uvloop"
    assert http_loop(line + "2560 tokens, warm-up 41.3 s)\n") == ""
    with pytest.raises(ConfigError, match="no warm-up"):
        warmup_seconds("Traceback ...")
    uvicorn = "INFO:     Uvicorn running on http://127.0.0.1:33973 (Press CTRL+C to quit)"
    match = re.search(HF_READY, uvicorn)
    assert match is not None and match.group(1) == "http://127.0.0.1:33973"
    cmd = hf_serve_command("/ckpt")
    assert cmd[3:6] == ["serve", "/ckpt", "--continuous-batching"]
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[-1] == "0"


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


def test_each_server_is_started_first_for_half_the_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server started before another ran slower (``serve._halves``): the comparison at the
    default threads starts ours first for the first half of its rounds, transformers serve
    first for the rest, each round's order swapped, every round recorded."""
    import contextlib
    from collections.abc import Iterator

    from torch_tensorrt_dist.bench import serve

    assert serve._halves(4) == (range(2), range(2, 4))
    assert serve._halves(3) == (range(2), range(2, 3))
    assert serve._halves(1) == (range(1), range(1, 1))
    events: list[str] = []

    @contextlib.contextmanager
    def fake(args: list[str], command: list[str] | None = None, **kw: object) -> Iterator[object]:
        name = "hf" if command else "ours"
        events.append(f"start {name}")
        yield type("Up", (), {"url": name})()
        events.append(f"stop {name}")

    def timed(url: str, model: str, s: ServeSizes, c: int) -> tuple[ClientRun, None]:
        events.append(f"round {url}")
        return ClientRun(1.0, [stream(0.0, [0.1] * (2 if url == "ours" else 1))] * c), None

    monkeypatch.setattr(serve, "ServerProcess", fake)
    monkeypatch.setattr(serve, "hf_serve_command", lambda path: ["transformers", "serve"])
    monkeypatch.setattr(serve, "_round", timed)
    m = ServeMeasured(ours=[])
    serve._at_defaults(Path("ckpt"), [], {}, ServeSizes(rounds=4, defaults=(1,)), m)
    assert not m.defaults_reason and m.defaults == [{1: (2.0, 1.0)}] * 4
    assert events == [
        *("start ours", "start hf", "round ours", "round hf", "round hf", "round ours"),
        *("stop hf", "stop ours", "start hf", "start ours", "round ours", "round hf"),
        *("round hf", "round ours", "stop ours", "stop hf"),
    ]


def test_server_process_threads_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server gets ``OMP_NUM_THREADS`` from ``threads`` (None: none at all, whatever this
    process has), then ``env`` on top; a command that never prints its ready line is a
    ConfigError with its output."""
    import sys

    from torch_tensorrt_dist.bench.serve_load import ServerProcess

    show = (
        "import os; print('serving m at http://127.0.0.1:1/v1', "
        "os.environ.get('OMP_NUM_THREADS'), os.environ.get('X_BENCH'), flush=True)"
    )
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    monkeypatch.setenv("X_BENCH", "parent")

    def seen(**kw: object) -> str:
        with ServerProcess([], command=[sys.executable, "-c", show], **kw) as srv:  # type: ignore[arg-type]
            assert srv.url == "http://127.0.0.1:1"
            return srv.output().split("/v1 ")[1].strip()

    assert seen() == "1 parent"
    assert seen(threads=None) == "None parent"
    assert seen(threads=2, env={"X_BENCH": "mine"}) == "2 mine"
    assert seen(env={"OMP_NUM_THREADS": "3"}) == "3 parent"
    silent = [sys.executable, "-c", "print('warming', flush=True)"]
    with pytest.raises(ConfigError, match="did not start:\nwarming"):
        ServerProcess([], command=silent, start_timeout_s=30).start()


def test_report_without_the_baseline_says_why() -> None:
    figs = serve_report(_measured(hf_scale=0.0), ServeSizes.full())
    hf = next(f for f in figs if f.name.startswith("transformers serve"))
    assert hf.value == "skipped" and hf.met is None and "did not run: why" in hf.note
    assert not any(f.name.startswith("ours over") for f in figs)


@pytest.mark.slow
def test_serve_section_small_run() -> None:
    """Our server only (no baseline, no compile), tiny sizes: every figure is taken, and the
    second request of a shared prefix reports its full blocks as cached."""
    from torch_tensorrt_dist.bench.serve import serve_figures

    sizes = ServeSizes(
        clients=(1, 2),
        rounds=1,
        requests_per_client=1,
        min_requests=1,
        max_tokens=4,
        burst_requests=4,
        burst_tokens=8,
        join_streams=2,
        join_prompt=64,
        stream_tokens=48,
        prefix=48,
        suffix=8,
        caches=(64, 128),
        step_rows=2,
        max_batch_size=4,
        max_seq_len=128,
        kv_rows=4,
        kv_tokens=128,
        engine="none",
        baseline=False,
    )
    figs = {f.name: f for f in serve_figures(sizes)}
    assert figs["its cached prompt tokens (usage.prompt_tokens_details)"].value == 48
    rounds = [f for n, f in figs.items() if n.startswith("ours, round") and "tok/s" in n]
    assert len(rounds) == 2 and all(f.value.count("/") == 1 for f in rounds)
    threads = [f for n, f in figs.items() if n.startswith("ours, round") and "thread" in n]
    assert len(threads) == 2 and all(f.value.endswith(" us") for f in threads)
    hf = figs["transformers serve --continuous-batching: output tok/s, C = 1 / 2"]
    assert hf.value == "skipped" and "baseline off" in hf.note
    for name in (
        "decode step at cache 128 over 64",
        "4 requests x 8 tokens at once, KV memory of 4 x 128 tokens: slowest TTFT / median latency",
        "2 streams run, a 64-token prompt joins: largest gap / its TTFT",
        "one client's decode tok/s over generate's (same checkpoint, 1 thread)",
    ):
        assert isinstance(figs[name].value, float) and figs[name].value > 0, name


def test_client_view_figures_by_hand() -> None:
    """Two streams sent at 0: gaps, first events and events per token computed by hand."""
    from torch_tensorrt_dist.bench.serve_clients import client_view
    from torch_tensorrt_dist.bench.serve_streams import Stream

    a = Stream(0.0, times=[0.5, 0.6, 0.8], completion_tokens=3)  # gaps 0.1, 0.2
    b = Stream(0.0, times=[0.2, 2.2], completion_tokens=4)  # gap 2.0: text merged or held
    view = client_view([a, b])
    assert view["first_p50"] == 0.5 and view["first_max"] == 0.5  # nearest rank of 2
    assert view["gap_max"] == 2.0 and view["gap_p99"] == 2.0
    assert abs(view["gap_p50"] - 0.2) < 1e-9
    assert view["events_per_token"] == 5 / 7
    assert client_view([])["events_per_token"] == 0.0


def test_continuation_ids_of_the_demo_tokenizer() -> None:
    """The 64 single-byte tokens 0x80-0xBF of the demo's byte-level BPE, each alone U+FFFD;
    ASCII and lead bytes are not among them."""
    from tokenizers import Tokenizer

    from torch_tensorrt_dist.bench.serve_clients import continuation_ids
    from torch_tensorrt_dist.models.demo import demo_checkpoint_path

    path = Path(demo_checkpoint_path()) / "tokenizer.json"
    ids = continuation_ids(path)
    tok = Tokenizer.from_file(str(path))
    assert len(ids) == 64 and {tok.decode([i]) for i in ids} == {"\ufffd"}
    raw = "".join(tok.id_to_token(i) for i in ids)
    assert len(raw) == 64  # one byte each
    lead = tok.token_to_id("Ã")  # byte 0xC3, a lead byte: not a continuation
    assert lead is not None and lead not in ids and tok.token_to_id("a") not in ids


def test_a_client_process_records_events_and_an_error(tmp_path: Path) -> None:
    """``stream_client.py`` as the bench runs it (its own process) against a local server that
    streams three events, one empty, then an error event: their times, usage and error."""
    import http.server
    import json as _json
    import subprocess
    import sys
    import threading
    import time as _time

    from torch_tensorrt_dist.bench.serve_clients import CLIENT

    events = [
        {"choices": [{"text": "a\ufffd"}]},
        {"choices": [{"text": ""}]},
        {"choices": [{"text": "b"}]},
        {"choices": [], "usage": {"completion_tokens": 3}},
        {"error": {"message": "the client did not read"}},
    ]

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # the handler method http.server calls
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for e in [*events, "[DONE]"]:
                data = f"data: {e if isinstance(e, str) else _json.dumps(e)}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
                _time.sleep(0.05)
            self.wfile.write(b"0\r\n\r\n")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        spec = {"url": url, "body": {"prompt": "x"}, "start": _time.monotonic()}
        out = subprocess.run(
            [sys.executable, str(CLIENT), _json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    finally:
        server.shutdown()
    record = _json.loads(out)
    assert len(record["times"]) == 2 and record["times"][1] - record["times"][0] >= 0.09
    assert record["times"][0] >= record["sent"]
    assert (record["tokens"], record["chars"], record["fffd"]) == (3, 3, 1)
    assert record["error"] == "the client did not read"
