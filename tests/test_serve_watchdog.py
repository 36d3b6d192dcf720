"""A rank that stops answering (SIGSTOP) on a real ``serve --tp 2``: the watchdog turns
``/health`` to 503 within ``--step-timeout``, fails what is in flight and ends the server, each
naming the stopped rank; a SIGTERM while a rank hangs still stops accepting at once and ends
rank 0 within the drain timeout; a SIGTERM while warming up exits 0."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from torch_tensorrt_dist.runtime.launcher import free_port

from ._serve import Server, demo_with_layers, start_server

httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.slow

STEP_TIMEOUT = 5  # well above a step of this machine under load (30-100 ms)
DRAIN = 2
ARGS = ["--tp", "2", "--engine", "none", "--max-seq-len", "256", "--max-batch-size", "2"]
#: greedy, this prompt runs 240 tokens without an end-of-text token
LONG = {"prompt": "A class definition defines a class object", "max_tokens": 240, "temperature": 0}


def _in_flight(server: Server) -> tuple[dict[str, Any], list[threading.Thread]]:
    """A non-streamed and a streamed request that run for seconds: their answers land in
    the returned dict (``plain``: status and body; ``stream``: the last event)."""
    out: dict[str, Any] = {}

    def plain() -> None:
        res = httpx.post(f"{server.url}/v1/completions", json=LONG, timeout=90)
        out["plain"] = (res.status_code, res.json())

    def stream() -> None:
        body = {**LONG, "stream": True}
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=90) as res:
            events = [line for line in res.iter_lines() if line.startswith("data: {")]
        out["stream"] = json.loads(events[-1][6:])

    threads = [threading.Thread(target=plain), threading.Thread(target=stream)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while (rows := server.metrics().get("torchtrt_running_requests")) != 2.0:
        assert time.monotonic() < deadline, (rows, out, server.output()[-2000:])
        time.sleep(0.05)
    return out, threads


def _gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_a_stopped_rank_is_named_by_health_the_requests_and_the_launcher() -> None:
    # a short drain: rank 1, let go after the launcher's SIGTERM, ends itself by its drain
    # deadline (--drain-timeout + 4 s), well within torchrun's 30 s before a SIGKILL
    server = start_server(
        [*ARGS, "--step-timeout", str(STEP_TIMEOUT), "--drain-timeout", str(DRAIN)]
    )
    try:
        pids = server.health()["pids"]
        out, threads = _in_flight(server)
        os.kill(pids[1], signal.SIGSTOP)
        start = time.monotonic()
        while (health := httpx.get(f"{server.url}/health", timeout=5)).status_code == 200:
            assert time.monotonic() - start < STEP_TIMEOUT + 5, "still ready"
            time.sleep(0.1)
        body = health.json()
        assert body["status"] == "failed" and "retry-after" in health.headers
        assert re.search(r"rank 1 did not answer \(its heartbeat stopped", body["reason"])
        for t in threads:
            t.join(30)
        status, plain = out["plain"]
        assert status == 503 and "rank 1 did not answer" in plain["error"]["message"]
        assert "rank 1 did not answer" in out["stream"]["error"]["message"]
        assert _gone(pids[0], 10)  # rank 0 ended itself; its main thread is still stuck
        os.kill(pids[1], signal.SIGCONT)  # the launcher's SIGTERM reaches it now
        assert server.proc.wait(120) != 0  # the launcher ends rank 1 (slow on a busy machine)
        output = server.output()
        assert "rank 1: StepTimeoutError: step" in output
        # rank 1 ends by its own error, or, when its way out outlasts its drain deadline (a
        # busy machine), by the launcher's signal (signals.end_by_first): the launcher names it
        assert re.search(r"rank 1 of 2 \(.*\) (exited with code 1|was killed by SIGTERM)", output)
    finally:
        server.kill()


def test_sigterm_while_a_rank_hangs_stops_accepting_and_ends_rank_0_in_time() -> None:
    server = start_server([*ARGS, "--drain-timeout", str(DRAIN)])
    try:
        pids = server.health()["pids"]
        out, threads = _in_flight(server)
        os.kill(pids[1], signal.SIGSTOP)
        time.sleep(0.5)
        server.proc.send_signal(signal.SIGTERM)
        start = time.monotonic()
        while server.health()["status"] != "draining":  # seen although rank 0's loop is stuck
            assert time.monotonic() - start < 2
            time.sleep(0.05)
        res = httpx.post(f"{server.url}/v1/completions", json={"prompt": "x"}, timeout=10)
        assert res.status_code == 503 and res.headers["retry-after"]
        for t in threads:
            t.join(30)
        status, plain = out["plain"]
        assert status == 503 and "the drain did not end within 2 s" in plain["error"]["message"]
        assert "rank 1 did not answer" in plain["error"]["message"]
        assert _gone(pids[0], DRAIN + 6) and time.monotonic() - start < DRAIN + 6
        os.kill(pids[1], signal.SIGCONT)
        assert server.proc.wait(120) != 0  # the launcher ends rank 1 (slow on a busy machine)
    finally:
        server.kill()


def test_sigterm_while_warming_up_exits_0(tmp_path: Path) -> None:
    port = free_port()
    # the demo model cut to one layer: the warm-up's first graphs, which end before the signal
    # is answered, compile in half the time (the model's text is not the point here)
    model = demo_with_layers(tmp_path / "demo1", 1)
    cmd = [sys.executable, "-m", "torch_tensorrt_dist", "serve", "--tp", "2", "--port", str(port)]
    # the eager engine compiles (a warm-up to stop) without the default's TensorRT probe (a
    # child process) and Inductor's C++ compiles; which engine warms up is not the point here
    cmd += ["--engine", "eager", "--model", str(model)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    try:
        deadline = time.monotonic() + 120
        while True:  # /health answers once the model is loaded, before the graphs compile
            assert time.monotonic() < deadline and proc.poll() is None
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
                if health.json()["status"] == "warming":
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        assert health.status_code == 503
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=150)  # the graph compiling then ends first
        assert proc.returncode == 0, out
        assert "rank 1: no decode steps" in out and "serving" not in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
