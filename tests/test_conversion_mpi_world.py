"""The plugin path refuses to build outside an MPI world that matches torch.distributed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torch_tensorrt_dist.conversion import check_plugin_world, mpi_world_from_env
from torch_tensorrt_dist.errors import DistributedSetupError

OMPI = {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "3"}


def test_matching_open_mpi_world_passes() -> None:
    world = check_plugin_world([[2, 3], [1, 3]], torch_rank=3, torch_world_size=4, env=OMPI)
    assert (world.size, world.rank, world.source) == (4, 3, "Open MPI environment")


def test_mpich_environment_is_read() -> None:
    world = mpi_world_from_env({"PMI_SIZE": "2", "PMI_RANK": "0"})
    assert world is not None
    assert (world.size, world.rank, world.source) == (2, 0, "MPICH/Hydra environment")


def test_torchrun_alone_is_refused_with_the_launch_to_use() -> None:
    torchrun_env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}
    with pytest.raises(DistributedSetupError) as info:
        check_plugin_world([[0, 1]], torch_rank=1, torch_world_size=2, env=torchrun_env)
    text = str(info.value)
    assert "not started by MPI" in text
    assert "--launcher mpi" in text and "collective_impl='native'" in text


def test_world_size_mismatch() -> None:
    with pytest.raises(DistributedSetupError, match=r"torch\.distributed has 8 ranks but the MPI"):
        check_plugin_world([[0, 1]], torch_rank=3, torch_world_size=8, env=OMPI)


def test_local_rank_used_as_rank_is_caught() -> None:
    with pytest.raises(DistributedSetupError, match=r"not\s+OMPI_COMM_WORLD_LOCAL_RANK"):
        check_plugin_world([[0, 1]], torch_rank=1, torch_world_size=4, env=OMPI)


def test_group_outside_the_world() -> None:
    with pytest.raises(DistributedSetupError, match=r"names ranks \[4, 5\] outside"):
        check_plugin_world(
            [[4, 5]], mpi_world_size=4, mpi_rank=0, torch_rank=0, torch_world_size=4, env={}
        )


def test_tllm_disable_mpi_is_refused() -> None:
    with pytest.raises(DistributedSetupError, match="unset TLLM_DISABLE_MPI"):
        check_plugin_world([[0, 1]], env={**OMPI, "TLLM_DISABLE_MPI": "1"})


def test_garbage_environment() -> None:
    with pytest.raises(DistributedSetupError, match="not integers"):
        mpi_world_from_env({"OMPI_COMM_WORLD_SIZE": "two", "OMPI_COMM_WORLD_RANK": "0"})


_MPI_SCRIPT = """
import importlib.util, os, sys, types
from mpi4py import MPI  # initialises MPI: the check must prefer it to the environment

# load errors.py and mpi_world.py by path: the check needs neither torch nor the package init
pkg = sys.argv[1]
sys.modules["torch_tensorrt_dist"] = types.ModuleType("torch_tensorrt_dist")
for name in ("errors", "conversion/impl/trtllm/mpi_world"):
    mod_name = "torch_tensorrt_dist." + name.replace("/", ".")
    spec = importlib.util.spec_from_file_location(mod_name, os.path.join(pkg, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    spec.loader.exec_module(module)
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
w = module.check_plugin_world([[0, 1]], torch_rank=rank, torch_world_size=2)
with open(os.path.join(sys.argv[2], f"rank{rank}.txt"), "w") as fh:  # no interleaving
    fh.write(f"{w.source} {w.size} {w.rank}")
"""


@pytest.mark.mpi
def test_under_real_mpirun(tmp_path: Path) -> None:
    script = tmp_path / "check.py"
    script.write_text(_MPI_SCRIPT)
    env = dict(os.environ)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    pkg = Path(__file__).parents[1] / "py" / "torch_tensorrt_dist"
    cmd = [
        shutil.which("mpirun") or "mpirun",
        "--oversubscribe",
        "-np",
        "2",
        sys.executable,
        str(script),
        str(pkg),
        str(tmp_path),
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)]
    assert lines == ["mpi4py 2 0", "mpi4py 2 1"]
