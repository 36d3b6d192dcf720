"""Rank functions for the ``verify`` tests: engines that pass, and broken ones that must not.

The broken engines live here, in the test, never in the package: they patch
``backend.build_engine`` for one compile.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch._dynamo
import torch.distributed._functional_collectives as funcol
from torch import fx, nn

import torch_tensorrt_dist  # noqa: F401
from torch_tensorrt_dist.backend import backend as backend_module
from torch_tensorrt_dist.models.toy import MLP
from torch_tensorrt_dist.ops.collectives import COLLECTIVE_OPS
from torch_tensorrt_dist.parallel import make_mesh
from torch_tensorrt_dist.parallel.plans import FunctionalTPMLP

Breaker = Callable[[fx.GraphModule], None]


def _drop_all_reduce(gm: fx.GraphModule) -> None:
    """The collective does nothing (as an engine whose communicator was never bound)."""
    for node in list(gm.graph.nodes):
        if node.target == COLLECTIVE_OPS["all_reduce"]:
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)


def _double_after_all_reduce(gm: fx.GraphModule) -> None:
    """The collective runs, then this rank's result is scaled: wrong here, schedule intact."""
    for node in list(gm.graph.nodes):
        if node.target == COLLECTIVE_OPS["all_reduce"]:
            with gm.graph.inserting_after(node):
                doubled = gm.graph.call_function(torch.ops.aten.mul.Tensor, (node, 2.0))
            node.replace_all_uses_with(doubled, delete_user_cb=doubled.__ne__)


def double_first_output(gm: fx.GraphModule) -> None:
    """A miscompiled graph: its first output comes out doubled."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    first = out.args[0][0]
    with gm.graph.inserting_before(out):
        doubled = gm.graph.call_function(torch.ops.aten.mul.Tensor, (first, 2.0))
    out.args = ((doubled, *out.args[0][1:]),)


@contextlib.contextmanager
def broken_engine(breaker: Breaker | None) -> Iterator[None]:
    """``build_engine`` builds the chosen engine from a copy of the graph ``breaker`` altered
    (the backend's reference copy is taken before, so it keeps the real graph)."""
    original = backend_module.build_engine

    def build(gm: fx.GraphModule, inputs: list[Any], settings: Any) -> Any:
        if breaker is None:
            return original(gm, inputs, settings)
        broken = fx.GraphModule(gm, copy.deepcopy(gm.graph))
        breaker(broken)
        broken.recompile()
        return original(broken, inputs, settings)

    backend_module.build_engine = build  # type: ignore[assignment]
    try:
        yield
    finally:
        backend_module.build_engine = original  # type: ignore[assignment]


def _outcome(fn: Callable[[], Any]) -> dict[str, Any]:
    try:
        return {"error": None, "value": fn()}
    except Exception as exc:
        inner = getattr(exc, "inner_exception", None) or exc
        return {"error": type(inner).__name__, "message": str(inner)}


def _compile(model: nn.Module, engine: str, **options: Any) -> Any:
    torch._dynamo.reset()
    return torch.compile(
        model,
        backend="torch_tensorrt_dist",
        options={"engine": engine, "verify": True, "schedule_timeout_s": 60.0} | options,
        fullgraph=True,
    )


class CacheWrite(nn.Module):
    """Adds its input to rows ``idx`` of a buffer in place, then all-reduces the buffer's sum."""

    def __init__(self, group: Any) -> None:
        super().__init__()
        self.group = group
        self.register_buffer("cache", torch.zeros(4, 8))

    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        # x: [len(idx), 8]; cache: [4, 8]
        self.cache.index_copy_(0, idx, self.cache.index_select(0, idx) + x)
        return funcol.all_reduce(self.cache.sum(0), "sum", self.group)


def scenarios(rank: int, world: int) -> dict[str, Any]:
    """Every scenario of the spawn test, each caught separately so one failure hides none."""
    torch.manual_seed(0)
    full = MLP(16, 32)
    mesh = make_mesh(tp=world)
    model = FunctionalTPMLP(full, mesh["tp"])
    x = torch.randn(2, 16)
    with torch.no_grad():
        want = full(x)
    out: dict[str, Any] = {}

    def run(engine: str, breaker: Breaker | None = None, verify: bool = True) -> Any:
        with broken_engine(breaker), torch.no_grad():
            compiled = _compile(model, engine, verify=verify)
            first = compiled(x)
            second = compiled(x)
        return float((first - want).abs().max()), float((second - want).abs().max())

    out["eager"] = _outcome(lambda: run("eager"))
    out["inductor"] = _outcome(lambda: run("inductor"))
    out["dropped"] = _outcome(lambda: run("eager", _drop_all_reduce))
    only_rank1 = _double_after_all_reduce if rank == 1 else None
    out["doubled_on_1"] = _outcome(lambda: run("eager", only_rank1))
    out["verify_on_0_only"] = _outcome(lambda: run("eager", verify=rank == 0))

    def cache() -> Any:
        m = CacheWrite(mesh["tp"].get_group())
        x = torch.full((2, 8), float(rank + 1))
        with torch.no_grad():
            y = _compile(m, "eager")(x, torch.tensor([1, 3]))
        return m.cache.tolist(), y.tolist()

    out["cache"] = _outcome(cache)
    return out


def tensorrt_scenarios(rank: int, world: int) -> dict[str, Any]:
    """On GPUs with TensorRT: a real engine passes its check (verify is on by default for
    ``tensorrt``), and a real engine built without its all_reduce is caught on every rank."""
    torch.cuda.set_device(rank)
    torch.manual_seed(0)
    full = MLP(16, 32).cuda()
    model = FunctionalTPMLP(full, make_mesh(tp=world)["tp"]).cuda()
    x = torch.randn(2, 16, device="cuda")
    with torch.no_grad():
        want = full(x)

    def run(breaker: Breaker | None) -> float:
        with broken_engine(breaker), torch.no_grad():
            torch._dynamo.reset()
            compiled = torch.compile(
                model,
                backend="torch_tensorrt_dist",
                options={"engine": "tensorrt"},
                fullgraph=True,
            )
            return float((compiled(x) - want).abs().max())

    return {"ok": _outcome(lambda: run(None)), "dropped": _outcome(lambda: run(_drop_all_reduce))}
