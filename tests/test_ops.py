"""The typed collective ops: real collectives on their own group, exact fake shapes, checks."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from torch_tensorrt_dist.backend.fake_world import fake_world
from torch_tensorrt_dist.errors import UnsupportedCollectiveError
from torch_tensorrt_dist.ops import COLLECTIVE_OPS, REDUCE_OPS, normalize_reduce_op
from torch_tensorrt_dist.testing import run_on_ranks

from . import _ops_fns

ops = torch.ops.tensorrt_dist


def test_ops_are_registered_in_the_tensorrt_dist_namespace() -> None:
    assert sorted(COLLECTIVE_OPS) == [
        "all_gather",
        "all_reduce",
        "all_to_all",
        "broadcast",
        "reduce_scatter",
    ]
    for name, overload in COLLECTIVE_OPS.items():
        assert overload is getattr(ops, name).default
        assert overload._schema.name == f"tensorrt_dist::{name}"


@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        ("sum", "sum"),
        ("SUM", "sum"),
        ("ReduceOp.MAX", "max"),
        ("prod", "product"),
        ("avg", "avg"),
        ("mean", "avg"),
        ("min", "min"),
    ],
)
def test_reduce_op_names_are_normalised(given: str, canonical: str) -> None:
    assert normalize_reduce_op(given) == canonical
    assert canonical in REDUCE_OPS


def test_unknown_reduce_op_names_the_choices() -> None:
    with pytest.raises(UnsupportedCollectiveError, match="use one of sum, avg, min, max, product"):
        normalize_reduce_op("bxor")


def test_fake_kernels_validate_shapes() -> None:
    with fake_world(0, 4), FakeTensorMode() as mode:
        x = mode.from_tensor(torch.ones(6, 2))
        with pytest.raises(UnsupportedCollectiveError, match=r"dim 0 \(6\) divisible by 4"):
            ops.reduce_scatter(x, "sum", "0", [0, 1, 2, 3])
        with pytest.raises(UnsupportedCollectiveError, match="got 2 output split sizes"):
            ops.all_to_all(x, [3, 3], [], "0", [0, 1, 2, 3])
        with pytest.raises(UnsupportedCollectiveError, match="source 4 is not a rank"):
            ops.broadcast(x, 4, "0", [0, 1, 2, 3])
        assert ops.all_to_all(x, [1, 2, 3, 4], [1, 1, 2, 2], "0", [0, 1, 2, 3]).shape == (10, 2)


def test_eager_ops_on_sub_groups_of_four_gloo_ranks() -> None:
    results = run_on_ranks(_ops_fns.typed_ops_on_subgroups, 4, timeout=180)
    for rank, res in enumerate(results):
        shapes = res.pop("fake_shapes")
        assert all(shapes.values()), (rank, shapes)
        assert len(shapes) == 15
        rank_check = res.pop("rank_check")
        assert "lowered for ranks [0, 1, 2, 3]" in rank_check, rank_check
        failed = [name for name, ok in res.items() if not ok]
        assert not failed, (rank, failed)
