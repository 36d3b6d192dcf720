"""The torchrun example runs on CPU with 2 ranks and matches the unsharded model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torch_tensorrt_dist.testing import free_port

from . import _llama_ckpt

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "distributed_inference" / "tensor_parallel_llama.py"


def test_tensor_parallel_llama_example_two_ranks(tmp_path: Path) -> None:
    # one layer: the example's launch, sharded load, compile and check are under test, not depth
    hf = _llama_ckpt.save_checkpoint("llama_gqa", tmp_path, num_hidden_layers=1)
    expected = _llama_ckpt.hf_greedy(hf, list(b"Hello"), 8)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "py"), env.get("PYTHONPATH", "")])
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        str(free_port()),
        str(EXAMPLE),
        "--model",
        str(tmp_path),
        "--engine",
        "eager",
        "--prompt",
        "Hello",
        "--max-new-tokens",
        "8",
        "--check",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 1, proc.stdout
    out = json.loads(lines[0])
    assert out["match"] is True and out["tp"] == 2 and out["engine"] == "eager"
    assert out["tokens"] == expected
