"""The launcher-variable bridge (plan_from_env) and the timeout setting: pure, no processes."""

from __future__ import annotations

from datetime import timedelta

import pytest

from torch_tensorrt_dist.errors import ConfigError, DistributedSetupError
from torch_tensorrt_dist.runtime.env import DistPlan, is_launched, mpi_world_size, plan_from_env
from torch_tensorrt_dist.runtime.timeouts import DEFAULT_TIMEOUT, TIMEOUT_ENV, resolve_timeout

MASTER = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}


def test_single_process_needs_no_variables() -> None:
    plan = plan_from_env({"PATH": "/usr/bin"})
    assert plan == DistPlan("single", 0, 1, 0, 1, None, None)
    assert not plan.needs_rendezvous
    assert not is_launched({"PATH": "/usr/bin"})


def test_torchrun_variables() -> None:
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", **MASTER}
    plan = plan_from_env(env)
    assert plan == DistPlan("torchrun", 5, 8, 1, 4, "10.0.0.1", 29500)
    assert plan.needs_rendezvous
    assert is_launched(env)


def test_open_mpi_uses_the_world_rank_not_the_local_rank() -> None:
    env = {
        "OMPI_COMM_WORLD_RANK": "6",
        "OMPI_COMM_WORLD_SIZE": "8",
        "OMPI_COMM_WORLD_LOCAL_RANK": "2",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
        **MASTER,
    }
    plan = plan_from_env(env)
    assert (plan.source, plan.rank, plan.world_size) == ("mpi", 6, 8)
    assert (plan.local_rank, plan.local_world_size) == (2, 4)
    assert is_launched(env)


def test_agreeing_torchrun_and_mpi_variables_are_accepted_as_mpi() -> None:
    env = {"RANK": "1", "WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"}
    env |= {"OMPI_COMM_WORLD_SIZE": "2", **MASTER}
    assert plan_from_env(env).source == "mpi"


def test_world_size_one_needs_no_master_address() -> None:
    plan = plan_from_env({"RANK": "0", "WORLD_SIZE": "1"})
    assert (plan.source, plan.world_size, plan.master_addr) == ("torchrun", 1, None)


def test_missing_local_rank_defaults_to_the_rank_on_one_node() -> None:
    plan = plan_from_env({"RANK": "3", "WORLD_SIZE": "4", **MASTER})
    assert (plan.local_rank, plan.local_world_size) == (3, 4)
    plan = plan_from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", **MASTER})
    assert plan.local_rank == 1


@pytest.mark.parametrize(
    ("extra", "names"),
    [
        ({"RANK": "1", "OMPI_COMM_WORLD_RANK": "0"}, ["RANK=1", "OMPI_COMM_WORLD_RANK=0"]),
        (
            {"WORLD_SIZE": "4", "OMPI_COMM_WORLD_SIZE": "2"},
            ["WORLD_SIZE=4", "OMPI_COMM_WORLD_SIZE=2"],
        ),
        (
            {"LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "0"},
            ["LOCAL_RANK=1", "OMPI_COMM_WORLD_LOCAL_RANK=0"],
        ),
    ],
)
def test_conflicting_variables_are_named(extra: dict[str, str], names: list[str]) -> None:
    env = {"RANK": "0", "WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0"}
    env |= {"OMPI_COMM_WORLD_SIZE": "2", **MASTER, **extra}
    with pytest.raises(DistributedSetupError, match="conflicting launcher variables") as err:
        plan_from_env(env)
    for name in names:
        assert name in str(err.value)


def test_mpi_without_master_address_says_how_to_fix() -> None:
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}
    with pytest.raises(DistributedSetupError) as err:
        plan_from_env(env)
    text = str(err.value)
    assert "MASTER_ADDR and MASTER_PORT not set" in text
    assert "--launcher mpi" in text and "mpirun -x MASTER_ADDR" in text


def test_torchrun_without_master_port_is_named() -> None:
    with pytest.raises(DistributedSetupError, match=r"^MASTER_PORT not set.*torchrun"):
        plan_from_env({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"})


@pytest.mark.parametrize(
    ("env", "pattern"),
    [
        ({"RANK": "x", "WORLD_SIZE": "2"}, r"RANK='x' is not an integer"),
        ({"RANK": "1"}, r"RANK is set but WORLD_SIZE is not"),
        ({"OMPI_COMM_WORLD_SIZE": "2"}, r"OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK"),
        ({"RANK": "2", "WORLD_SIZE": "2", **MASTER}, r"RANK=2 is outside 0..1"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, r"WORLD_SIZE=0: the world size must be >= 1"),
        (
            {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2", **MASTER},
            r"LOCAL_RANK=2 is outside 0..1",
        ),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"}, "TCP port"),
    ],
)
def test_malformed_variables(env: dict[str, str], pattern: str) -> None:
    with pytest.raises(DistributedSetupError, match=pattern):
        plan_from_env(env)


def test_timeout_sources_in_order() -> None:
    assert resolve_timeout(None, {}) == DEFAULT_TIMEOUT == timedelta(minutes=10)
    assert resolve_timeout(None, {TIMEOUT_ENV: "7.5"}) == timedelta(seconds=7.5)
    assert resolve_timeout(30, {TIMEOUT_ENV: "7.5"}) == timedelta(seconds=30)
    assert resolve_timeout(timedelta(minutes=2), {}) == timedelta(seconds=120)


@pytest.mark.parametrize(
    ("value", "env", "pattern"),
    [
        (None, {TIMEOUT_ENV: "soon"}, f"{TIMEOUT_ENV}='soon' is not a number of seconds"),
        (0, {}, "must be a positive time"),
        (-3.0, {}, "must be a positive time"),
        (float("inf"), {}, "must be a positive time"),
        (True, {}, "timedelta or a number of seconds, got bool"),
    ],
)
def test_bad_timeouts(value: object, env: dict[str, str], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        resolve_timeout(value, env)  # type: ignore[arg-type]


def test_mpi_world_size() -> None:
    assert mpi_world_size({"RANK": "0", "WORLD_SIZE": "8"}) is None  # torchrun: no MPI world
    assert mpi_world_size({"OMPI_COMM_WORLD_SIZE": "4"}) == 4
    assert mpi_world_size({"PMI_SIZE": "2"}) == 2  # MPICH / Intel MPI
    with pytest.raises(DistributedSetupError, match="OMPI_COMM_WORLD_SIZE='four'"):
        mpi_world_size({"OMPI_COMM_WORLD_SIZE": "four"})
