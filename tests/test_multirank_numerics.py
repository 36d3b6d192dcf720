"""Sharded models compiled with our backend on real gloo ranks equal the unsharded model.

One spawn of 2 ranks runs every 2-rank case (the eager engine's plans and the Inductor one);
a spawn of 4 ranks runs the 2x2 mesh."""

from __future__ import annotations

import pytest

from torch_tensorrt_dist.testing import run_on_ranks

from . import _rank_fns

TOL = {"float32": 1e-5, "bfloat16": 2e-2}

EAGER_CASES = [
    ("mlp", "eager", 2, "float32"),
    ("mlp", "eager", 2, "bfloat16"),
    ("funcol-mlp", "eager", 2, "float32"),
    ("mlp-sp", "eager", 2, "float32"),
    ("all-to-all", "eager", 2, "float32"),
]


def _check(results: list[list[dict]], cases: list[tuple[str, str, int, str]], world: int) -> None:
    for rank, per_rank in enumerate(results):
        for case, res in zip(cases, per_rank):
            _, _, tp, dtype = case
            assert res["graphs"] == 1, (case, res)
            assert res["max_err"] <= TOL[dtype], (case, rank, res)
            expected_ranks = list(range(rank // tp * tp, rank // tp * tp + tp))
            assert res["tp_ranks"] == expected_ranks
            assert res["collectives"], case
            assert all(ranks == expected_ranks for _, ranks in res["collectives"]), res


INDUCTOR_CASES = [("mlp", "inductor", 2, "float32")]


@pytest.fixture(scope="module")
def two_ranks() -> list[list[dict]]:
    """Every 2-rank case in one spawn (a spawn's start-up costs more than a case): per rank,
    the results of :data:`EAGER_CASES`, then of :data:`INDUCTOR_CASES`."""
    cases = EAGER_CASES + INDUCTOR_CASES
    return run_on_ranks(_rank_fns.compiled_cases, 2, cases, timeout=300)


def test_two_ranks_eager_engine_every_plan(two_ranks: list[list[dict]]) -> None:
    results = [per_rank[: len(EAGER_CASES)] for per_rank in two_ranks]
    _check(results, EAGER_CASES, 2)
    ops = {c[0]: [op for op, _ in r["collectives"]] for c, r in zip(EAGER_CASES, results[0])}
    assert ops["mlp"] == ["all_reduce"]
    assert ops["mlp-sp"] == ["all_gather", "reduce_scatter"]
    assert ops["all-to-all"] == ["all_to_all", "all_to_all"]


def test_two_ranks_inductor_engine(two_ranks: list[list[dict]]) -> None:
    results = [per_rank[len(EAGER_CASES) :] for per_rank in two_ranks]
    assert len(results[0]) == len(INDUCTOR_CASES)
    _check(results, INDUCTOR_CASES, 2)


@pytest.mark.slow
def test_four_ranks_2x2_mesh_tp_inner() -> None:
    """dp=2 x tp=2: ranks {0,1} and {2,3} are TP groups; each replica gets its own input.
    Includes an attention block with a plan the foundation never special-cased."""
    cases = [
        ("mlp", "eager", 2, "float32"),
        ("block", "eager", 2, "float32"),
        ("mlp-sp", "inductor", 2, "float32"),
    ]
    _check(run_on_ranks(_rank_fns.compiled_cases, 4, cases, timeout=300), cases, 4)
