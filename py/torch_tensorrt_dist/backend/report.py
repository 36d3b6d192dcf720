"""What a compiled graph communicates: one entry per typed collective, and readable tables."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import fx

from torch_tensorrt_dist.conversion.layers.paged_forms import PagedOp
from torch_tensorrt_dist.lowering.input_writes import InputWrite
from torch_tensorrt_dist.lowering.sizes import shape_hint
from torch_tensorrt_dist.ops.collectives import COLLECTIVE_OPS

__all__ = [
    "CollectiveInfo",
    "GraphReport",
    "PagedOp",
    "TorchOpInfo",
    "collectives_in",
    "engines_in",
    "format_table",
    "module_path",
    "paged_ops_in",
    "torch_ops_in",
]

_OP_NAMES = {overload: name for name, overload in COLLECTIVE_OPS.items()}


@dataclass(frozen=True)
class CollectiveInfo:
    """One collective of a lowered graph (sizes are of the tensor a rank sends in)."""

    op: str
    group_ranks: tuple[int, ...]
    reduce_op: str | None
    dtype: str
    shape: tuple[int, ...]
    bytes: int
    node: str = ""
    #: the module that issued it (``layers.3.attention``; ``""`` for the top-level module)
    module: str = ""
    #: TensorRT implementation ("native", "plugin", "torch_nccl") -> None if it converts, else
    #: the reason
    tensorrt: dict[str, str | None] = field(default_factory=dict)

    @property
    def converts(self) -> str:
        """``native+plugin+torch_nccl``, ``native``, ... or ``no``: what TensorRT can take."""
        ok = [impl for impl, reason in self.tensorrt.items() if reason is None]
        return "+".join(ok) if ok else "no"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TorchOpInfo:
    """A non-collective op that TensorRT cannot take here: it runs in PyTorch and Torch-TensorRT
    splits the graph's engine around it (``conversion/layers/moe_experts.py``,
    ``conversion/layers/weight_only.py``; KV block writes: ``conversion/layers/paged_kv.py``)."""

    op: str
    node: str
    module: str
    dtype: str
    shape: tuple[int, ...]
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class GraphReport:
    """One captured graph: its collectives and what the lowering left unfused."""

    index: int
    collectives: list[CollectiveInfo] = field(default_factory=list)
    unfused: list[tuple[str, str]] = field(default_factory=list)
    num_nodes: int = 0
    #: seconds spent in lowering and checks (fusion, report, capability decisions)
    lowering_s: float = 0.0
    #: graph inputs the graph writes (KV caches): in place, or copied back whole
    input_writes: list[InputWrite] = field(default_factory=list)
    #: times the graph ran while it was recorded (``explain``: in one call of the model)
    runs: int = 0
    #: the compile units it ran in, with how often (``""``: the whole model; per-block
    #: compile: ``layers.0``, ``layers.1``, ... when one graph serves every block)
    units: dict[str, int] = field(default_factory=dict)
    #: ops a TensorRT engine leaves to PyTorch (each splits the engine), with the reason
    torch_ops: list[TorchOpInfo] = field(default_factory=list)
    #: the engines a TensorRT build makes of the graph around ``torch_ops`` (an estimate:
    #: ``conversion/layers/paged_forms.engine_count``); None where not asked
    engines: int | None = None
    #: the paged KV cache's block writes, block reads and attention calls, with their TensorRT
    #: forms (``conversion/layers/paged_forms.py``)
    paged: list[PagedOp] = field(default_factory=list)
    #: engine='tensorrt': the GraphModule Torch-TensorRT built (its engine submodules and the
    #: PyTorch parts between them), for checks on what really went into the engines
    engine_module: Any = field(default=None, repr=False, compare=False)

    @property
    def copied_back(self) -> list[InputWrite]:
        return [w for w in self.input_writes if not w.in_place]

    @property
    def written_in_place(self) -> list[InputWrite]:
        return [w for w in self.input_writes if w.in_place]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _tensorrt_decisions(gm: fx.GraphModule) -> dict[fx.Node, dict[str, str | None]]:
    """Per typed collective: would each TensorRT implementation convert it (pure, no TRT)?

    Implementations that bind one communicator per engine (native layers) decide against the
    one it would bind: its most used group.
    """
    from torch_tensorrt_dist.conversion.capability import node_decision
    from torch_tensorrt_dist.conversion.engine import engine_group
    from torch_tensorrt_dist.conversion.impl import implementations
    from torch_tensorrt_dist.conversion.node_args import collective_calls

    bound = engine_group(collective_calls(gm))
    comm = list(bound.group_ranks) if bound is not None else None
    decisions: dict[fx.Node, dict[str, str | None]] = {}
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _OP_NAMES:
            decisions[node] = {}
            for impl in implementations():
                ok, reason = node_decision(node, impl.name, **impl.facts(comm))
                decisions[node][impl.name] = None if ok else reason
    return decisions


#: Dynamo's name of the module a frame was called on: a local (``L['self']``) or a global
_DYNAMO_ROOT = re.compile(r"^[LG]\['[^']*'\]\.?")


#: names the module a Dynamo path (``L['self'].layers['0'].attention...``) reaches, or None
ModuleResolver = Callable[[str], "str | None"]


def module_path(node: fx.Node, resolve: ModuleResolver | None = None) -> str:
    """The name of the innermost module ``node`` came from, as ``named_modules`` spells it.

    ``resolve`` (see ``backend/module_names.py``) follows the Dynamo path through closures,
    bound methods, ``functools.partial`` and hooks; without it, or where it cannot, the path is
    shown as Dynamo recorded it, less its root (``L['self']``).
    """
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:  # code of the frame's own forward: a module compiled on its own, or the top
        name = resolve("L['self']") if resolve is not None else None
        return name or ""
    path = str(list(stack.values())[-1][0])
    name = resolve(path) if resolve is not None else None
    return name if name is not None else _DYNAMO_ROOT.sub("", path)


def collectives_in(
    gm: fx.GraphModule, resolve: ModuleResolver | None = None
) -> list[CollectiveInfo]:
    """The typed collectives of a lowered graph, in graph order."""
    out = []
    decisions = _tensorrt_decisions(gm)
    for node in gm.graph.nodes:
        name = _OP_NAMES.get(node.target) if node.op == "call_function" else None
        if name is None:
            continue
        x = node.args[0]
        val = x.meta.get("val") if isinstance(x, fx.Node) else None
        shape = shape_hint(val.shape) if val is not None else ()
        dtype = val.dtype if val is not None else torch.float32
        numel = 1
        for s in shape:
            numel *= s
        out.append(
            CollectiveInfo(
                op=name,
                group_ranks=tuple(int(r) for r in node.args[-1]),
                reduce_op=str(node.args[1]) if name in ("all_reduce", "reduce_scatter") else None,
                dtype=_dtype_name(dtype),
                shape=shape,
                bytes=numel * dtype.itemsize,
                node=node.name,
                module=module_path(node, resolve),
                tensorrt=decisions[node],
            )
        )
    return out


def torch_ops_in(
    gm: fx.GraphModule, resolve: ModuleResolver | None = None, *, require_constants: bool = True
) -> list[TorchOpInfo]:
    """The KV block writes, grouped MoE experts ops and weight-only matmuls of a graph that
    would stay in PyTorch under TensorRT here (``require_constants=False``: as if their weights
    were frozen, which engine='tensorrt' does). The TensorRT probe runs only for a MoE experts
    op."""
    from torch_tensorrt_dist.conversion.layers.moe_experts import node_moe_decision
    from torch_tensorrt_dist.conversion.layers.weight_only import (
        INT4_OP,
        INT8_OP,
        weight_only_decision,
    )
    from torch_tensorrt_dist.ops.experts import EXPERTS_OP

    names = {
        EXPERTS_OP: "moe_experts",
        INT8_OP: "_weight_int8pack_mm",
        INT4_OP: "int4_weight_only_mm",
    }
    out = _block_writes_in(gm, resolve)
    for node in gm.graph.nodes:
        name = names.get(node.target) if node.op == "call_function" else None
        if name is None:
            continue
        if node.target is EXPERTS_OP:
            decision = node_moe_decision(node, require_constants=require_constants)
        else:
            decision = weight_only_decision(node, require_constants=require_constants)
        if decision.convertible:
            continue
        val = node.meta.get("val")
        out.append(
            TorchOpInfo(
                op=name,
                node=node.name,
                module=module_path(node, resolve),
                dtype=_dtype_name(val.dtype) if isinstance(val, torch.Tensor) else "",
                shape=shape_hint(val.shape) if isinstance(val, torch.Tensor) else (),
                reason=decision.reason,
            )
        )
    return out


def _block_writes_in(gm: fx.GraphModule, resolve: ModuleResolver | None) -> list[TorchOpInfo]:
    """The KV block writes that run in PyTorch, in place (``conversion/layers/paged_kv.py``)."""
    from torch_tensorrt_dist.conversion.layers.paged_kv import pool_writes

    nodes = {n.name: n for n in gm.graph.nodes}
    out = []
    for w in pool_writes(gm):
        if not w.in_place:
            continue
        values = nodes[w.node].args[2]
        val = values.meta.get("val") if isinstance(values, fx.Node) else None
        out.append(
            TorchOpInfo(
                op="index_put (KV block write)",
                node=w.node,
                module=module_path(nodes[w.node], resolve),
                dtype=_dtype_name(val.dtype) if isinstance(val, torch.Tensor) else "",
                shape=shape_hint(val.shape) if isinstance(val, torch.Tensor) else (),
                reason=w.reason,
            )
        )
    return out


def paged_ops_in(gm: fx.GraphModule) -> list[PagedOp]:
    """The paged KV cache's ops of ``gm`` and their TensorRT forms."""
    from torch_tensorrt_dist.conversion.layers.paged_forms import paged_ops

    return paged_ops(gm)


def engines_in(gm: fx.GraphModule, torch_ops: list[TorchOpInfo]) -> int:
    """The engines a TensorRT build makes of ``gm`` with ``torch_ops`` in PyTorch (estimate)."""
    from torch_tensorrt_dist.conversion.layers.paged_forms import engine_count

    return engine_count(gm, {op.node for op in torch_ops})


def format_table(headers: list[str], rows: list[list[Any]]) -> str:
    """A plain fixed-width table (no dependency), numbers right-aligned."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row)]
    numeric = [all(_is_number(r[i]) for r in cells) and cells for i in range(len(headers))]

    def line(row: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if numeric[i] else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))
        ).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), sep, *(line(r) for r in cells)])


def _is_number(text: str) -> bool:
    try:
        float(text.replace(",", ""))
    except ValueError:
        return False
    return True
