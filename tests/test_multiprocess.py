"""``run_on_ranks``: results by rank, and a failing rank named with what it raised or, where it
died in native code, with every thread's Python stack (``faulthandler``)."""

from __future__ import annotations

import os

import pytest

from torch_tensorrt_dist.testing.multiprocess import RankFailure, run_on_ranks


def _square(rank: int, world: int, base: int) -> int:
    return base + rank * rank + world


def _raises_on_one(rank: int, world: int) -> int:
    if rank == 1:
        raise ValueError("rank one's own error")
    return rank


def _aborts_inside_a_step(rank: int, world: int) -> None:
    os.abort()  # as glibc does on a corrupted heap ("malloc(): unaligned tcache chunk")


def test_results_come_back_by_rank() -> None:
    assert run_on_ranks(_square, 2, 10, backend="", timeout=120) == [12, 13]


def test_a_failing_rank_is_named_with_its_error() -> None:
    with pytest.raises(RankFailure, match="rank 1 failed: ValueError: rank one's own error") as e:
        run_on_ranks(_raises_on_one, 2, backend="", timeout=120)
    assert e.value.rank == 1


def test_a_rank_that_dies_in_native_code_prints_where(capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RankFailure, match="rank 0 failed: exited without a result"):
        run_on_ranks(_aborts_inside_a_step, 1, backend="", timeout=120)
    err = capfd.readouterr().err
    assert "Fatal Python error: Aborted" in err and "_aborts_inside_a_step" in err
