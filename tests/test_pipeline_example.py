"""The pp x tp torchrun example runs on CPU with 4 ranks (pp 2 x tp 2) and matches one process."""

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
EXAMPLE = ROOT / "examples" / "distributed_inference" / "pipeline_tensor_parallel_llama.py"


def test_pipeline_tensor_parallel_example_four_ranks(tmp_path: Path) -> None:
    hf = _llama_ckpt.save_checkpoint("llama_gqa", tmp_path, num_hidden_layers=4)
    expected = _llama_ckpt.hf_greedy(hf, list(b"Hello"), 6)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "py"), env.get("PYTHONPATH", "")])
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "4",
        "--master-port",
        str(free_port()),
        str(EXAMPLE),
        "--model",
        str(tmp_path),
        "--pp",
        "2",
        "--tp",
        "2",
        "--split",
        "1,3",
        "--engine",
        "none",
        "--prompt",
        "Hello",
        "--max-new-tokens",
        "6",
        "--check",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 1, proc.stdout
    out = json.loads(lines[0])
    assert out["match"] is True and (out["pp"], out["tp"]) == (2, 2)
    assert out["tokens"] == expected
    assert out["layers"] == [0]  # rank 0 is stage 0 of the 1,3 split
    assert len(out["peak_rss_mib"]) == 4 and all(r > 0 for r in out["peak_rss_mib"])
