"""init_distributed in real processes: one process, two gloo ranks, and a collective timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from torch_tensorrt_dist.errors import DistributedSetupError
from torch_tensorrt_dist.testing import run_on_ranks

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 3.0

_SINGLE = """
import atexit, json, torch_tensorrt_dist as ttd, torch, torch.distributed as dist
# Registered first, so it runs last: after init_distributed's own exit hook.
atexit.register(lambda: print(json.dumps({"initialised_at_exit": dist.is_initialized()})))
info = ttd.init_distributed()
again = ttd.init_distributed()
x = torch.tensor([2.0]); dist.all_reduce(x)
try:
    ttd.init_distributed(backend="nccl")
    switch = "no error"
except ttd.DistributedSetupError as exc:
    switch = str(exc)
print(json.dumps({"info": [info.rank, info.world_size, info.local_rank, info.launcher,
                           info.backend, info.device, info.timeout.total_seconds()],
                  "same": again is info, "sum": x.item(), "switch": switch}))
"""


def test_single_process_without_any_launcher_variable() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_"))}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "py"), env.get("PYTHONPATH", "")])
    env["TORCH_TENSORRT_DIST_TIMEOUT"] = "42"
    out = subprocess.run(
        [sys.executable, "-c", _SINGLE], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    *_, line, at_exit = out.stdout.strip().splitlines()
    data = json.loads(line)
    assert data["info"] == [0, 1, 0, "single", "gloo", "cpu", 42.0]
    assert data["same"] is True and data["sum"] == 2.0
    assert "already initialised with backend 'gloo'; cannot switch to 'nccl'" in data["switch"]
    # The group is destroyed before the interpreter's teardown (a gloo group left to the C++
    # teardown at exit can abort a process whose work all succeeded).
    assert json.loads(at_exit) == {"initialised_at_exit": False}


def test_conflicting_variables_fail_before_any_setup() -> None:
    from torch_tensorrt_dist.runtime import init_distributed

    env = {"RANK": "1", "WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0"}
    env |= {"OMPI_COMM_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    with pytest.raises(DistributedSetupError, match="RANK=1 vs OMPI_COMM_WORLD_RANK=0"):
        init_distributed(env=env)


def _agree_then_time_out(rank: int, world_size: int, timeout_s: float) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from torch_tensorrt_dist.runtime import (
        CollectiveTimeoutError,
        collective_timeouts_explained,
        init_distributed,
    )

    info = init_distributed(timeout=timeout_s)
    x = torch.tensor([float(rank + 1)])
    dist.all_reduce(x)
    out: dict[str, Any] = {
        "rank": info.rank,
        "world_size": info.world_size,
        "launcher": info.launcher,
        "backend": info.backend,
        "timeout": info.timeout.total_seconds() if info.timeout else None,
        "sum": x.item(),
    }
    store = dist.distributed_c10d._get_default_store()
    if rank == 1:  # never joins the next collective, but stays alive until rank 0 timed out
        store.wait(["timed-out"], timedelta(seconds=120))
        store.set("seen", "1")  # rank 0 hosts the store: it waits for this before leaving
        return out
    start = time.monotonic()
    try:
        with collective_timeouts_explained():
            dist.all_reduce(torch.ones(4))
        out["error"] = None
    except CollectiveTimeoutError as exc:
        out["error"] = str(exc)
    out["waited"] = time.monotonic() - start
    store.set("timed-out", "1")
    store.wait(["seen"], timedelta(seconds=120))
    return out


@pytest.fixture(scope="module")
def two_ranks() -> list[dict[str, Any]]:
    return run_on_ranks(_agree_then_time_out, 2, TIMEOUT_S, backend="", timeout=120)


def test_two_gloo_ranks_agree_on_rank_and_world_size(two_ranks: list[dict[str, Any]]) -> None:
    assert [r["rank"] for r in two_ranks] == [0, 1]
    for r in two_ranks:
        assert (r["world_size"], r["backend"], r["timeout"]) == (2, "gloo", TIMEOUT_S)
        assert r["sum"] == 3.0  # 1 + 2
        assert r["launcher"] == "torchrun"  # RANK/WORLD_SIZE/MASTER_* as torchrun sets them


def test_a_rank_that_never_joins_times_out_within_the_limit(
    two_ranks: list[dict[str, Any]],
) -> None:
    waited, error = two_ranks[0]["waited"], two_ranks[0]["error"]
    assert error is not None, "the collective completed although rank 1 never joined"
    assert TIMEOUT_S - 0.5 <= waited <= TIMEOUT_S + 10.0, waited
    assert error.startswith("rank 0 of 2: a collective did not complete within")
    assert f"({TIMEOUT_S:g} s;" in error
    assert "another rank of its group never joined it" in error
    assert "TORCH_TENSORRT_DIST_TIMEOUT" in error
