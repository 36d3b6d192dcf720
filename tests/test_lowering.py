"""The lowering pass on hand-built graphs: structure (fake process group) and semantics (gloo)."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from torch_tensorrt_dist import UnsupportedCollectiveError, fuse_collectives
from torch_tensorrt_dist.backend.fake_world import fake_world
from torch_tensorrt_dist.errors import GroupResolutionError
from torch_tensorrt_dist.lowering import fusion_report
from torch_tensorrt_dist.lowering.fuse_collectives import SOURCE_COLLECTIVES
from torch_tensorrt_dist.ops import COLLECTIVE_OPS
from torch_tensorrt_dist.testing import run_on_ranks

from . import _graphs

WAIT = torch.ops._c10d_functional.wait_tensor.default
TYPED = set(COLLECTIVE_OPS.values())


@pytest.fixture
def tp_group() -> Iterator[tuple[str, list[int]]]:
    """Rank 5 of 8 on a (dp=2, tp=4) mesh: its TP group is ranks [4, 5, 6, 7]."""
    with fake_world(5, 8):
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
        group = mesh.get_group("tp")
        yield group.group_name, dist.get_process_group_ranks(group)


def _targets(gm: torch.fx.GraphModule) -> list[object]:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


EXPECTED_FUSED = {
    "late_wait": ["all_reduce"],
    "many_users": ["all_reduce"],
    "no_wait": ["all_gather"],
    "inplace": ["all_reduce"],
    "coalesced": ["all_reduce", "all_reduce"],
    "coalesced_inplace": ["all_reduce", "all_reduce"],
    "out_variant": ["all_gather"],
    "autograd_variants": ["all_gather", "reduce_scatter", "all_to_all"],
    "every_collective": ["reduce_scatter", "all_to_all", "broadcast", "broadcast", "all_reduce"],
    "uneven_all_to_all": ["all_to_all"],
}


@pytest.mark.parametrize("name", sorted(_graphs.BUILDERS))
def test_every_collective_and_wait_is_replaced(name: str, tp_group) -> None:
    group_name, ranks = tp_group
    gm, _ = _graphs.BUILDERS[name](group_name, len(ranks))
    fuse_collectives(gm)
    targets = _targets(gm)
    assert not [t for t in targets if t in SOURCE_COLLECTIVES or t is WAIT], gm.code
    assert fusion_report(gm).fused == EXPECTED_FUSED[name]
    assert fusion_report(gm).unfused == []
    typed = [n for n in gm.graph.nodes if n.target in TYPED]
    assert len(typed) == len(EXPECTED_FUSED[name])
    for node in typed:
        assert node.args[-1] == [4, 5, 6, 7]  # the TP sub-group, not the world
        assert node.args[-2] == group_name


def test_pass_is_idempotent(tp_group) -> None:
    group_name, ranks = tp_group
    gm, _ = _graphs.every_collective(group_name, len(ranks))
    code = fuse_collectives(gm).code
    again = fuse_collectives(copy.deepcopy(gm))
    assert again.code == code
    assert fusion_report(again).fused == EXPECTED_FUSED["every_collective"]  # not doubled


def test_torch_tensorrt_pass_keeps_what_it_leaves_unfused_out_of_upstream_converters(
    tp_group,
) -> None:
    from types import SimpleNamespace

    from torch_tensorrt_dist.conversion.registration import (
        UPSTREAM_FUSED_OPS,
        fuse_collectives_pass,
    )

    group_name, ranks = tp_group
    fused_only = SimpleNamespace(torch_executed_ops={"torch.ops.aten.mul.Tensor"})
    fuse_collectives_pass(_graphs.late_wait(group_name, len(ranks))[0], fused_only)
    assert fused_only.torch_executed_ops == {"torch.ops.aten.mul.Tensor"}  # nothing left over

    leftover = SimpleNamespace(torch_executed_ops={"torch.ops.aten.mul.Tensor"})
    fuse_collectives_pass(_graphs.late_wait("no-such-group", 4)[0], leftover)
    assert leftover.torch_executed_ops == {"torch.ops.aten.mul.Tensor", *UPSTREAM_FUSED_OPS}
    assert "torch.ops.tensorrt.fused_nccl_all_reduce.default" in UPSTREAM_FUSED_OPS


def test_inplace_variant_copies_the_result_back(tp_group) -> None:
    group_name, ranks = tp_group
    gm, _ = _graphs.inplace(group_name, len(ranks))
    fuse_collectives(gm)
    copies = [n for n in gm.graph.nodes if n.target is torch.ops.aten.copy_.default]
    assert len(copies) == 1
    clone = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.clone.default)
    assert copies[0].args[0] is clone  # the mutation of the input is preserved


def test_unresolvable_group_is_left_and_reported(tp_group) -> None:
    gm, _ = _graphs.late_wait("no-such-group", 4)
    fuse_collectives(gm)
    report = fusion_report(gm)
    assert report.fused == []
    assert len(report.unfused) == 1 and "no-such-group" in report.unfused[0][1]
    assert torch.ops._c10d_functional.all_reduce.default in _targets(gm)  # left intact
    with pytest.raises(GroupResolutionError, match="no process group named 'no-such-group'"):
        fuse_collectives(_graphs.late_wait("no-such-group", 4)[0], strict=True)


def test_group_size_mismatch_is_not_fused(tp_group) -> None:
    group_name, _ = tp_group
    gm, _ = _graphs.no_wait(group_name, 3)  # claims 3 ranks; the group has 4
    with pytest.raises(UnsupportedCollectiveError.__mro__[1], match="group_size 3"):
        fuse_collectives(gm, strict=True)


def test_unsupported_reduce_op_is_reported(tp_group) -> None:
    group_name, _ = tp_group
    g = torch.fx.Graph()
    x = g.placeholder("x")
    ar = g.call_function(torch.ops._c10d_functional.all_reduce.default, (x, "bxor", group_name))
    g.output(g.call_function(WAIT, (ar,)))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    fuse_collectives(gm)
    assert "reduce op 'bxor' is not supported" in fusion_report(gm).unfused[0][1]


def test_without_distributed_the_error_says_what_to_do() -> None:
    assert not dist.is_initialized()
    gm, _ = _graphs.late_wait("0", 2)
    with pytest.raises(GroupResolutionError, match="not initialised"):
        fuse_collectives(gm, strict=True)


def test_fused_graphs_compute_the_same_values_on_two_gloo_ranks() -> None:
    names = sorted(_graphs.BUILDERS)
    results = run_on_ranks(_graphs.run_before_after, 2, names, timeout=180)
    for rank, diffs in enumerate(results):
        assert set(diffs) == set(names)
        for name, diff in diffs.items():
            assert diff == 0.0, (rank, name, diff)
