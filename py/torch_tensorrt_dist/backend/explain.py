"""``explain``: how a (sharded) model compiles, and what it communicates per call.

    report = torch_tensorrt_dist.explain(model, x)
    print(report)          # graphs, breaks, runs, and one row per collective of each graph
    report.collectives     # [CollectiveInfo(op, group_ranks, reduce_op, dtype, shape, bytes)]
    report.collectives_per_call

It compiles the model with the ``eager`` engine (so it works on a fake process group, on CPU,
for any world size) the way the model is compiled: the whole call, or, where blocks were
compiled on their own (``Module.compile``: torchtitan's ``apply_compile``, our
:func:`~torch_tensorrt_dist.compile_blocks`), each block. The first call compiles; a second
call counts what runs: each graph's runs (one graph per block serves every block), and the
collectives that ran outside the lowered graphs (eager code between compiled blocks).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch._dynamo
from torch._dynamo.utils import counters

from torch_tensorrt_dist.backend.backend import BACKEND_NAME, recording, running_unit
from torch_tensorrt_dist.backend.collective_events import EagerCollective, untyped
from torch_tensorrt_dist.backend.explain_format import format_report
from torch_tensorrt_dist.backend.module_names import ModuleNamer
from torch_tensorrt_dist.backend.report import CollectiveInfo, GraphReport, TorchOpInfo

__all__ = ["ExplainReport", "compiled_units", "explain"]

logger = logging.getLogger(__name__)

_OPTIONS: dict[str, Any] = {"engine": "eager"}


@dataclass
class ExplainReport:
    """How a model compiles on this rank, and what one call of it communicates."""

    graph_count: int
    graph_breaks: list[str]
    #: every graph's collectives, each listed once (a graph that runs 6 times is listed once)
    collectives: list[CollectiveInfo]
    graphs: list[GraphReport] = field(default_factory=list)
    rank: int | None = None
    world_size: int | None = None
    #: the TensorRT collective implementation this process would use, and why (or why none);
    #: the CLI prints it per requested ``--collective-impl`` after the table
    tensorrt_impl: tuple[str | None, str] = (None, "")
    #: the modules compiled on their own (per-block compile); empty: the whole call
    compile_units: list[str] = field(default_factory=list)
    #: collectives of one call that ran outside the lowered graphs; None where not counted
    outside_graphs: list[EagerCollective] | None = field(default_factory=list)

    @property
    def unfused(self) -> list[tuple[str, str]]:
        return [item for g in self.graphs for item in g.unfused]

    @property
    def torch_ops(self) -> list[TorchOpInfo]:
        """Ops a TensorRT engine would leave to PyTorch here (each splits the engine)."""
        return [op for g in self.graphs for op in g.torch_ops]

    @property
    def total_bytes(self) -> int:
        """Bytes of the listed collectives, each once."""
        return sum(c.bytes for c in self.collectives)

    @property
    def in_graphs_per_call(self) -> int:
        """Collectives the lowered graphs issue in one call (each graph times its runs)."""
        return sum(g.runs * len(g.collectives) for g in self.graphs)

    @property
    def collectives_per_call(self) -> int:
        """Every collective one call issues: in the graphs, times their runs, and outside."""
        outside = sum(c.count for c in self.outside_graphs or ())
        return self.in_graphs_per_call + outside

    @property
    def bytes_per_call(self) -> int:
        """Bytes the lowered graphs' collectives send in one call."""
        return sum(g.runs * sum(c.bytes for c in g.collectives) for g in self.graphs)

    @property
    def reused_graphs(self) -> list[GraphReport]:
        """Graphs that ran more than once in one call (per-block compile: one per block)."""
        return [g for g in self.graphs if g.runs > 1]

    def as_dict(self) -> dict[str, Any]:
        outside = self.outside_graphs
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "graph_count": self.graph_count,
            "graph_breaks": list(self.graph_breaks),
            "collectives": [c.as_dict() for c in self.collectives],
            "compile_units": list(self.compile_units),
            "graphs": [
                {
                    "graph": g.index,
                    "runs": g.runs,
                    "units": dict(g.units),
                    "collectives": len(g.collectives),
                }
                for g in self.graphs
            ],
            "collectives_per_call": self.collectives_per_call,
            "outside_graphs": None if outside is None else [c.as_dict() for c in outside],
            "unfused": [list(u) for u in self.unfused],
            "torch_ops": [
                {"graph": g.index, **op.as_dict()} for g in self.graphs for op in g.torch_ops
            ],
            "total_bytes": self.total_bytes,
            "bytes_per_call": self.bytes_per_call,
            "tensorrt_impl": {"impl": self.tensorrt_impl[0], "reason": self.tensorrt_impl[1]},
            "input_writes": [
                {
                    "graph": g.index,
                    "in_place": len(g.written_in_place),
                    "in_place_bytes": sum(w.bytes for w in g.written_in_place),
                    "copied_back": len(g.copied_back),
                    "copied_back_bytes": sum(w.bytes for w in g.copied_back),
                }
                for g in self.graphs
            ],
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2)

    def __str__(self) -> str:
        return format_report(self)


def compiled_units(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The outermost submodules compiled on their own (``Module.compile``), by name."""
    units: list[tuple[str, torch.nn.Module]] = []
    for name, module in model.named_modules():
        if getattr(module, "_compiled_call_impl", None) is None:
            continue
        if not any(name == u or name.startswith(u + ".") for u, _ in units if u):
            units.append((name, module))
    return units


def _in_unit(name: str, run: Callable[..., Any]) -> Callable[..., Any]:
    def unit_call(*args: Any, **kwargs: Any) -> Any:
        with running_unit(name):
            return run(*args, **kwargs)

    return unit_call


@contextlib.contextmanager
def _explained_units(
    units: list[tuple[str, torch.nn.Module]], dynamic: bool | None
) -> Iterator[None]:
    """Compile each unit with the eager engine for the block; restore the user's compile after."""
    saved = [(module, module._compiled_call_impl) for _, module in units]
    try:
        for name, module in units:
            compiled = torch.compile(
                module._call_impl, backend=BACKEND_NAME, options=_OPTIONS, dynamic=dynamic
            )
            module._compiled_call_impl = _in_unit(name, compiled)
        yield
    finally:
        for module, impl in saved:
            module._compiled_call_impl = impl


def _owning_module(fn: Any, depth: int = 0) -> torch.nn.Module | None:
    """The one module a callable works on (itself, its ``__self__``, a partial's or closure's
    module), to name modules by; None if there is none or more than one."""
    if isinstance(fn, torch.nn.Module):
        return fn
    if depth > 2:
        return None
    inner: list[Any] = []
    if hasattr(fn, "__self__"):
        inner.append(fn.__self__)
    if hasattr(fn, "func") and hasattr(fn, "args"):  # functools.partial
        inner += [fn.func, *fn.args, *getattr(fn, "keywords", {}).values()]
    for cell in getattr(fn, "__closure__", None) or ():
        with contextlib.suppress(ValueError):  # an empty cell
            inner.append(cell.cell_contents)
    found = {id(m): m for m in (_owning_module(x, depth + 1) for x in inner) if m is not None}
    return next(iter(found.values())) if len(found) == 1 else None


def _profiled(run: Callable[[], Any]) -> list[Any]:
    """The profiler's CPU events of one run (Kineto: it pairs the events c10d ends on its
    worker threads; on a CUDA build of torch without a GPU it logs its start on stderr)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        run()
    return list(prof.events())


def _count_outside(
    run: Callable[[], Any], graphs: list[GraphReport], needed: bool
) -> list[EagerCollective] | None:
    """Run the counted call; the collectives that ran outside the lowered graphs.

    Profiled only where code runs outside the graphs (blocks compiled one by one, breaks);
    recounted once if the call compiled (tracing would add its own events). None where they
    cannot be counted: a profiler already runs, or the model recompiles on every call.
    """
    if not needed:
        run()
        return []
    if torch.autograd._profiler_enabled():
        logger.warning("explain: a profiler is running; collectives outside graphs not counted")
        run()
        return None
    for _ in range(2):
        compiled = len(graphs)
        events = _profiled(run)
        if len(graphs) == compiled:
            return untyped(events)
        logger.info("explain: the counted call compiled again; counting the next one")
    logger.warning("explain: collectives outside graphs not counted (the model recompiles)")
    return None


def explain(
    model: Callable[..., Any] | torch.nn.Module,
    *example_inputs: Any,
    dynamic: bool | None = False,
    **example_kwargs: Any,
) -> ExplainReport:
    """Compile ``model`` on these inputs and report graphs, breaks, runs and collectives.

    Calls the model twice (through the ``eager`` engine): the first call compiles, the second
    is counted. On a fake process group the collectives do nothing, so any world size and mesh
    can be explained in one CPU process. Resets Dynamo before and after.
    """
    torch._dynamo.reset()
    counters.clear()
    root = getattr(model, "_orig_mod", model)  # a torch.compile'd module: its module
    owner = _owning_module(root)
    units = compiled_units(root) if isinstance(root, torch.nn.Module) else []
    if [name for name, _ in units] == [""]:
        units = []  # the module itself was compiled: that is the whole call
    if units:
        target: Callable[..., Any] = root
    else:

        def call(*args: Any, **kwargs: Any) -> Any:
            # a call of the module (not the module) inlines its hooks, such as the
            # input/output hooks of DTensor parallel styles, into the same graph
            return root(*args, **kwargs)

        target = torch.compile(
            call if isinstance(root, torch.nn.Module) else root,
            backend=BACKEND_NAME,
            options=_OPTIONS,
            dynamic=dynamic,
        )
    namer = ModuleNamer(owner) if owner is not None else None
    try:
        with _explained_units(units, dynamic), recording(namer) as graphs, torch.no_grad():
            target(*example_inputs, **example_kwargs)  # compiles
            first = len(graphs)

            def counted_call() -> None:
                for g in graphs:
                    g.runs, g.units = 0, {}
                target(*example_inputs, **example_kwargs)

            n_breaks = sum(counters["graph_break"].values())
            eager_code = bool(units) or len(graphs) != 1 or n_breaks > 0
            outside = _count_outside(counted_call, graphs, eager_code)
    finally:
        breaks = [
            f"{reason} (x{count})" if count > 1 else reason
            for reason, count in counters["graph_break"].items()
        ]
        torch._dynamo.reset()
    if len(graphs) > first:
        breaks.append(f"{len(graphs) - first} graph(s) recompiled on the second call")
    frames = first - 1 - n_breaks  # graphs of the first call a break does not explain
    if frames > 0 and not units:
        breaks.append(
            f"{frames} more graph(s) from code Dynamo compiled as separate frames "
            "(module hooks, or functions it could not inline)"
        )
    rank = world_size = None
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        rank, world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
    from torch_tensorrt_dist.conversion.choice import current_impl

    choice = current_impl()
    return ExplainReport(
        tensorrt_impl=(choice.impl, choice.reason),
        graph_count=len(graphs),
        graph_breaks=breaks,
        collectives=[c for g in graphs for c in g.collectives],
        graphs=graphs,
        rank=rank,
        world_size=world_size,
        compile_units=[name for name, _ in units],
        outside_graphs=outside,
    )
