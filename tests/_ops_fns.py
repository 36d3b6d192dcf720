"""Rank functions for the typed-op tests (run in spawned gloo ranks)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_tensorrt_dist  # noqa: F401
from torch_tensorrt_dist.errors import GroupResolutionError

ops = torch.ops.tensorrt_dist


def typed_ops_on_subgroups(rank: int, world: int) -> dict[str, Any]:
    """4 ranks, TP groups {0,1} and {2,3}: every op on this rank's pair only."""
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    group = pairs[rank // 2]
    gn, ranks = group.group_name, dist.get_process_group_ranks(group)
    x = torch.arange(4, dtype=torch.float32) + 10 * rank  # rank r holds [10r, 10r+1, ...]
    peer = rank ^ 1
    px = torch.arange(4, dtype=torch.float32) + 10 * peer
    lo, hi = (x, px) if rank % 2 == 0 else (px, x)  # group-rank 0's and 1's tensors
    results: dict[str, Any] = {}
    expected = {
        "sum": x + px,
        "avg": (x + px) / 2,
        "min": torch.minimum(x, px),
        "max": torch.maximum(x, px),
        "product": x * px,
    }
    for op, want in expected.items():
        results[f"all_reduce_{op}"] = torch.equal(ops.all_reduce(x, op, gn, ranks), want)
    results["all_gather"] = torch.equal(ops.all_gather(x, gn, ranks), torch.cat([lo, hi]))
    me = rank % 2
    rs = ops.reduce_scatter(x, "sum", gn, ranks)
    results["reduce_scatter"] = torch.equal(rs, (x + px)[2 * me : 2 * me + 2])
    a2a = ops.all_to_all(x, [], [], gn, ranks)
    results["all_to_all"] = torch.equal(
        a2a, torch.cat([lo[2 * me : 2 * me + 2], hi[2 * me : 2 * me + 2]])
    )
    # non-uniform: group-rank 0 sends 1 row to 0 and 3 rows to 1; group-rank 1 sends 3 and 1
    ins = [1, 3] if me == 0 else [3, 1]
    outs = [1, 3] if me == 0 else [3, 1]
    a2a_u = ops.all_to_all(x, outs, ins, gn, ranks)
    want_u = torch.cat([lo[:1], hi[:3]]) if me == 0 else torch.cat([lo[1:], hi[3:]])
    results["all_to_all_uneven"] = torch.equal(a2a_u, want_u)
    results["broadcast"] = torch.equal(ops.broadcast(x, 1, gn, ranks), hi)
    # fake kernels: same shape and dtype as the eager results
    shapes = {}
    calls = {
        "all_reduce": lambda t: ops.all_reduce(t, "sum", gn, ranks),
        "all_gather": lambda t: ops.all_gather(t, gn, ranks),
        "reduce_scatter": lambda t: ops.reduce_scatter(t, "max", gn, ranks),
        "all_to_all": lambda t: ops.all_to_all(t, outs, ins, gn, ranks),
        "broadcast": lambda t: ops.broadcast(t, 0, gn, ranks),
    }
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        t = torch.ones(4, 3, dtype=dtype)
        for name, call in calls.items():
            real = call(t)
            with FakeTensorMode() as mode:
                fake = call(mode.from_tensor(t))
            shapes[f"{name}_{dtype}"] = (tuple(real.shape), real.dtype) == (
                tuple(fake.shape),
                fake.dtype,
            )
    results["fake_shapes"] = shapes
    # the recorded ranks are checked against the group at run time
    try:
        ops.all_reduce(x, "sum", gn, [0, 1, 2, 3])
        results["rank_check"] = "no error"
    except GroupResolutionError as exc:
        results["rank_check"] = str(exc)
    return results
