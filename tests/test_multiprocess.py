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


def _environment_and_parent(rank: int, world: int, name: str) -> tuple[str | None, int]:
    print(f"rank {rank} on stdout")
    return os.environ.get(name), os.getppid()


def test_forked_ranks_get_the_callers_environment_and_streams_at_the_call(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The suite forks ranks from a server (conftest: ``use_forkserver``) started at an earlier
    call: a variable set or removed since then, and this test's stdout, still reach them."""
    run_on_ranks(_square, 1, 0, backend="", timeout=120)  # the server runs from here on
    monkeypatch.setenv("TTD_RANK_PROBE", "set after the server started")
    monkeypatch.delenv("HOME", raising=False)
    results = run_on_ranks(_environment_and_parent, 2, "TTD_RANK_PROBE", backend="", timeout=120)
    assert [r[0] for r in results] == ["set after the server started"] * 2
    assert all(r[1] != os.getpid() for r in results)  # forked by the server, not spawned here
    removed = run_on_ranks(_environment_and_parent, 1, "HOME", backend="", timeout=120)
    assert removed[0][0] is None
    out = capfd.readouterr().out
    assert "rank 0 on stdout" in out and "rank 1 on stdout" in out


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
