"""A rank that dies ends the server: what is in flight gets a 503, the server exits non-zero
within 30 s; and ``serve`` refuses bad options before any rank starts."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from typing import Any

import pytest

from torch_tensorrt_dist.cli import main

from ._serve import start_server

httpx = pytest.importorskip("httpx")


def test_a_killed_rank_ends_the_server_with_503s() -> None:
    srv = start_server(["--tp", "2", "--engine", "none", "--max-seq-len", "128",
                        "--max-batch-size", "2"])  # fmt: skip
    try:
        pids = srv.health()["pids"]
        result: dict[str, Any] = {}

        def long() -> None:
            body = {"prompt": "The for statement is used", "max_tokens": 100, "stop": ["zzz"]}
            res = httpx.post(f"{srv.url}/v1/completions", json=body, timeout=60)
            result["status"], result["body"] = res.status_code, res.json()

        t = threading.Thread(target=long)
        t.start()
        deadline = time.monotonic() + 30
        while "torchtrt_running_rows 1.0" not in httpx.get(f"{srv.url}/metrics").text:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        start = time.monotonic()
        os.kill(pids[1], signal.SIGKILL)
        t.join(30)
        assert result["status"] == 503
        error = result["body"]["error"]
        assert error["type"] == "service_unavailable"
        assert "a rank of the server failed" in error["message"]
        code = srv.proc.wait(30)
        assert code != 0 and time.monotonic() - start < 30
        assert re.search(r"rank 1 of 2 .* killed by SIGKILL", srv.output())
    finally:
        srv.kill()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pp", "2"], "pipeline parallel serving is not supported yet"),
        (["--drain-timeout", "40"], r"--drain-timeout 40 must be in \[0, 25\]"),
        (["--port", "70000"], "is not a TCP port"),
        (["--api-key", " "], "--api-key is empty"),
        (["--tp", "3"], "3"),
        (["--max-batch-size", "0"], "must be >= 1"),
        (["--ep", "2"], "needs a mixture-of-experts checkpoint"),
        (["--engine", "none", "--verify"], "compiles nothing"),
        (["--model", "/no/such/dir"], "neither a checkpoint directory nor a preset"),
        (["--artifacts", "/no/such/dir", "--model", "tiny"], "--artifacts replaces --model"),
    ],
)
def test_bad_options_are_refused_before_any_rank_starts(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["serve", *args]) == 2
    assert re.search(message, capsys.readouterr().err)
