"""``verify``: the first call of a compiled graph is checked against its eager reference."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import fx
from torch._functorch.aot_autograd import make_boxed_func

from torch_tensorrt_dist.backend.compare import compare_outputs, tolerance_for
from torch_tensorrt_dist.backend.settings import CompileSettings
from torch_tensorrt_dist.backend.verify import (
    exchange_verdicts,
    mutated_inputs,
    reference_graph,
    with_verification,
)
from torch_tensorrt_dist.errors import ConfigError, VerificationError
from torch_tensorrt_dist.testing import run_on_ranks

from . import _verify_fns
from .test_schedule_check import _DictStore

# --- the comparison (pure) ---


def test_tolerances_by_dtype() -> None:
    assert tolerance_for(torch.float32) == 1e-2
    assert tolerance_for(torch.bfloat16) == 5e-2
    assert tolerance_for(torch.float8_e4m3fn) == 1e-1
    assert tolerance_for(torch.int64) == 0.0 and tolerance_for(torch.bool) == 0.0
    assert tolerance_for(torch.float16, 0.3) == 0.3
    assert tolerance_for(torch.int32, 0.3) == 0.0  # an override never loosens integers


def test_float_within_tolerance_passes_and_beyond_fails() -> None:
    e = torch.tensor([1.0, -2.0, 4.0])
    assert compare_outputs([e], [e * (1 + 5e-3)]) is None  # TF32-sized error
    m = compare_outputs([e], [e + torch.tensor([0.0, 0.0, 1.0])])
    assert m is not None and m.index == 0 and m.shape == (3,) and m.dtype == "float32"
    assert math.isclose(m.max_abs_error, 1.0)
    assert m.tolerance == "0.01 * (|expected| + 4)"
    text = m.describe()
    assert "output 0 (float32[3]) differs" in text and "1 of 3 elements" in text
    assert "first at [2] (expected 4, got 5)" in text
    assert compare_outputs([e], [e + torch.tensor([0.0, 0.0, 1.0])], tolerance=0.2) is None


def test_near_zero_elements_are_judged_on_the_output_scale() -> None:
    e = torch.tensor([100.0, 1e-4])
    assert compare_outputs([e], [torch.tensor([100.0, 0.5])]) is None  # 0.5 < 1e-2 * 100
    assert compare_outputs([e], [torch.tensor([100.0, 3.0])]) is not None


def test_integers_and_bools_are_exact() -> None:
    ids = torch.tensor([[1, 2], [3, 4]])
    assert compare_outputs([ids], [ids.clone()]) is None
    m = compare_outputs([ids], [ids + torch.tensor([[0, 0], [1, 0]])], tolerance=0.5)
    assert m is not None and m.tolerance == "exact" and "first at [1, 0]" in m.detail
    assert compare_outputs([torch.tensor([True])], [torch.tensor([False])]) is not None


def test_nan_and_inf_handling() -> None:
    nan, inf = float("nan"), float("inf")
    e = torch.tensor([nan, inf, 1.0])
    assert compare_outputs([e], [e.clone()]) is None  # NaN matches NaN, inf the same inf
    m = compare_outputs([e], [torch.tensor([1.0, inf, 1.0])])
    assert m is not None and "first at [0]" in m.detail and m.max_abs_error == inf
    assert compare_outputs([e], [torch.tensor([nan, -inf, 1.0])]) is not None
    assert compare_outputs([torch.tensor([1.0])], [torch.tensor([nan])]) is not None
    # a NaN elsewhere does not hide a real difference, nor spoil the scale
    m = compare_outputs([e], [torch.tensor([nan, inf, 2.0])])
    assert m is not None and "first at [2]" in m.detail and m.tolerance.endswith("+ 1)")


def test_nested_outputs_name_the_first_differing_leaf() -> None:
    a = torch.ones(2, 3)
    expected = ((a, {"k": a, "ids": torch.tensor([1])}), 7)
    assert compare_outputs(expected, ((a, {"k": a, "ids": torch.tensor([1])}), 7)) is None
    m = compare_outputs(expected, ((a, {"k": a, "ids": torch.tensor([2])}), 7), names=["x", "y"])
    assert m is not None and m.index == 2 and m.name == "output 2" and m.dtype == "int64"
    twice = {"k": a * 2, "ids": torch.tensor([1])}
    m = compare_outputs(expected, ((a, twice), 7), names=["x", "y"])
    assert m is not None and m.index == 1 and m.name == "y" and m.shape == (2, 3)
    m = compare_outputs(expected, ((a, {"k": a, "ids": torch.tensor([1])}), 8))
    assert m is not None and "got int 8, expected int 7" in m.detail


def test_shape_dtype_and_count_mismatches() -> None:
    a = torch.ones(2, 3)
    assert "shape [3, 2] instead of [2, 3]" in compare_outputs([a], [a.t()]).detail  # type: ignore[union-attr]
    m = compare_outputs([a], [a.half()])
    assert m is not None and "dtype torch.float16 instead of torch.float32" in m.detail
    m = compare_outputs([a, a], [a])
    assert m is not None and m.index == -1 and "1 outputs instead of 2" in m.detail


# --- in-place writes and the wrapper, in one process ---


def _cache_graph() -> fx.GraphModule:
    """``cache[idx] += x`` written in place (``index_copy`` then ``copy_`` into the input)."""
    g = fx.Graph()
    cache, idx, x = g.placeholder("cache"), g.placeholder("idx"), g.placeholder("x")
    aten = torch.ops.aten
    rows = g.call_function(aten.index_select.default, (cache, 0, idx))
    new = g.call_function(
        aten.index_copy.default, (cache, 0, idx, g.call_function(aten.add.Tensor, (rows, x)))
    )
    g.call_function(aten.copy_.default, (cache, new))
    g.output((g.call_function(aten.sum.default, (new,)),))
    return fx.GraphModule(torch.nn.Module(), g)


def test_mutated_inputs_finds_writes_into_placeholders_and_their_views() -> None:
    assert mutated_inputs(_cache_graph()) == [0]
    g = fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    view = g.call_function(torch.ops.aten.slice.Tensor, (b, 0, 0, 1))
    g.call_function(torch.ops.aten.copy_.default, (view, a))
    g.output((a,))
    assert mutated_inputs(fx.GraphModule(torch.nn.Module(), g)) == [1]


def _wrap(gm: fx.GraphModule, engine: Any) -> Any:
    return with_verification(
        engine, reference_graph(gm), collectives=[], engine="test", timeout_s=5.0
    )


def test_state_written_in_place_is_written_once_and_compared() -> None:
    gm = _cache_graph()
    run = _wrap(gm, make_boxed_func(gm.forward))
    cache = torch.zeros(4, 2)
    (total,) = run([cache, torch.tensor([1, 3]), torch.ones(2, 2)])
    assert cache[[1, 3]].eq(1).all() and cache[[0, 2]].eq(0).all()  # one write, not two
    assert total.item() == 4
    run([cache, torch.tensor([1]), torch.ones(1, 2)])  # later calls: the engine alone
    assert cache[1].eq(2).all() and cache[3].eq(1).all()

    def wrong_write(args: list[Any]) -> Any:  # right output, wrong state
        out = gm.forward(*args)
        args[0][0] += 1
        return out

    with pytest.raises(VerificationError, match=r"input 0 \(placeholder 'cache', written in"):
        _wrap(gm, wrong_write)([torch.zeros(4, 2), torch.tensor([1]), torch.ones(1, 2)])


def test_a_wrong_engine_raises_and_is_never_trusted_again() -> None:
    gm = _cache_graph()
    calls = []

    def wrong(args: list[Any]) -> Any:
        calls.append(1)
        return [gm.forward(*args)[0] + 1]

    run = _wrap(gm, wrong)
    args = [torch.zeros(4, 2), torch.tensor([0]), torch.ones(1, 2)]
    with pytest.raises(VerificationError) as info:
        run(list(args))
    msg = str(info.value)
    assert "rank 0: graph #" in msg and "(engine test)" in msg
    assert "output 0 (node 'sum_default') (float32[]) differs from the eager reference" in msg
    assert "max abs error 1" in msg and "Collectives of the graph: none" in msg
    with pytest.raises(VerificationError):
        run(list(args))
    assert len(calls) == 1  # the second call did not run the engine


# --- the verdict exchange (an in-memory store) ---


def test_exchange_returns_peer_failures_and_names_a_missing_peer() -> None:
    store = _DictStore()
    store.set("torch_tensorrt_dist/verify/0-1/0/1", '{"failure": "rank 1: bad"}')
    failures = exchange_verdicts(None, [(0, 1)], timeout_s=1, store=store, rank=0)
    assert failures == [(1, "rank 1: bad")]
    assert store.data["torch_tensorrt_dist/verify/0-1/0/0"] == b'{"failure": null}'
    with pytest.raises(VerificationError, match=r"ranks \[9\] of group \[8, 9\] did not report"):
        exchange_verdicts("mine", [(8, 9)], timeout_s=1, store=_DictStore(), rank=8)


def test_settings_verify_defaults_on_for_tensorrt_only() -> None:
    assert CompileSettings(engine="tensorrt").verify_enabled
    assert not CompileSettings(engine="inductor").verify_enabled
    assert CompileSettings.from_options({"engine": "eager", "verify": True}).verify_enabled
    assert not CompileSettings(engine="tensorrt", verify=False).verify_enabled
    with pytest.raises(ConfigError, match="verify_tolerance must be in"):
        CompileSettings(verify_tolerance=2.0)


def test_the_fake_process_group_skips_verify(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from torch_tensorrt_dist.backend.fake_world import fake_world
    from torch_tensorrt_dist.models.toy import MLP
    from torch_tensorrt_dist.parallel import make_mesh
    from torch_tensorrt_dist.parallel.plans import FunctionalTPMLP

    caplog.set_level(logging.DEBUG, logger="torch_tensorrt_dist.backend.backend")
    with fake_world(0, 2):
        model = FunctionalTPMLP(MLP(16, 32), make_mesh(tp=2)["tp"])
        torch._dynamo.reset()
        compiled = torch.compile(
            model, backend="torch_tensorrt_dist", options={"engine": "eager", "verify": True}
        )
        with torch.no_grad():
            assert compiled(torch.randn(2, 16)).shape == (2, 16)
        torch._dynamo.reset()
    assert "verify skipped: the fake process group" in caplog.text


# --- 2 gloo ranks: passing engines, broken engines, an in-place cache ---


def test_gloo_verify_passes_right_engines_and_catches_wrong_collectives() -> None:
    results = run_on_ranks(_verify_fns.scenarios, 2, timeout=300)
    for rank, res in enumerate(results):
        for engine in ("eager", "inductor"):
            assert res[engine]["error"] is None, (rank, res[engine])
            first, second = res[engine]["value"]
            assert first < 1e-5 and second < 1e-5, (rank, engine)
        dropped = res["dropped"]  # the collective did nothing, on both ranks
        assert dropped["error"] == "VerificationError", (rank, dropped)
        assert f"rank {rank}: graph #" in dropped["message"]
        assert "(engine eager): output 0 (node " in dropped["message"]
        assert "all_reduce(sum) float32[2, 16] on ranks [0, 1]" in dropped["message"]
        doubled = res["doubled_on_1"]  # wrong on rank 1 only: rank 0 raises too
        assert doubled["error"] == "VerificationError", (rank, doubled)
        if rank == 0:
            assert "rank 0: graph #" in doubled["message"]
            assert "rank 1 found its result wrong: rank 1: graph #" in doubled["message"]
        else:
            assert doubled["message"].startswith("rank 1: graph #")
        mixed = res["verify_on_0_only"]  # a rank verifying issues twice the collectives
        assert mixed["error"] == "ScheduleMismatchError", (rank, mixed)
        assert "0 issues 2 collectives on this group, rank 1 1" in mixed["message"] or (
            "1 issues 1 collectives on this group, rank 0 2" in mixed["message"]
        )
        cache, total = res["cache"]["value"]
        assert cache == [[0.0] * 8, [rank + 1.0] * 8, [0.0] * 8, [rank + 1.0] * 8]
        assert total == [2.0 + 4.0] * 8  # sum over rows (2 * (rank + 1)), all-reduced


@pytest.mark.tensorrt
@pytest.mark.multigpu
def test_tensorrt_engine_passes_and_one_without_its_collective_is_caught() -> None:
    results = run_on_ranks(_verify_fns.tensorrt_scenarios, 2, backend="nccl", timeout=600)
    for rank, res in enumerate(results):
        assert res["ok"]["error"] is None and res["ok"]["value"] < 1e-2, (rank, res["ok"])
        dropped = res["dropped"]
        assert dropped["error"] == "VerificationError", (rank, dropped)
        assert f"rank {rank}: graph #" in dropped["message"]
        assert "(engine tensorrt, collective_impl=auto): output 0" in dropped["message"]
