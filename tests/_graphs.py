"""Hand-built aten graphs with ``_c10d_functional`` collectives, in the shapes real graphs take.

Each builder takes a group name and its size and returns ``(GraphModule, example inputs)``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch
from torch import fx

F = torch.ops._c10d_functional
FA = torch.ops._c10d_functional_autograd
aten = torch.ops.aten

Builder = Callable[[str, int], tuple[fx.GraphModule, list[torch.Tensor]]]


def _gm(graph: fx.Graph) -> fx.GraphModule:
    graph.lint()
    return fx.GraphModule(torch.nn.Module(), graph)


def _x(n: int, rows: int = 4) -> list[torch.Tensor]:
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else 0
    return [torch.arange(rows * n * 3, dtype=torch.float32).view(rows * n, 3) + 100 * rank]


def late_wait(gn: str, n: int):
    g = fx.Graph()
    x = g.placeholder("x")
    ar = g.call_function(F.all_reduce.default, (x, "sum", gn))
    y = g.call_function(aten.mul.Tensor, (x, 2.0))  # work between collective and wait
    w = g.call_function(F.wait_tensor.default, (ar,))
    g.output(g.call_function(aten.add.Tensor, (w, y)))
    return _gm(g), _x(n)


def many_users(gn: str, n: int):
    g = fx.Graph()
    x = g.placeholder("x")
    ar = g.call_function(F.all_reduce.default, (x, "max", gn))
    w1 = g.call_function(F.wait_tensor.default, (ar,))
    w2 = g.call_function(F.wait_tensor.default, (ar,))  # a second wait on the same work
    a = g.call_function(aten.sin.default, (w1,))
    b = g.call_function(aten.cos.default, (w1,))
    g.output((a, b, w2))
    return _gm(g), _x(n)


def no_wait(gn: str, n: int, wait: bool = False):
    g = fx.Graph()
    x = g.placeholder("x")
    ag = g.call_function(F.all_gather_into_tensor.default, (x, n, gn))
    if wait:  # the reference: reading a collective's result unwaited is a race in eager
        ag = g.call_function(F.wait_tensor.default, (ag,))
    g.output(g.call_function(aten.neg.default, (ag,)))
    return _gm(g), _x(n)


def inplace(gn: str, n: int):
    g = fx.Graph()
    x = g.placeholder("x")
    c = g.call_function(aten.clone.default, (x,))
    g.call_function(F.all_reduce_.default, (c, "sum", gn))
    g.call_function(F.wait_tensor.default, (c,))  # waited on through the input
    g.output(g.call_function(aten.mul.Tensor, (c, 3.0)))
    return _gm(g), _x(n)


def coalesced(gn: str, n: int):
    g = fx.Graph()
    x = g.placeholder("x")
    y = g.call_function(aten.mul.Tensor, (x, -1.0))
    co = g.call_function(F.all_reduce_coalesced.default, ([x, y], "sum", gn))
    outs = []
    for i in range(2):
        item = g.call_function(operator.getitem, (co, i))
        outs.append(g.call_function(F.wait_tensor.default, (item,)))
    g.output(tuple(outs))
    return _gm(g), _x(n)


def coalesced_inplace(gn: str, n: int):
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(aten.clone.default, (x,))
    b = g.call_function(aten.mul.Tensor, (x, 2.0))
    co = g.call_function(F.all_reduce_coalesced_.default, ([a, b], "min", gn))
    for i in range(2):
        g.call_function(F.wait_tensor.default, (g.call_function(operator.getitem, (co, i)),))
    g.output((a, b))
    return _gm(g), _x(n)


def out_variant(gn: str, n: int):
    g = fx.Graph()
    x = g.placeholder("x")
    buf = g.call_function(aten.new_zeros.default, (x, [4 * n * n, 3]))
    r = g.call_function(F.all_gather_into_tensor_out.default, (x, n, gn), {"out": buf})
    w = g.call_function(F.wait_tensor.default, (r,))
    g.output((w, g.call_function(aten.add.Tensor, (buf, 1.0))))
    return _gm(g), _x(n)


def autograd_variants(gn: str, n: int):
    g = fx.Graph()
    x = g.placeholder("x")
    ag = g.call_function(FA.all_gather_into_tensor.default, (x, n, gn))
    rs = g.call_function(FA.reduce_scatter_tensor.default, (x, "sum", n, gn))
    a2a = g.call_function(FA.all_to_all_single.default, (x, [4] * n, [4] * n, gn))
    outs = [g.call_function(F.wait_tensor.default, (t,)) for t in (ag, rs, a2a)]
    g.output(tuple(outs))
    return _gm(g), _x(n)


def every_collective(gn: str, n: int):
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(F.reduce_scatter_tensor.default, (x, "avg", n, gn))
    b = g.call_function(F.all_to_all_single.default, (x, [4] * n, [4] * n, gn))
    c = g.call_function(F.broadcast.default, (x, n - 1, gn))
    d = g.call_function(aten.clone.default, (x,))
    e = g.call_function(F.broadcast_.default, (d, 0, gn))
    f = g.call_function(F.all_reduce.default, (x, "product", gn))
    outs = [g.call_function(F.wait_tensor.default, (t,)) for t in (a, b, c, e, f)]
    g.output((*outs, d))
    return _gm(g), _x(n)


def uneven_all_to_all(gn: str, n: int):
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else 0
    # rank r sends r+1 rows to every peer and receives (peer+1) rows from each peer
    g = fx.Graph()
    x = g.placeholder("x")
    ins = [rank + 1] * n
    outs = [p + 1 for p in range(n)]
    sl = g.call_function(aten.slice.Tensor, (x, 0, 0, (rank + 1) * n))
    a = g.call_function(F.all_to_all_single.default, (sl, outs, ins, gn))
    g.output(g.call_function(F.wait_tensor.default, (a,)))
    return _gm(g), _x(n)


BUILDERS: dict[str, Builder] = {
    f.__name__: f  # type: ignore[misc]
    for f in (
        late_wait,
        many_users,
        no_wait,
        inplace,
        coalesced,
        coalesced_inplace,
        out_variant,
        autograd_variants,
        every_collective,
        uneven_all_to_all,
    )
}


def run_before_after(rank: int, world: int, names: list[str]) -> dict[str, float]:
    """On real gloo ranks: each graph's outputs before and after the pass (max abs diff)."""
    import copy

    import torch.distributed as dist

    from torch_tensorrt_dist import fuse_collectives

    gn = dist.group.WORLD.group_name  # type: ignore[union-attr]
    diffs = {}
    for name in names:
        gm, inputs = BUILDERS[name](gn, world)
        ref_gm = no_wait(gn, world, wait=True)[0] if name == "no_wait" else gm
        ref = ref_gm(*[t.clone() for t in inputs])
        fused = fuse_collectives(copy.deepcopy(gm), strict=True)
        out = fused(*[t.clone() for t in inputs])
        ref = ref if isinstance(ref, tuple) else (ref,)
        out = out if isinstance(out, tuple) else (out,)
        assert len(ref) == len(out)
        diffs[name] = max((a - b).abs().max().item() for a, b in zip(ref, out))
    return diffs
