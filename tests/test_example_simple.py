"""examples/distributed_inference/tensor_parallel_simple.py under both launchers."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = (
    Path(__file__).parents[1] / "examples" / "distributed_inference" / "tensor_parallel_simple.py"
)


@functools.cache
def _launch(launcher: str, *extra: str) -> dict:
    """The example's JSON line under ``launcher`` (one launch each: the torchrun result serves
    both tests; callers only read it)."""
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
            str(EXAMPLE),
            "--engine",
            "eager",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, proc.stdout  # rank 0 prints one JSON line
    return json.loads(lines[0])


def _check(result: dict) -> None:
    assert result["ok"] is True
    assert [r["rank"] for r in result["ranks"]] == [0, 1]
    for r in result["ranks"]:
        assert r["graphs"] == 1 and r["collectives"] == [["all_reduce", [0, 1]]]
        assert r["max_abs_err"] <= 1e-5


def test_torchrun_launch_matches_the_unsharded_model() -> None:
    _check(_launch("torchrun"))


@pytest.mark.mpi
def test_mpi_launch_prints_the_same_result_as_torchrun() -> None:
    mpi, torchrun = _launch("mpi"), _launch("torchrun")
    _check(mpi)
    assert [r["checksum"] for r in mpi["ranks"]] == [r["checksum"] for r in torchrun["ranks"]]
