"""The serving benchmark's parts: a server process on 127.0.0.1, and an asyncio load generator.

    with ServerProcess(["--tp", "2"]) as server:           # torchtrt-dist serve --port 0
        load = asyncio.run(run_load(server.url, prompts, requests=16, concurrency=8,
                                    max_tokens=32))
        load.tokens_per_s, load.ttft_p50, load.itl_p99
        server.metrics()                                    # /metrics as {name: value}

Every request streams, so time to first token and the gaps between tokens are measured as a
client sees them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch_tensorrt_dist.errors import ConfigError

__all__ = ["Load", "ServerProcess", "percentile", "run_load"]


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by nearest rank; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


@dataclass
class Load:
    """What a load run measured (seconds; tokens counted by the server's usage)."""

    wall_s: float
    tokens: int
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    def p(self, name: str, q: float) -> float:
        return percentile(getattr(self, name), q)


async def _request(
    client: Any, url: str, prompt: str, max_tokens: int
) -> tuple[float, list[float], int, str]:
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    times: list[float] = []
    tokens, text = 0, []
    async with client.stream("POST", f"{url}/v1/completions", json=body) as res:
        if res.status_code != 200:
            raise ConfigError(f"the server answered {res.status_code}: {await res.aread()!r}")
        async for line in res.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if data.get("usage"):
                tokens = int(data["usage"]["completion_tokens"])
            elif data.get("choices") and data["choices"][0]["text"]:
                times.append(time.perf_counter())
                text.append(data["choices"][0]["text"])
    return start, times, tokens, "".join(text)


async def run_load(
    url: str, prompts: list[str], *, requests: int, concurrency: int, max_tokens: int
) -> Load:
    """``requests`` streamed completions (prompts taken in turn) from ``concurrency`` clients."""
    import httpx

    todo: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        todo.put_nowait(i)
    results: list[tuple[float, list[float], int, str]] = [(0.0, [], 0, "")] * requests
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:

        async def worker() -> None:
            while not todo.empty():
                i = todo.get_nowait()
                results[i] = await _request(client, url, prompts[i % len(prompts)], max_tokens)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    load = Load(wall, sum(r[2] for r in results))
    for begin, times, _, text in results:
        if times:
            load.ttft.append(times[0] - begin)
            load.itl += [b - a for a, b in itertools.pairwise(times)]
        load.texts.append(text)
    return load


class ServerProcess:
    """``torchtrt-dist serve ARGS --port 0`` as a child process (one torch thread per rank, or
    with ``threads=None`` whatever the server picks itself), in its own process group; the
    bench uses it as a context manager, the serving tests too."""

    def __init__(
        self,
        args: list[str],
        *,
        start_timeout_s: float = 1800,
        command: list[str] | None = None,
        ready: str = r"serving \S+ at (http://[\w.:\[\]]+)/v1",
        env: dict[str, str] | None = None,
        threads: int | None = 1,
    ) -> None:
        """``command``: run this instead of ``torchtrt-dist serve --port 0 ARGS`` (another
        server: ``transformers serve``); ``ready``: the pattern of its line that says it is up,
        group 1 its URL; ``env``: more environment variables for it; ``threads``: its
        ``OMP_NUM_THREADS`` (None: unset, the server's own default)."""
        self.args, self.timeout, self.threads = args, start_timeout_s, threads
        self.ready, self.extra_env = re.compile(ready), env or {}
        self.command = command or [
            sys.executable,
            "-m",
            "torch_tensorrt_dist",
            "serve",
            "--port",
            "0",
            *args,
        ]
        self.url = ""
        self.lines: list[str] = []
        self._q: queue.Queue[str | None] = queue.Queue()
        self.returncode: int | None = None

    def start(self) -> ServerProcess:
        """Start it; return once it printed its URL (ConfigError with its output if not)."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("OMP_NUM_THREADS", None)
        if self.threads is not None:
            env["OMP_NUM_THREADS"] = str(self.threads)
        env.update(self.extra_env)
        self.proc = subprocess.Popen(
            self.command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )
        threading.Thread(target=self._pump, daemon=True).start()
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            line = self.read(1.0)
            if line is None and self.proc.poll() is not None:
                break
            match = self.ready.search(line or "")
            if match:
                self.url = match.group(1)
                return self
        self.kill()
        raise ConfigError("the server did not start:\n" + self.output()[-4000:])

    def __enter__(self) -> ServerProcess:
        """``with ServerProcess(...)`` starts it; ``with`` over one already started (as
        ``start()`` returns it) keeps that one instead of starting a second."""
        return self if self.url else self.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._q.put(line)
        self._q.put(None)

    def read(self, timeout: float) -> str | None:
        """Its next output line (kept in ``lines``), or None after ``timeout`` s or at its end."""
        try:
            line = self._q.get(timeout=timeout)
        except queue.Empty:
            return None
        if line is not None:
            self.lines.append(line)
        return line

    def output(self) -> str:
        """Everything it printed so far."""
        while self.read(0.1) is not None:
            pass
        return "".join(self.lines)

    def metrics(self) -> dict[str, float]:
        import httpx

        text = httpx.get(f"{self.url}/metrics", timeout=30).text
        return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(\S+) (\S+)$", text, re.M)}

    def memory(self) -> int:
        """The resident bytes of the server's processes (its process group: the HTTP process,
        the launcher and every rank), read from /proc; 0 where /proc is absent."""
        total = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rpartition(")")[2].split()
                if int(fields[2]) == self.proc.pid:  # the process group (field 5 of stat)
                    total += int((stat.parent / "statm").read_text().split()[1])
            except (OSError, ValueError, IndexError):
                continue  # ended meanwhile
        return total * os.sysconf("SC_PAGE_SIZE")

    def health(self) -> dict[str, Any]:
        import httpx

        return dict(httpx.get(f"{self.url}/health", timeout=10).json())

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        """Signal the server (the launcher forwards it to the ranks); after ``timeout`` s, kill
        its whole process group (the ranks too). Its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.returncode = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return self.kill()
        return self.returncode

    def kill(self) -> int:
        """SIGKILL the launcher and its ranks (its process group)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.returncode = self.proc.wait(30)
        return self.returncode

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.output()
