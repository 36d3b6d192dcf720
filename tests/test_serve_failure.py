"""An expert-parallel server (EP 2 x TP 1): exact tokens under concurrency; then one of its
ranks dies: what is in flight gets a 503 and the server exits non-zero within 30 s. And
``serve`` refuses bad options before any rank starts."""

from __future__ import annotations

import concurrent.futures as cf
import os
import re
import signal
import socket
import threading
import time
from typing import Any

import pytest

from torch_tensorrt_dist.cli import main
from torch_tensorrt_dist.generation import Generator
from torch_tensorrt_dist.models.tokenizer import ByteTokenizer
from torch_tensorrt_dist.parallel.moe_load import load_moe

from . import _moe_ckpt
from ._core_fns import one_thread
from ._serve import start_server

httpx = pytest.importorskip("httpx")


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A Mixtral checkpoint (4 experts, top 2) served at EP 2 x TP 1, and each prompt's
    greedy tokens alone through ``generate`` (one process)."""
    path = tmp_path_factory.mktemp("serve_moe") / "mixtral"
    _moe_ckpt.save_checkpoint("mixtral", path)
    gen = Generator(load_moe(path, progress=False), max_batch_size=1, cache_len=64)
    with one_thread():
        alone = [gen.generate([p], max_new_tokens=n).tokens[0] for p, n in zip(PROMPTS, LENGTHS)]
    srv = start_server(
        [
            "--model",
            str(path),
            "--ep",
            "2",
            "--tp",
            "1",
            "--engine",
            "none",
            "--max-seq-len",
            "64",
            "--max-batch-size",
            "2",
        ]
    )
    yield srv, alone
    srv.kill()


PROMPTS = [[3, 5, 7, 9], [40, 41, 42], [100], [7, 8, 9, 10, 11, 12]]
LENGTHS = [12, 5, 9, 7]


def test_expert_parallel_server_gives_each_prompt_its_alone_tokens(moe: Any) -> None:
    """4 concurrent requests on 2 rows (EP 2 x TP 1): joins and leaves at different steps."""
    srv, alone = moe
    tok = ByteTokenizer(130)

    def ask(i: int) -> Any:
        body = {"prompt": PROMPTS[i], "max_tokens": LENGTHS[i], "temperature": 0}
        return httpx.post(f"{srv.url}/v1/completions", json=body, timeout=120).json()

    with cf.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(ask, range(4)))
    for res, ref in zip(results, alone):
        assert res["choices"][0]["text"] == tok.decode(ref)
        assert res["usage"]["completion_tokens"] == len(ref)


def test_a_killed_rank_ends_the_server_with_503s(moe: Any) -> None:
    srv, _ = moe
    pids = srv.health()["pids"]
    result: dict[str, Any] = {}

    def long() -> None:
        body = {"prompt": [5, 6], "max_tokens": 60}
        res = httpx.post(f"{srv.url}/v1/completions", json=body, timeout=60)
        result["status"], result["body"] = res.status_code, res.json()

    t = threading.Thread(target=long)
    t.start()
    deadline = time.monotonic() + 30
    while "torchtrt_running_requests 1.0" not in httpx.get(f"{srv.url}/metrics").text:
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


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pp", "5"], "pp=5 stages but the model has 4 layers"),
        (["--drain-timeout", "400"], r"--drain-timeout 400 must be in \[0, 300\]"),
        (["--port", "70000"], "is not a TCP port"),
        (["--api-key", " "], "--api-key is empty"),
        (["--tp", "3"], "3"),
        (["--max-batch-size", "0"], "must be >= 1"),
        (["--ep", "2"], "needs a mixture-of-experts checkpoint"),
        (["--engine", "none", "--verify"], "compiles nothing"),
        (["--model", "/no/such/dir"], "neither a checkpoint directory nor a preset"),
        (["--artifacts", "/no/such/dir", "--model", "tiny"], "--artifacts replaces --model"),
        (["--max-seq-len", "100000"], r"--max-seq-len 100000 exceeds the model's 256 positions"),
        (["--step-timeout", "0"], r"--step-timeout 0 must be in \(0, 600\)"),
        (["--step-timeout", "nan"], r"--step-timeout nan must be in"),
        (["--step-timeout", "900"], "below the collective timeout"),
        (["--api-key", "clé"], "--api-key must be printable ASCII"),
        (  # the demo model at 256 tokens: 16 blocks of 16, 32 KiB each (2 ranks, fp32)
            ["--tp", "2", "--kv-cache-memory", "100KiB", "--max-seq-len", "256"],
            r"--kv-cache-memory 102400 \(100.0 KiB\) holds \d+ blocks of 16 tokens; one request "
            r"of the longest allowed length \(256 tokens\) needs 16: give at least \d+",
        ),
        (["--kv-cache-memory", "4G"], "--kv-cache-memory"),
        (["--max-prefill-tokens", "8"], "--max-prefill-tokens 8 is below --block-size 16"),
        (["--block-size", "24"], "--block-size 24 is not a power of two"),
    ],
)
def test_bad_options_are_refused_before_any_rank_starts(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["serve", *args]) == 2
    assert re.search(message, capsys.readouterr().err)


@pytest.mark.parametrize("tp", ["1", "2"])
def test_a_busy_port_is_refused_before_the_model_loads(
    capsys: pytest.CaptureFixture[str], tp: str
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        start = time.monotonic()
        assert main(["serve", "--tp", tp, "--port", str(port)]) == 2
    assert f"cannot listen on 127.0.0.1:{port} (Address already in use)" in capsys.readouterr().err
    assert time.monotonic() - start < 10  # no rank started, nothing loaded
