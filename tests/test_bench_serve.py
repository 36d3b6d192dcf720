"""``bench --section serve``'s runs: the order in which the servers start, a server's threads
and environment, a client process against a local server, and one small run against our
server (no timed assertions: the figures are printed, not judged here)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from torch_tensorrt_dist.bench.serve_report import ServeMeasured
from torch_tensorrt_dist.bench.serve_sizes import ServeSizes
from torch_tensorrt_dist.bench.serve_streams import ClientRun
from torch_tensorrt_dist.errors import ConfigError

from ._bench_serve import stream


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


@pytest.mark.slow
def test_serve_section_small_run() -> None:
    """Our server only (no baseline, no compile), tiny sizes: every figure is taken, and the
    second request of a shared prefix reports its full blocks as cached."""
    from torch_tensorrt_dist.bench.serve import serve_figures

    sizes = replace(  # the quick run's, at sizes of a few seconds, our server alone
        ServeSizes.quick(),
        clients=(1, 2),
        rounds=1,
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
    # the running streams hold their end of text back (min_tokens) and outlast the join
    join = figs["2 streams run, a 64-token prompt joins: largest gap / its TTFT"]
    assert "ended before" not in join.note, join.note
