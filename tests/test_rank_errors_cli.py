"""An unexpected error inside one rank of ``generate --tp 2`` reaches the user: its type and
message in one line, the rank named, the traceback under ``-v``.

The error is injected into rank 1 only (``tests/scripts/inject/sitecustomize.py``: a read of its
checkpoint shard fails as a disk error would), so that no check in the launching process can
catch it first: this test proves the carrying mechanism, whatever is validated up front.
(Refusals of rank 1 under torchrun and mpirun: test_artifacts_inductor.py; ``run``:
test_launcher_run.py.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INJECT = ROOT / "tests" / "scripts" / "inject"
READ = "torch_tensorrt_dist.models.safetensors_io:SafetensorsReader.read_into"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_unexpected_error_in_rank_1_is_carried_with_its_traceback_under_v() -> None:
    launcher_vars = ("OMPI_", "PMIX_", "RANK", "WORLD_SIZE", "LOCAL_", "MASTER_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(launcher_vars)}
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, (str(INJECT), str(ROOT / "py"), env.get("PYTHONPATH")))
    )
    message = "[Errno 5] Input/output error reading model-00002.safetensors"
    env["TORCH_TENSORRT_DIST_TEST_FAULT"] = f"1:{READ}:OSError:{message}"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch_tensorrt_dist",
            "-v",
            "generate",
            "--tp",
            "2",
            "--engine",
            "none",
            "--max-new-tokens",
            "2",
            "--prompt",
            "Hello",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    assert out.returncode == 1, out.stderr[-3000:]  # rank 1's status (an exception: 1)
    assert out.stdout == ""  # rank 0 neither echoed the prompt nor generated
    error, named = out.stderr.strip().splitlines()[-2:]
    assert error == f"error: rank 1: OSError: {message}"
    assert named.startswith("torchtrt-dist run (torchrun): rank 1 of 2 (on ")
    assert named.endswith("exited with code 1; the other ranks were stopped.")
    # -v: rank 1's traceback (from the rank's own frames), and what rank 0 did
    trace = out.stderr.split("rank 1 failed first; its traceback:\n", 1)[1]
    assert trace.startswith("Traceback (most recent call last):")
    assert "in load_sharded" in trace and "in faulty" in trace  # the loader's frames
    assert "_rank_entry.py" not in trace
    assert "rank 0 also failed (repeating rank 1): RankFailedError: rank 1 failed loading the " in (
        out.stderr
    )
