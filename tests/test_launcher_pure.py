"""Launcher logic without ranks: mpirun and torchrun command lines, NCCL environment, failure
parsing, and the mpirun runner's stderr copy and signal forwarding (with a stand-in child).
(Failure records, the choice of the failed rank and ``agree``: test_rank_errors_pure.py.)"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.runtime.failures import (
    FailedRank,
    LaunchInterrupted,
    exit_status,
    format_failure,
    parse_mpirun_failure,
    pick_first_failure,
    read_failure_records,
)
from torch_tensorrt_dist.runtime.launcher import LaunchOptions, build_torchrun_argv
from torch_tensorrt_dist.runtime.mpi import (
    MpiCommand,
    build_mpirun_command,
    first_host,
    root_env,
    run_mpirun,
)
from torch_tensorrt_dist.runtime.nccl_env import (
    NCCL_LIBRARY_ENV,
    find_nccl_library,
    nccl_env_additions,
)

PROGRAM = ["/usr/bin/python3", "-u", "app.py", "--x", "1"]


def test_mpirun_single_node_command() -> None:
    cmd = build_mpirun_command(
        MpiCommand(PROGRAM, nproc_per_node=2, forward=["MASTER_ADDR", "MASTER_PORT", "MASTER_ADDR"])
    )
    assert cmd == [
        "mpirun",
        "-np",
        "2",
        "--bind-to",
        "none",
        "-x",
        "MASTER_ADDR",
        "-x",
        "MASTER_PORT",
        *PROGRAM,
    ]


def test_mpirun_as_root_multi_node_command() -> None:
    spec = MpiCommand(
        PROGRAM,
        nproc_per_node=4,
        nnodes=2,
        hostfile="hosts.txt",
        forward=["MASTER_ADDR"],
        as_root=True,
        oversubscribe=True,
        bind_to="numa",
        mpirun="/opt/ompi/bin/mpirun",
    )
    cmd = build_mpirun_command(spec)
    assert spec.world_size == 8
    assert cmd[:3] == ["/opt/ompi/bin/mpirun", "-np", "8"]
    assert "--allow-run-as-root" in cmd and "--oversubscribe" in cmd
    assert cmd[cmd.index("--hostfile") + 1] == "hosts.txt"
    assert cmd[cmd.index("--map-by") + 1] == "ppr:4:node"
    assert cmd[cmd.index("--bind-to") + 1] == "numa"
    assert cmd[-len(PROGRAM) :] == PROGRAM


def test_mpirun_refuses_several_nodes_without_hostfile() -> None:
    with pytest.raises(ConfigError, match="needs --hostfile"):
        MpiCommand(PROGRAM, nproc_per_node=2, nnodes=2)
    with pytest.raises(ConfigError, match="no program"):
        MpiCommand([], nproc_per_node=2)


def test_root_env_and_hostfile() -> None:
    assert root_env(False) == {}
    assert root_env(True) == {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    assert first_host("# nodes\n\n  node-a slots=8\nnode-b slots=8\n") == "node-a"
    assert first_host("# empty\n") is None


def _torchrun_args(opts: LaunchOptions) -> object:
    from torch.distributed.run import get_args_parser

    return get_args_parser().parse_args(build_torchrun_argv(opts, ["app.py", "--x", "1"]))


def test_torchrun_single_node_uses_a_free_local_rendezvous() -> None:
    args = _torchrun_args(LaunchOptions(nproc_per_node=2))
    assert (args.nproc_per_node, args.nnodes) == ("2", "1")  # type: ignore[attr-defined]
    assert (args.rdzv_backend, args.rdzv_endpoint) == ("c10d", "localhost:0")  # type: ignore[attr-defined]
    assert args.max_restarts == 0  # type: ignore[attr-defined]
    assert args.training_script == "app.py"  # type: ignore[attr-defined]
    assert args.training_script_args == ["--x", "1"]  # type: ignore[attr-defined]


def test_torchrun_multi_node_static_and_c10d() -> None:
    static = _torchrun_args(
        LaunchOptions(nproc_per_node=4, nnodes=2, node_rank=1, master_addr="n0", master_port=29501)
    )
    assert static.rdzv_backend == "static"  # type: ignore[attr-defined]
    assert (static.node_rank, static.master_addr, static.master_port) == (1, "n0", 29501)  # type: ignore[attr-defined]
    c10d = _torchrun_args(LaunchOptions(nproc_per_node=4, nnodes=2, rdzv_endpoint="n0:29400"))
    assert (c10d.rdzv_backend, c10d.rdzv_endpoint) == ("c10d", "n0:29400")  # type: ignore[attr-defined]
    assert c10d.rdzv_id == "torchtrt-dist"  # type: ignore[attr-defined]  # same id on every node


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"launcher": "slurm"}, "choose 'torchrun' or 'mpi'"),
        ({"nnodes": 0}, "must be >= 1"),
        ({"nnodes": 2, "node_rank": 2}, r"node_rank=2 must be in 0..1"),
    ],
)
def test_bad_launch_options(kwargs: dict[str, object], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        LaunchOptions(nproc_per_node=2, **kwargs)  # type: ignore[arg-type]


def test_nccl_env_additions() -> None:
    lib = "/site/nvidia/nccl/lib/libnccl.so.2"
    assert nccl_env_additions({"LD_LIBRARY_PATH": "/a"}, None) == {}
    out = nccl_env_additions({"LD_LIBRARY_PATH": "/a:/site/nvidia/nccl/lib:/b"}, lib)
    assert out == {NCCL_LIBRARY_ENV: lib, "LD_LIBRARY_PATH": "/site/nvidia/nccl/lib:/a:/b"}
    out = nccl_env_additions({"LD_LIBRARY_PATH": "/site/nvidia/nccl/lib"}, lib)
    assert "LD_LIBRARY_PATH" not in out  # already first
    out = nccl_env_additions({"LD_PRELOAD": "libfoo.so"}, lib, preload=True)
    assert out["LD_PRELOAD"] == f"{lib}:libfoo.so"
    assert out["LD_LIBRARY_PATH"] == "/site/nvidia/nccl/lib"


def test_find_nccl_library(tmp_path: Path) -> None:
    forced = tmp_path / "libnccl.so.2"
    forced.write_bytes(b"")
    assert find_nccl_library({NCCL_LIBRARY_ENV: str(forced)}) == str(forced)
    with pytest.raises(ConfigError, match="is not a file"):
        find_nccl_library({NCCL_LIBRARY_ENV: str(tmp_path / "missing.so")})
    found = find_nccl_library({})
    if found is not None:  # torch's CUDA wheels ship nvidia-nccl; CPU wheels do not
        assert found.endswith("/nvidia/nccl/lib/libnccl.so.2") and os.path.isfile(found)


# Text printed by Open MPI 4.1.4's mpirun on this machine when rank 1 ran `exit 3`, and when it
# was killed with SIGKILL.
MPIRUN_EXIT = """--------------------------------------------------------------------------
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
--------------------------------------------------------------------------
--------------------------------------------------------------------------
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[30572,1],1]
  Exit code:    3
--------------------------------------------------------------------------
"""
MPIRUN_SIGNAL = (
    "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed).\n"
)


def test_parse_mpirun_failures() -> None:
    assert parse_mpirun_failure(MPIRUN_EXIT) == FailedRank(1, exit_code=3)
    assert parse_mpirun_failure(MPIRUN_EXIT.replace("[[30572,1],1]", "[[30572,1],12]")) == (
        FailedRank(12, exit_code=3)
    )
    # PRRTE (Open MPI 5) spells the process name differently.
    assert parse_mpirun_failure("Process name: [prterun-vm-99@1,5]\n  Exit code: 7") == (
        FailedRank(5, exit_code=7)
    )
    assert parse_mpirun_failure(MPIRUN_SIGNAL) == FailedRank(1, signal=9, host="vm")
    assert parse_mpirun_failure("some unrelated output\n") is None


def test_first_failure_prefers_an_abrupt_death_over_peers_that_lost_it() -> None:
    failed = {0: FailedRank(0, exit_code=1), 1: FailedRank(1, signal=9)}
    records = {0: {"rank": 0, "exit_code": 1, "time": 10.0, "error": "RuntimeError: reset"}}
    assert pick_first_failure(failed, records) == FailedRank(1, signal=9)


def test_a_rank_the_launcher_stopped_is_not_the_first_failure() -> None:
    # torchrun saw rank 1 die of SIGKILL, sent SIGTERM to rank 0 before rank 0 noticed, and
    # listed both as failed; neither left a record
    failed = {0: FailedRank(0, signal=15, pid=7), 1: FailedRank(1, signal=9, pid=8)}
    assert pick_first_failure(failed, {}) == FailedRank(1, signal=9, pid=8)
    # rank 0 raised while rank 1 was busy; the launcher then stopped rank 1 with SIGTERM
    failed = {0: FailedRank(0, exit_code=1, pid=7), 1: FailedRank(1, signal=15, pid=8)}
    records = {0: {"rank": 0, "exit_code": 1, "time": 3.0, "error": "ValueError: bad"}}
    first = pick_first_failure(failed, records)
    assert first == FailedRank(0, exit_code=1, pid=7, detail="ValueError: bad")
    assert exit_status(first, 143) == 1  # the cause's status, not the stopped rank's
    # a SIGTERM with nothing else failed (someone stopped that rank from outside) is the cause
    assert pick_first_failure({2: FailedRank(2, signal=15)}, {}) == FailedRank(2, signal=15)


def test_first_failure_is_the_earliest_record() -> None:
    failed = {0: FailedRank(0, exit_code=1, pid=7), 1: FailedRank(1, exit_code=1, pid=8)}
    records = {
        0: {"rank": 0, "exit_code": 1, "time": 10.5, "error": "RuntimeError: Connection reset"},
        1: {"rank": 1, "exit_code": 1, "time": 10.2, "error": "ValueError: bad shape"},
    }
    first = pick_first_failure(failed, records)
    assert first == FailedRank(1, exit_code=1, pid=8, detail="ValueError: bad shape")
    assert pick_first_failure({}, {}) is None


def test_failure_records_on_disk(tmp_path: Path) -> None:
    (tmp_path / "rank-3.json").write_text('{"rank": 3, "exit_code": 2, "time": 1.0}')
    (tmp_path / "rank-4.json").write_text("{half")
    (tmp_path / "other.txt").write_text("x")
    assert read_failure_records(str(tmp_path)) == {3: {"rank": 3, "exit_code": 2, "time": 1.0}}
    assert read_failure_records(str(tmp_path / "absent")) == {}


def test_failure_line_and_exit_status() -> None:
    killed = FailedRank(1, signal=9, host="node-b", pid=42)
    line = format_failure("mpi", killed, 4)
    assert line == (
        "torchtrt-dist run (mpi): rank 1 of 4 (on node-b, pid 42) was killed by SIGKILL "
        "(signal 9); the other ranks were stopped."
    )
    assert exit_status(killed, 137) == 137
    assert exit_status(FailedRank(0, exit_code=3), 1) == 3
    assert exit_status(None, -15) == 143
    assert "a rank of 2 failed" in format_failure("torchrun", None, 2)


def test_run_mpirun_copies_stderr_and_names_the_rank(capfd: pytest.CaptureFixture[str]) -> None:
    # A stand-in for mpirun (no ranks): prints Open MPI's real failure text and exits 3.
    code = f"import sys; sys.stderr.write({MPIRUN_EXIT!r}); sys.exit(3)"
    returncode, failure = run_mpirun([sys.executable, "-c", code], os.environ)
    assert (returncode, failure) == (3, FailedRank(1, exit_code=3))
    assert "Process name: [[30572,1],1]" not in capfd.readouterr().err  # the launcher reports


def test_sigterm_to_the_launcher_stops_mpirun() -> None:
    child = [sys.executable, "-c", "import time; time.sleep(60)"]
    ours = signal.getsignal(signal.SIGTERM)

    def stop_once_forwarded() -> None:
        # SIGTERM only once run_mpirun forwards it (a fixed delay could hit pytest itself)
        deadline = time.monotonic() + 60
        while signal.getsignal(signal.SIGTERM) is ours and time.monotonic() < deadline:
            time.sleep(0.005)
        if signal.getsignal(signal.SIGTERM) is not ours:
            os.kill(os.getpid(), signal.SIGTERM)

    start = time.monotonic()
    threading.Thread(target=stop_once_forwarded, daemon=True).start()
    with pytest.raises(LaunchInterrupted) as err:
        run_mpirun(child, os.environ)
    assert err.value.signum == signal.SIGTERM
    assert time.monotonic() - start < 20
