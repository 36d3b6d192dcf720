"""Plugin fields and native DistCollective arguments, against values read from the sources.

Expected numbers are written by hand from NVIDIA's headers, not computed by the code:
nvinfer1::DataType kFLOAT 0, kHALF 1, kINT8 2, kINT32 3, kBOOL 4, kUINT8 5, kFP8 6, kBF16 7,
kINT64 8; TensorRT-LLM AllReduceStrategyType::NCCL 0, AllReduceFusionOp::NONE 0; plugin
creators "AllReduce"/"AllGather"/"ReduceScatter", version "1", namespace "tensorrt_llm".
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torch_tensorrt_dist.conversion import (
    native_collective_spec,
    trt_data_type,
    trtllm_plugin_spec,
)
from torch_tensorrt_dist.errors import UnsupportedCollectiveError

GROUPS = [[0, 1], [2, 3], [0, 1, 2, 3], [1, 3, 5, 7], [5]]
PLUGIN_TYPE_ID = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 7}
ALL_REDUCE_EXTRA = {  # name: (numpy dtype, value)
    "strategy": (np.int8, 0),
    "config": (np.int8, 0),
    "fusion_op": (np.int8, 0),
    "counter": (np.int32, 0),
    "affine": (np.int8, 0),
    "bias": (np.int8, 0),
    "scale": (np.int8, 0),
}


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        (torch.float32, 0),
        (torch.float16, 1),
        (torch.int8, 2),
        (torch.int32, 3),
        (torch.bool, 4),
        (torch.uint8, 5),
        (torch.float8_e4m3fn, 6),
        (torch.bfloat16, 7),
        (torch.int64, 8),
        ("bf16", 7),
        ("torch.float16", 1),
    ],
)
def test_trt_data_type_matches_nvinfer_enum(dtype: object, expected: int) -> None:
    assert trt_data_type(dtype) == expected


def test_trt_data_type_rejects_float64() -> None:
    with pytest.raises(UnsupportedCollectiveError, match="no data type for float64"):
        trt_data_type(torch.float64)


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("dtype", list(PLUGIN_TYPE_ID))
@pytest.mark.parametrize(
    ("op", "name"),
    [("all_reduce", "AllReduce"), ("all_gather", "AllGather"), ("reduce_scatter", "ReduceScatter")],
)
def test_plugin_spec(op: str, name: str, dtype: torch.dtype, group: list[int]) -> None:
    reduce_op = "sum" if op != "all_gather" else None
    spec = trtllm_plugin_spec(op, dtype, group, reduce_op)
    assert (spec.name, spec.version, spec.namespace) == (name, "1", "tensorrt_llm")
    assert spec.fields["group"].dtype == np.int32
    assert spec.fields["group"].tolist() == group
    assert spec.fields["type_id"].dtype == np.int32
    assert spec.fields["type_id"].tolist() == [PLUGIN_TYPE_ID[dtype]]
    if op == "all_reduce":
        expected_keys = {"group", "type_id", "eps", *ALL_REDUCE_EXTRA}
        assert set(spec.fields) == expected_keys
        for key, (np_dtype, value) in ALL_REDUCE_EXTRA.items():
            assert spec.fields[key].dtype == np_dtype, key
            assert spec.fields[key].tolist() == [value], key
        assert spec.fields["eps"].dtype == np.float32
        assert spec.fields["eps"].shape == (1,)
    else:  # AllGather / ReduceScatter creators read group and type_id only
        assert set(spec.fields) == {"group", "type_id"}


def test_plugin_spec_subgroup_names_global_ranks() -> None:
    # TP group [2, 3] of a 4-rank job: the plugin's group is MPI world ranks, not 0..n-1
    spec = trtllm_plugin_spec("all_reduce", torch.bfloat16, [2, 3], "sum")
    assert spec.fields["group"].tolist() == [2, 3]
    assert spec.fields["type_id"].tolist() == [7]


@pytest.mark.parametrize(
    ("op", "dtype", "group", "reduce_op", "message"),
    [
        ("all_reduce", torch.float16, [0, 1], "max", "sum only"),
        ("all_reduce", torch.float16, [0, 1], "avg", "sum only"),
        ("reduce_scatter", torch.float32, [0, 1], "product", "sum only"),
        ("all_reduce", torch.int32, [0, 1], "sum", "not int32"),
        ("all_gather", torch.float64, [0, 1], None, "not float64"),
        ("all_gather", torch.float16, [3, 2], None, "not ascending"),
        ("all_to_all", torch.float16, [0, 1], None, "no all_to_all plugin"),
        ("broadcast", torch.float16, [0, 1], None, "no broadcast plugin"),
        ("all_gather", torch.float16, [0, 0], None, "repeat a rank"),
    ],
)
def test_plugin_spec_refuses_what_plugins_cannot_do(
    op: str, dtype: torch.dtype, group: list[int], reduce_op: str | None, message: str
) -> None:
    with pytest.raises(UnsupportedCollectiveError, match=message):
        trtllm_plugin_spec(op, dtype, group, reduce_op)


NATIVE_ROWS = [
    ("all_reduce", "ALL_REDUCE"),
    ("all_gather", "ALL_GATHER"),
    ("reduce_scatter", "REDUCE_SCATTER"),
    ("all_to_all", "ALL_TO_ALL"),
    ("broadcast", "BROADCAST"),
]
REDUCE_NAMES = {"sum": "SUM", "product": "PROD", "max": "MAX", "min": "MIN", "avg": "AVG"}


@pytest.mark.parametrize("group", [[0, 1], [2, 3], [0, 1, 2, 3], [1, 3, 5, 7]])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("op", "operation"), NATIVE_ROWS)
def test_native_spec(op: str, operation: str, dtype: torch.dtype, group: list[int]) -> None:
    reduces = op in ("all_reduce", "reduce_scatter")
    root = 1 if op == "broadcast" else None
    spec = native_collective_spec(op, dtype, group, "sum" if reduces else None, root)
    assert spec.collective_operation == operation
    assert spec.reduce_operation == ("SUM" if reduces else "NONE")
    assert spec.root == (1 if op == "broadcast" else -1)
    # the engine binds the group's own communicator: groups are ranks within it
    assert spec.groups.dtype == np.int64
    assert spec.groups.tolist() == list(range(len(group)))
    assert spec.num_ranks == len(group)


@pytest.mark.parametrize("reduce_op", list(REDUCE_NAMES))
@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter"])
def test_native_spec_reduce_operations(op: str, reduce_op: str) -> None:
    spec = native_collective_spec(op, torch.float32, [0, 1], reduce_op)
    assert spec.reduce_operation == REDUCE_NAMES[reduce_op]


def test_native_spec_int32_and_reduce_op_aliases() -> None:
    spec = native_collective_spec("all_reduce", torch.int32, [0, 1], "max")
    assert spec.reduce_operation == "MAX"
    spec = native_collective_spec("all_reduce", "float16", [0, 1], "PROD")
    assert spec.reduce_operation == "PROD"


def test_native_spec_broadcast_root_within_communicator() -> None:
    # broadcast from group rank 1 of [4, 6]; a communicator of exactly those ranks
    spec = native_collective_spec("broadcast", torch.float16, [4, 6], root=1, comm_ranks=[4, 6])
    assert spec.root == 1
    assert spec.groups.tolist() == [0, 1]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            dict(
                op="all_reduce",
                dtype=torch.float16,
                group_ranks=[2, 3],
                reduce_op="sum",
                comm_ranks=[0, 1, 2, 3],
            ),
            "not\\s+verified",
        ),
        (dict(op="all_reduce", dtype=torch.int32, group_ranks=[0, 1], reduce_op="avg"), "round"),
        (dict(op="all_gather", dtype=torch.float64, group_ranks=[0, 1]), "not float64"),
        (dict(op="broadcast", dtype=torch.float16, group_ranks=[0, 1], root=2), "source 2"),
        (dict(op="broadcast", dtype=torch.float16, group_ranks=[0, 1]), "needs its root"),
    ],
)
def test_native_spec_refusals(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(UnsupportedCollectiveError, match=message):
        native_collective_spec(**kwargs)  # type: ignore[arg-type]
