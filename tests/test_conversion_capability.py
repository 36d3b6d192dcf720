"""Capability decisions: what converts, with which implementation, and why a collective stays
in PyTorch. Also the validators the converters register, on real FX graphs of typed ops."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from torch import fx

import torch_tensorrt_dist  # noqa: F401  (registers torch.ops.tensorrt_dist)
from torch_tensorrt_dist.conversion import (
    ENV_COLLECTIVE_IMPL,
    conversion_decision,
    requested_impl,
    select_impl,
)
from torch_tensorrt_dist.conversion.capability import node_decision
from torch_tensorrt_dist.conversion.choice import current_impl
from torch_tensorrt_dist.conversion.converters import make_validator
from torch_tensorrt_dist.conversion.engine import compile_tensorrt, engine_group
from torch_tensorrt_dist.conversion.node_args import collective_calls
from torch_tensorrt_dist.conversion.registration import (
    PASS_NAME,
    fuse_collectives_pass,
    pass_index,
    pool_pass_index,
    register_with_torch_tensorrt,
)
from torch_tensorrt_dist.conversion.settings import collective_settings
from torch_tensorrt_dist.errors import ConfigError, EngineUnavailableError

OPS = torch.ops.tensorrt_dist


@pytest.mark.parametrize("impl", ["native", "plugin"])
@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"])
def test_group_of_one_is_identity(op: str, impl: str) -> None:
    ok, reason = conversion_decision(op, torch.float64, [3], impl=impl, reduce_op="max")
    assert ok and "identity" in reason


def test_broadcast_group_of_one_needs_source_zero() -> None:
    assert conversion_decision("broadcast", torch.float16, [3], impl="plugin", src=0).convertible
    assert not conversion_decision("broadcast", torch.float16, [3], impl="plugin", src=1)[0]


def test_unknown_source_and_splits_are_not_checked() -> None:
    # an explain report may not know a broadcast's source or an all_to_all's splits
    assert conversion_decision("broadcast", torch.float16, [0, 1], impl="native").convertible
    assert conversion_decision("all_to_all", torch.float16, [0, 1], impl="native").convertible


@pytest.mark.parametrize(
    ("kwargs", "convertible", "fragment"),
    [
        (dict(op="all_reduce", reduce_op="sum"), True, "AllReduce plugin over MPI ranks [2, 3]"),
        (dict(op="all_reduce", reduce_op=None), True, "AllReduce"),  # c10d default: sum
        (dict(op="all_reduce", reduce_op="min"), False, "sum only"),
        (dict(op="reduce_scatter", reduce_op="sum", dim0=6), True, "ReduceScatter"),
        (dict(op="reduce_scatter", reduce_op="sum", dim0=5), False, "divisible"),
        (dict(op="all_gather"), True, "AllGather"),
        (dict(op="all_to_all"), False, "no all_to_all plugin"),
        (dict(op="broadcast", src=0), False, "no broadcast plugin"),
        (dict(op="all_reduce", reduce_op="bogus"), False, "not supported"),
        (dict(op="gather"), False, "unknown collective"),
    ],
)
def test_plugin_decisions(kwargs: dict[str, object], convertible: bool, fragment: str) -> None:
    op = str(kwargs.pop("op"))
    ok, reason = conversion_decision(op, torch.float16, [2, 3], impl="plugin", **kwargs)  # type: ignore[arg-type]
    assert ok is convertible
    assert fragment in reason


@pytest.mark.parametrize(
    ("kwargs", "convertible", "fragment"),
    [
        (dict(op="all_reduce", reduce_op="max"), True, "ALL_REDUCE/MAX"),
        (dict(op="all_reduce", reduce_op="avg"), True, "ALL_REDUCE/AVG"),
        (dict(op="all_to_all", dim0=8), True, "ALL_TO_ALL"),
        (
            dict(op="all_to_all", input_split_sizes=[4, 4], output_split_sizes=[4, 4]),
            True,
            "ALL_TO_ALL",
        ),
        (
            dict(op="all_to_all", input_split_sizes=[3, 5], output_split_sizes=[4, 4]),
            False,
            "uneven input split sizes [3, 5]",
        ),
        (
            dict(op="all_to_all", input_split_sizes=[4, 4], output_split_sizes=[2, 6]),
            False,
            "uneven output",
        ),
        (dict(op="all_to_all", dim0=7), False, "divisible"),
        (dict(op="all_to_all", input_split_sizes=[2, 2, 2]), False, "got 3 input split sizes"),
        (dict(op="reduce_scatter", reduce_op="max", dim0=3), False, "divisible"),
        (dict(op="broadcast", src=1), True, "BROADCAST"),
        (dict(op="broadcast", src=2), False, "source 2"),
        (dict(op="all_gather", comm_ranks=[2, 3]), True, "ALL_GATHER"),
        (dict(op="all_gather", comm_ranks=[0, 1, 2, 3]), False, "distributed_context"),
    ],
)
def test_native_decisions(kwargs: dict[str, object], convertible: bool, fragment: str) -> None:
    op = str(kwargs.pop("op"))
    ok, reason = conversion_decision(op, torch.bfloat16, [2, 3], impl="native", **kwargs)  # type: ignore[arg-type]
    assert ok is convertible, reason
    assert fragment in reason


def test_dtype_rules_differ_by_impl() -> None:
    assert conversion_decision("all_gather", torch.int32, [0, 1], impl="native").convertible
    ok, reason = conversion_decision("all_gather", torch.int32, [0, 1], impl="plugin")
    assert not ok and "bfloat16, float16, float32 only" in reason
    ok, reason = conversion_decision(
        "all_reduce", torch.int32, [0, 1], impl="native", reduce_op="avg"
    )
    assert not ok and "would round" in reason


def test_unknown_impl_and_bad_groups() -> None:
    assert (
        "unknown collective implementation"
        in conversion_decision("all_gather", torch.float16, [0, 1], impl="nccl").reason
    )
    assert not conversion_decision("all_gather", torch.float16, [], impl="native").convertible
    assert (
        "non-negative"
        in conversion_decision("all_gather", torch.float16, [-1, 0], impl="native").reason
    )
    assert (
        "not a torch dtype"
        in conversion_decision("all_gather", "floaty", [0, 1], impl="native").reason
    )


def test_auto_here_reports_that_nothing_is_installed() -> None:
    ok, reason = conversion_decision("all_gather", torch.float16, [0, 1], impl="auto")
    assert not ok
    assert "native DistCollective: TensorRT is not installed" in reason
    assert "TensorRT-LLM plugins: TensorRT is not installed" in reason
    assert "torch_nccl: TensorRT is not installed" in reason


def test_requested_impl_reads_env_and_settings() -> None:
    assert requested_impl(None, env={}) == "auto"
    assert requested_impl("auto", env={ENV_COLLECTIVE_IMPL: "Plugin"}) == "plugin"
    assert requested_impl("native", env={ENV_COLLECTIVE_IMPL: "plugin"}) == "native"
    with pytest.raises(ConfigError, match=ENV_COLLECTIVE_IMPL):
        requested_impl("auto", env={ENV_COLLECTIVE_IMPL: "mpi"})
    with pytest.raises(ConfigError, match="collective_impl='nccl'"):
        requested_impl("nccl", env={})


def test_env_var_is_really_read_by_current_impl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_COLLECTIVE_IMPL, "plugin")
    choice = current_impl()
    assert choice.impl is None
    assert choice.reason.startswith("collective_impl='plugin' was requested")
    with collective_settings("native"):  # an explicit setting wins over the variable
        assert current_impl().reason.startswith("collective_impl='native' was requested")


def test_select_impl() -> None:
    assert select_impl("native", native_missing=None, plugin_missing="x").impl == "native"
    assert select_impl("plugin", native_missing="x", plugin_missing=None).impl == "plugin"
    with pytest.raises(ConfigError, match="not one of"):
        select_impl("mpi", native_missing=None, plugin_missing=None)
    assert select_impl("auto", native_missing=None, plugin_missing=None).impl == "native"
    assert select_impl("auto", native_missing="old TRT", plugin_missing=None).impl == "plugin"
    none = select_impl("auto", native_missing="old TRT", plugin_missing="no lib")
    assert none.impl is None and "old TRT" in none.reason and "no lib" in none.reason
    # an explicit request is never swapped for the other implementation
    assert select_impl("plugin", native_missing=None, plugin_missing="no lib").impl is None
    assert select_impl("native", native_missing="old TRT", plugin_missing=None).impl is None


def _graph(
    op: str, *args: Any, dtype: torch.dtype = torch.float16
) -> tuple[fx.GraphModule, fx.Node]:
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(8, 4, dtype=dtype)
    node = graph.call_function(getattr(OPS, op).default, (x, *args))
    graph.output(node)
    return fx.GraphModule(torch.nn.Module(), graph), node


def test_node_decision_binds_args_by_name() -> None:
    _, node = _graph("reduce_scatter", "sum", "tp", [2, 3])
    assert node_decision(node, "plugin").convertible
    _, node = _graph("reduce_scatter", "max", "tp", [2, 3])
    assert "sum only" in node_decision(node, "plugin").reason
    _, node = _graph("all_to_all", [2, 6], [4, 4], "tp", [2, 3])
    assert "uneven output" in node_decision(node, "native").reason
    _, node = _graph("all_gather", "tp", [0, 1], dtype=torch.int32)
    assert "not int32" in node_decision(node, "plugin").reason


def test_node_decision_needs_a_dtype() -> None:
    _gm, node = _graph("all_gather", "tp", [0, 1])
    del node.args[0].meta["val"]  # type: ignore[union-attr]
    assert "no recorded dtype" in node_decision(node, "native").reason


def test_collective_calls_and_engine_group() -> None:
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(8, 4)
    a = graph.call_function(OPS.all_reduce.default, (x, "sum", "dp", [0, 2]))
    b = graph.call_function(OPS.all_gather.default, (a, "tp", [0, 1]))
    c = graph.call_function(OPS.broadcast.default, (b, 1, "tp", [0, 1]))
    graph.output(c)
    calls = collective_calls(fx.GraphModule(torch.nn.Module(), graph))
    assert [(c.op, c.group_ranks) for c in calls] == [
        ("all_reduce", (0, 2)),
        ("all_gather", (0, 1)),
        ("broadcast", (0, 1)),
    ]
    assert calls[0].reduce_op == "sum" and calls[2].src == 1 and calls[0].dim0 == 8
    chosen = engine_group(calls)
    assert chosen is not None and chosen.group_name == "tp"  # two of three use tp


def test_validators_keep_collectives_in_pytorch_here(caplog: pytest.LogCaptureFixture) -> None:
    from torch_tensorrt_dist.conversion import converters

    converters._warned.clear()  # the reason is logged once per process
    _, node = _graph("all_reduce", "sum", "tp", [0, 1])
    with caplog.at_level(logging.WARNING):
        assert make_validator("native")(node, None) is False
        assert make_validator("plugin")(node, None) is False
    assert "TensorRT is not installed" in caplog.text


def test_group_of_one_is_taken_by_the_plugin_row_only() -> None:
    # the plugin row does not mark the engine multi-device; identity needs no library
    _, node = _graph("all_reduce", "sum", "solo", [0])
    assert make_validator("plugin")(node, None) is True
    assert make_validator("native")(node, None) is False


def test_pass_goes_before_torch_tensorrt_collective_pass() -> None:
    assert pass_index(["remove_detach", "constant_fold", "fuse_distributed_ops", "x"]) == 2
    assert pass_index(["remove_detach"]) is None
    assert fuse_collectives_pass.__name__ == PASS_NAME


def test_block_write_pass_goes_right_after_torch_tensorrt_removes_the_input_clones() -> None:
    """Torch-TensorRT 2.14's post-lowering list starts so; before the clone removal a pool
    write reads a clone of its input (``repair_input_aliasing``), not the input."""
    upstream = ["replace_fused_rms_norm", "remove_input_alias_fixing_clones", "constant_fold"]
    assert pool_pass_index(upstream) == 2
    assert pool_pass_index(["constant_fold"]) is None  # at the end


def test_registration_is_a_cheap_no_op_without_torch_tensorrt() -> None:
    import sys

    assert register_with_torch_tensorrt() is False
    assert "torch_tensorrt" not in sys.modules and "tensorrt" not in sys.modules


def test_tensorrt_engine_says_what_to_install() -> None:
    gm, _ = _graph("all_gather", "tp", [0, 1])
    with pytest.raises(EngineUnavailableError, match="pip install"):
        compile_tensorrt(gm, [torch.ones(8, 4)], None)


def test_registered_pass_lowers_c10d_collectives_for_the_converters() -> None:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=2, world_size=4)
    try:
        tp = dist.new_group([2, 3])
        assert isinstance(tp, dist.ProcessGroup) and dist.group.WORLD is not None
        graph = fx.Graph()
        x = graph.placeholder("x")
        x.meta["val"] = torch.empty(8, 4, dtype=torch.bfloat16)
        c10d = torch.ops._c10d_functional
        world = graph.call_function(
            c10d.all_reduce.default, (x, "sum", dist.group.WORLD.group_name)
        )
        waited = graph.call_function(c10d.wait_tensor.default, (world,))
        gathered = graph.call_function(
            c10d.all_gather_into_tensor.default, (waited, 2, tp.group_name)
        )
        graph.output(graph.call_function(c10d.wait_tensor.default, (gathered,)))
        gm = fuse_collectives_pass(fx.GraphModule(torch.nn.Module(), graph), None)
        nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
        assert [n.target for n in nodes] == [OPS.all_reduce.default, OPS.all_gather.default]
        assert [c.group_ranks for c in collective_calls(gm)] == [(0, 1, 2, 3), (2, 3)]
        assert node_decision(nodes[0], "plugin").reason == (
            "TensorRT-LLM AllReduce plugin over MPI ranks [0, 1, 2, 3]"
        )
        assert node_decision(nodes[0], "native").reason == (
            "native DistCollective ALL_REDUCE/SUM over ranks [0, 1, 2, 3]"
        )
    finally:
        dist.destroy_process_group()


def test_strict_registration_says_what_to_install() -> None:
    with pytest.raises(EngineUnavailableError) as info:
        register_with_torch_tensorrt(strict=True)
    assert "pip install 'torch_tensorrt_dist[tensorrt]'" in str(info.value)


def test_binding_by_name_and_its_errors() -> None:
    from torch_tensorrt_dist.conversion.node_args import bind_collective, row_of
    from torch_tensorrt_dist.conversion.table import COLLECTIVES
    from torch_tensorrt_dist.errors import UnsupportedCollectiveError

    assert row_of(OPS.broadcast) is COLLECTIVES["broadcast"]  # the packet works too
    assert row_of(torch.ops.aten.add.Tensor) is None
    row = COLLECTIVES["all_to_all"]
    call = bind_collective(
        row,
        [torch.ones(4)],
        dict(
            output_split_sizes=[2, 2], input_split_sizes=[2, 2], group_name="g", group_ranks=[0, 1]
        ),
    )
    assert call.output_split_sizes == (2, 2) and call.dim0 == 4 and call.dtype == torch.float32
    with pytest.raises(UnsupportedCollectiveError, match="missing"):
        bind_collective(row, [torch.ones(4), [2, 2]])
    with pytest.raises(UnsupportedCollectiveError, match="unexpected argument 'group'"):
        bind_collective(COLLECTIVES["all_gather"], [torch.ones(4), "g", [0, 1]], {"group": 1})
    with pytest.raises(UnsupportedCollectiveError, match="got 5 arguments"):
        bind_collective(COLLECTIVES["all_gather"], [torch.ones(4), "g", [0, 1], 1, 2])


def test_node_decision_on_other_nodes() -> None:
    gm, node = _graph("all_gather", "tp", [0, 1])
    placeholder = next(iter(gm.graph.nodes))
    assert "is not a torch.ops.tensorrt_dist collective" in node_decision(placeholder, "native")[1]
    node.args = (*node.args, "extra")
    assert "got 4 arguments" in node_decision(node, "native").reason


def test_native_spec_needs_the_rank_in_the_communicator() -> None:
    from torch_tensorrt_dist.conversion import native_collective_spec
    from torch_tensorrt_dist.errors import UnsupportedCollectiveError

    with pytest.raises(UnsupportedCollectiveError, match="communicator of ranks"):
        native_collective_spec("all_gather", torch.float16, [5], comm_ranks=[0, 1])


def test_native_members_a_tensorrt_lacks_are_refused_by_name() -> None:
    from torch_tensorrt_dist.conversion.impl.native.spec import native_collective_spec
    from torch_tensorrt_dist.errors import UnsupportedCollectiveError

    trt_10_16 = frozenset(  # DistCollective before ALL_TO_ALL (TensorRT 11.0)
        {
            f"CollectiveOperation.{m}"
            for m in ("ALL_REDUCE", "ALL_GATHER", "REDUCE_SCATTER", "BROADCAST")
        }
        | {f"ReduceOperation.{m}" for m in ("SUM", "PROD", "MAX", "MIN", "AVG")}
    )
    ok = conversion_decision("all_gather", "bf16", [0, 1], impl="native", native_members=trt_10_16)
    assert ok.convertible
    a2a = conversion_decision("all_to_all", "bf16", [0, 1], impl="native", native_members=trt_10_16)
    assert a2a == (
        False,
        "the installed TensorRT has no CollectiveOperation.ALL_TO_ALL "
        "(ALL_TO_ALL arrives in TensorRT 11.0)",
    )
    no_avg = trt_10_16 - {"ReduceOperation.AVG"}
    avg = conversion_decision(
        "all_reduce", "fp32", [0, 1], impl="native", reduce_op="avg", native_members=no_avg
    )
    assert avg == (False, "the installed TensorRT has no ReduceOperation.AVG")
    with pytest.raises(UnsupportedCollectiveError, match=r"no CollectiveOperation\.ALL_TO_ALL"):
        native_collective_spec("all_to_all", "fp16", [0, 1], native_members=trt_10_16)
    # not checked where the members are unknown (no TensorRT to ask)
    assert conversion_decision("all_to_all", "bf16", [0, 1], impl="native").convertible


def test_unknown_torch_tensorrt_options_are_refused_with_the_valid_keys() -> None:
    from torch_tensorrt_dist.backend.settings import check_known_options
    from torch_tensorrt_dist.errors import ConfigError

    known = {"use_fp32_acc", "workspace_size", "min_block_size"}
    check_known_options({"use_fp32_acc": True}, known, "torch_tensorrt_options key")
    with pytest.raises(ConfigError) as info:
        check_known_options({"enabled_precisions": {1}}, known, "torch_tensorrt_options key")
    assert "unknown torch_tensorrt_options key 'enabled_precisions'" in str(info.value)
    assert "(known: min_block_size, use_fp32_acc, workspace_size)" in str(info.value)
    with pytest.raises(ConfigError, match="did you mean 'use_fp32_acc'"):
        check_known_options({"use_fp32acc": True}, known, "torch_tensorrt_options key")


def test_select_impl_auto_order_with_torch_nccl() -> None:
    both = {"native_missing": None, "plugin_missing": None, "torch_nccl_missing": None}
    assert select_impl("auto", **both).impl == "native"  # one group: native takes it all
    split = select_impl("auto", **both, native_takes_all=False)
    assert split.impl == "torch_nccl"
    assert "more than one group" in split.reason
    no_native = select_impl(
        "auto", native_missing="TRT 10.14", plugin_missing=None, torch_nccl_missing=None
    )
    assert no_native.impl == "torch_nccl" and "TRT 10.14" in no_native.reason
    only_plugin = select_impl(
        "auto", native_missing="TRT 10.14", plugin_missing=None, torch_nccl_missing="not built"
    )
    assert only_plugin.impl == "plugin"
    asked = select_impl("torch_nccl", native_missing=None, plugin_missing=None)
    assert asked.impl is None  # never swapped for another implementation
    assert asked.reason == "collective_impl='torch_nccl' was requested but not checked"
    assert select_impl("torch_nccl", **both).impl == "torch_nccl"
    assert requested_impl("auto", env={ENV_COLLECTIVE_IMPL: "torch_nccl"}) == "torch_nccl"


@pytest.mark.parametrize(
    ("op", "dtype", "kwargs", "ok", "text"),
    [
        ("all_reduce", torch.int64, {"reduce_op": "max"}, True, "all_reduce/max"),
        ("all_reduce", torch.int32, {"reduce_op": "avg"}, False, "would round"),
        ("all_reduce", torch.bool, {}, False, "not bool"),
        ("all_gather", torch.float8_e4m3fn, {}, True, "all_gather"),
        ("reduce_scatter", torch.bfloat16, {"reduce_op": "product", "dim0": 6}, False, "dim 0 (6)"),
        ("all_to_all", torch.int8, {"dim0": 8}, True, "all_to_all"),
        ("all_to_all", torch.int8, {"output_split_sizes": [1, 3, 2, 2]}, False, "uneven output"),
        ("broadcast", torch.int8, {"src": 3}, True, "broadcast"),
        ("broadcast", torch.int8, {"src": 4}, False, "not a rank of a group of 4"),
        ("broadcast", torch.uint8, {"src": 0}, False, "not uint8"),
    ],
)
def test_torch_nccl_decision(
    op: str, dtype: torch.dtype, kwargs: dict, ok: bool, text: str
) -> None:
    decision = conversion_decision(op, dtype, [7, 1, 5, 3], impl="torch_nccl", **kwargs)
    assert decision.convertible is ok
    assert text in decision.reason
