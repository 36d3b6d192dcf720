"""A real ``torchtrt-dist serve`` process for the serving tests: started on a free port of
127.0.0.1, waited for, always stopped."""

from __future__ import annotations

import contextlib
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

import pytest

CHAT_TEMPLATE = (
    "{% for m in messages %}{% if loop.first %}{{ bos_token }}{% endif %}"
    "<|{{ m['role'] }}|>\n{{ m['content'] | trim }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def demo_with_chat_template(dest: Path) -> Path:
    """A copy of the demo checkpoint whose tokenizer_config.json has a chat template."""
    import json
    import shutil

    from torch_tensorrt_dist.models.demo import demo_checkpoint_path

    src = demo_checkpoint_path()
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json"):
        shutil.copy(src / name, dest / name)
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    (dest / "tokenizer_config.json").write_text(json.dumps(cfg))
    return dest


@dataclass
class Server:
    proc: subprocess.Popen[str]
    url: str = ""
    lines: list[str] = field(default_factory=list)
    _q: queue.Queue[str | None] = field(default_factory=queue.Queue)

    def read(self, timeout: float) -> str | None:
        try:
            line = self._q.get(timeout=timeout)
        except queue.Empty:
            return None
        if line is not None:
            self.lines.append(line)
        return line

    def output(self) -> str:
        while self.read(0.1) is not None:
            pass
        return "".join(self.lines)

    def health(self) -> dict[str, Any]:
        import httpx

        return dict(httpx.get(f"{self.url}/health", timeout=10).json())

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        """Signal the server (the launcher forwards it to the ranks); after ``timeout`` s,
        kill its whole process group (the ranks too)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return self.kill()

    def kill(self) -> int:
        """SIGKILL the launcher and its ranks (its process group)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.wait(10)


def start_server(args: list[str], *, timeout: float = 240) -> Server:
    """``torchtrt-dist serve ARGS --port 0``; returns once it printed its URL."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "torch_tensorrt_dist", "serve", "--port", "0", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)  # fmt: skip
    server = Server(proc)

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            server._q.put(line)
        server._q.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = server.read(1.0)
        if line is None and proc.poll() is not None:
            break
        match = re.search(r"serving \S+ at (http://127\.0\.0\.1:\d+)/v1", line or "")
        if match:
            server.url = match.group(1)
            return server
    server.kill()
    pytest.fail(f"the server did not start:\n{server.output()}")
