"""Faults end to end: a rank killed mid-decode stops the job, fast, with the rank named.

(Different input shapes on different ranks and a rank past the timeout: test_schedule_check.py;
a rank leaving while another waits in a collective, and collective timeouts:
test_launcher_run.py and test_runtime_distributed.py.)
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "scripts" / "decode_fault.py"
BOUND_S = 30.0  # from the death of a rank to the exit of the launcher


@pytest.mark.timeout(300)
@pytest.mark.parametrize("launcher", ["torchrun", pytest.param("mpi", marks=pytest.mark.mpi)])
def test_rank_killed_mid_decode(launcher: str, tmp_path: Path) -> None:
    death = tmp_path / "death"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch_tensorrt_dist",
            "run",
            "--launcher",
            launcher,
            "--nproc-per-node",
            "2",
            str(SCRIPT),
            "--die-rank",
            "1",
            "--die-step",
            "3",
            "--death-file",
            str(death),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    end = time.time()
    assert proc.returncode != 0
    assert death.exists(), proc.stderr[-2000:]  # rank 1 really died mid-decode
    elapsed = end - float(death.read_text())
    assert elapsed < BOUND_S, f"{elapsed:.1f} s from the death to the launcher's exit"
    lines = [line for line in proc.stderr.splitlines() if line.startswith("torchtrt-dist run")]
    assert lines and "rank 1 of 2" in lines[-1], proc.stderr[-2000:]
    print(f"{launcher}: launcher exit {elapsed:.1f} s after the rank's death")
