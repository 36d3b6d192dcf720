"""End to end on CPU: `torchtrt-dist run` and plain mpirun start 2 gloo ranks; failures stop the
job fast and name the rank. Each launch is a real process tree with a hard time limit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "tests" / "scripts" / "dist_probe.py"
#: A rank's death must end the whole job within this many seconds (measured: about 1-5 s).
FAULT_BOUND_S = 30.0


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_"))}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "py"), env.get("PYTHONPATH")) if p)
    env["OMP_NUM_THREADS"] = "1"
    return env


def _run(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, cwd=ROOT, env=env or _env(), capture_output=True, text=True, timeout=150
    )


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch_tensorrt_dist", "run", *args]


def _probes(stdout: str) -> list[dict[str, Any]]:
    rows = [json.loads(line[6:]) for line in stdout.splitlines() if line.startswith("PROBE ")]
    return sorted(rows, key=lambda r: r["rank"])


def _check_two_ranks(out: subprocess.CompletedProcess[str], launcher: str) -> list[dict[str, Any]]:
    assert out.returncode == 0, out.stderr[-3000:]
    rows = _probes(out.stdout)
    assert [r["rank"] for r in rows] == [0, 1], out.stdout
    for r in rows:
        assert (r["world_size"], r["local_rank"], r["launcher"]) == (2, r["rank"], launcher)
        assert r["backend"] == "gloo"
        assert r["sum"] == 3.0  # all_reduce of 1 + 2 across both ranks
    return rows


@pytest.mark.mpi
@pytest.mark.slow
def test_plain_mpirun_two_ranks() -> None:
    from torch_tensorrt_dist.runtime.launcher import free_port

    env = _env() | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    cmd = ["mpirun", "-np", "2", *root, "--oversubscribe", "--bind-to", "none"]
    cmd += [
        "-x",
        "MASTER_ADDR",
        "-x",
        "MASTER_PORT",
        "-x",
        "PYTHONPATH",
        sys.executable,
        str(PROBE),
    ]
    rows = _check_two_ranks(_run(cmd, env), "mpi")
    # init_distributed exported the torch names from Open MPI's global rank.
    assert [(r["env_rank"], r["ompi_rank"]) for r in rows] == [("0", "0"), ("1", "1")]


@pytest.mark.mpi
@pytest.mark.slow
def test_cli_mpi_launcher_two_ranks() -> None:
    out = _run(_cli("--launcher", "mpi", "--nproc-per-node", "2", "--timeout", "20", str(PROBE)))
    rows = _check_two_ranks(out, "mpi")
    assert all(r["timeout_s"] == 20.0 for r in rows)
    from torch_tensorrt_dist.runtime.nccl_env import find_nccl_library

    assert {r["nccl_library"] for r in rows} == {find_nccl_library(os.environ)}


@pytest.mark.slow
def test_cli_torchrun_launcher_two_ranks() -> None:
    out = _run(_cli("--nproc-per-node", "2", "--timeout", "20", str(PROBE)))
    rows = _check_two_ranks(out, "torchrun")
    assert all(r["timeout_s"] == 20.0 and r["ompi_rank"] is None for r in rows)


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    ("launcher", "how", "rank", "status", "words"),
    [
        # rank 0 raises while rank 1 computes: the launcher then stops rank 1 with SIGTERM,
        # and names rank 0 with its error and status (not rank 1, not 143)
        (
            "torchrun",
            ["--fail-rank", "0", "--raise", "--sleep-rank", "1"],
            0,
            1,
            "exited with code 1",
        ),
        # rank 1 dies in native code (an abort): named by its signal, and its Python stack
        # is in the output (``faulthandler``, enabled by the rank entry)
        (
            "torchrun",
            ["--fail-rank", "1", "--abort"],
            1,
            134,
            "was killed by SIGABRT (signal 6)",
        ),
        pytest.param(
            "mpi",
            ["--fail-rank", "1", "--kill"],
            1,
            137,
            "was killed by SIGKILL (signal 9)",
            marks=pytest.mark.mpi,
        ),
    ],
    ids=["torchrun-raise", "torchrun-abort", "mpi-kill"],
)
def test_the_first_failing_rank_stops_the_job_and_is_named(
    tmp_path: Path,
    record_property: Any,
    launcher: str,
    how: list[str],
    rank: int,
    status: int,
    words: str,
) -> None:
    death = tmp_path / "death"
    args = ["--death-file", str(death), *how]
    out = _run(_cli("--launcher", launcher, "--nproc-per-node", "2", str(PROBE), *args))
    exited = time.time()
    assert death.exists(), out.stderr[-3000:]
    stop_s = exited - float(death.read_text())
    record_property(f"{launcher}_death_to_exit_s", round(stop_s, 2))
    assert out.returncode == status, out.stderr[-3000:]
    assert stop_s < FAULT_BOUND_S
    assert _probes(out.stdout) == []  # no rank finished its all_reduce
    lines = out.stderr.strip().splitlines()
    assert lines[-1].startswith(f"torchtrt-dist run ({launcher}): rank {rank} of 2")
    assert words in lines[-1] and "the other ranks were stopped" in lines[-1]
    # one line for the error (none for a kill): no traceback, no agent warning about the rank
    # it stopped, no Open MPI banner
    assert "Traceback" not in out.stderr and "SIGTERM" not in out.stderr, out.stderr[-3000:]
    assert "mpirun" not in out.stderr
    if "--abort" in how:
        assert "Fatal Python error: Aborted" in out.stderr and "dist_probe.py" in out.stderr
    elif launcher == "torchrun":
        assert lines[-2] == "rank 0: ValueError: probe failure on rank 0"
        assert lines[-1].endswith(" (-v shows its traceback)")


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_collective_timeout_names_the_rank_that_timed_out() -> None:
    # rank 0 computes while rank 1 waits for it in an all_reduce, past the 3 s timeout; then
    # the launcher stops rank 0 with SIGTERM
    out = _run(_cli("--nproc-per-node", "2", "--timeout", "3", str(PROBE), "--sleep-rank", "0"))
    assert out.returncode == 1, out.stderr[-3000:]  # rank 1's status, not 143
    error, named = out.stderr.strip().splitlines()[-2:]
    assert error.startswith("rank 1: RuntimeError: ") and "Timed out" in error, out.stderr
    assert named.startswith("torchtrt-dist run (torchrun): rank 1 of 2")
    assert "SIGTERM" not in out.stderr and "Traceback" not in out.stderr


def test_busy_master_port_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    from torch_tensorrt_dist.cli import main

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code = main(["run", "--nproc-per-node", "2", "--master-port", str(port), str(PROBE)])
    err = capsys.readouterr().err
    assert code == 2
    assert err == (
        f"torchtrt-dist run: the rendezvous port 127.0.0.1:{port} is already in use (another "
        "job or a process still holding it); choose another --master-port, or leave it unset "
        "on one node for a free port\n"
    )


def test_cli_reports_bad_options_in_one_line() -> None:
    from torch_tensorrt_dist.cli import main

    with pytest.raises(SystemExit):
        main(["run", "--launcher", "slurm", "x.py"])


def test_mpi_mode_rejects_node_rank(capsys: pytest.CaptureFixture[str]) -> None:
    from torch_tensorrt_dist.cli import main

    code = main(["run", "--launcher", "mpi", "--nnodes", "2", "--node-rank", "1", "x.py"])
    err = capsys.readouterr().err
    assert code == 2
    assert "--node-rank has no meaning with --launcher mpi" in err
