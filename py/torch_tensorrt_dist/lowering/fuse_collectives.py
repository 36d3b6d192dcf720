"""Lowering pass: ``_c10d_functional`` collective + ``wait_tensor`` -> one typed op.

After this pass every collective in an aten graph is one ``torch.ops.tensorrt_dist.*`` node
with named arguments and the group's global ranks resolved, and no ``wait_tensor`` is left for
a collective it fused. Handled: waits anywhere after the collective (or missing), several users,
the in-place variants (``all_reduce_``, ``broadcast_``: the fused value is copied back into the
input), the ``_out`` variants, the coalesced variants (one op per tensor) and the
``_c10d_functional_autograd`` variants. A collective that cannot be fused (an unresolvable group,
an unsupported reduce op...) stays as it is and is reported in ``gm.meta["tensorrt_dist"]``.
The pass is idempotent.
"""

from __future__ import annotations

import logging
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from torch_tensorrt_dist.errors import TensorRTDistError
from torch_tensorrt_dist.ops.collectives import COLLECTIVE_OPS, normalize_reduce_op
from torch_tensorrt_dist.ops.groups import group_name_of, group_ranks

__all__ = ["SOURCE_COLLECTIVES", "FusionReport", "fuse_collectives", "fusion_report"]

logger = logging.getLogger(__name__)

META_KEY = "tensorrt_dist"

_F = torch.ops._c10d_functional
_WAIT = _F.wait_tensor.default


# provenance carried from the collective to its typed op; never argument-shaped meta such as
# "eager_input_vals" (Inductor normalises those against the op's own schema)
_KEPT_META = ("stack_trace", "nn_module_stack", "source_fn_stack", "from_node", "seq_nr")


@dataclass
class FusionReport:
    """What ``fuse_collectives`` did to one graph (accumulated over repeated runs)."""

    fused: list[str] = field(default_factory=list)  # typed op names, in graph order
    unfused: list[tuple[str, str]] = field(default_factory=list)  # (node, reason)


@dataclass(frozen=True)
class _Rule:
    kind: str  # the typed op it becomes
    extra: tuple[str, ...]  # schema arguments carried into the typed op, in order
    mode: str = "value"  # "value" | "inplace" | "out" | "coalesced" | "coalesced_inplace"


def _rules() -> dict[Any, _Rule]:
    table: dict[str, _Rule] = {
        "all_reduce": _Rule("all_reduce", ("reduce_op",)),
        "all_reduce_": _Rule("all_reduce", ("reduce_op",), "inplace"),
        "all_reduce_coalesced": _Rule("all_reduce", ("reduce_op",), "coalesced"),
        "all_reduce_coalesced_": _Rule("all_reduce", ("reduce_op",), "coalesced_inplace"),
        "all_gather_into_tensor": _Rule("all_gather", ()),
        "all_gather_into_tensor_out": _Rule("all_gather", (), "out"),
        "all_gather_into_tensor_coalesced": _Rule("all_gather", (), "coalesced"),
        "reduce_scatter_tensor": _Rule("reduce_scatter", ("reduce_op",)),
        "reduce_scatter_tensor_out": _Rule("reduce_scatter", ("reduce_op",), "out"),
        "reduce_scatter_tensor_coalesced": _Rule("reduce_scatter", ("reduce_op",), "coalesced"),
        "all_to_all_single": _Rule("all_to_all", ("output_split_sizes", "input_split_sizes")),
        "broadcast": _Rule("broadcast", ("src",)),
        "broadcast_": _Rule("broadcast", ("src",), "inplace"),
    }
    rules: dict[Any, _Rule] = {}
    for namespace in ("_c10d_functional", "_c10d_functional_autograd"):
        ns = getattr(torch.ops, namespace)
        for name, rule in table.items():
            if hasattr(ns, name):  # not every variant exists in every namespace / version
                rules[getattr(ns, name).default] = rule
    return rules


#: every source collective the pass recognises -> how it is rewritten
SOURCE_COLLECTIVES: dict[Any, _Rule] = _rules()


def fusion_report(gm: fx.GraphModule) -> FusionReport:
    """The report of the fusion runs on ``gm`` (empty if the pass never ran)."""
    report = gm.meta.get(META_KEY)
    return report if isinstance(report, FusionReport) else FusionReport()


def _bind(node: fx.Node) -> dict[str, Any]:
    schema = node.target._schema  # type: ignore[union-attr]
    bound: dict[str, Any] = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args):
            bound[arg.name] = node.args[i]
        elif arg.name in node.kwargs:
            bound[arg.name] = node.kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
    return bound


def _typed_args(rule: _Rule, bound: dict[str, Any], ranks: list[int]) -> list[Any]:
    extra = [bound[name] for name in rule.extra]
    if "reduce_op" in rule.extra:
        extra[rule.extra.index("reduce_op")] = normalize_reduce_op(bound["reduce_op"])
    if rule.kind == "broadcast" and not 0 <= int(extra[0]) < len(ranks):
        raise TensorRTDistError(f"broadcast source {extra[0]} is outside a group of {len(ranks)}")
    if "group_size" in bound and int(bound["group_size"]) != len(ranks):
        raise TensorRTDistError(
            f"group_size {bound['group_size']} does not match the group's {len(ranks)} ranks"
        )
    return [*extra, group_name_of(bound["group_name"]), ranks]


def _redirect_users(old: fx.Node, new: fx.Node) -> None:
    """Every ``wait_tensor(old)`` and every other use of ``old`` now reads ``new``."""
    for user in list(old.users):
        if user.op == "call_function" and user.target is _WAIT:
            user.replace_all_uses_with(new)
            user.graph.erase_node(user)
    old.replace_all_uses_with(new)


def _drop_waits_on(value: fx.Node, after: fx.Node) -> None:
    """In-place collectives are waited on through their input: drop those waits."""
    order = {n: i for i, n in enumerate(after.graph.nodes)}
    for user in list(value.users):
        if user.target is _WAIT and order[user] > order[after]:
            user.replace_all_uses_with(value)
            user.graph.erase_node(user)


def _fuse_one(gm: fx.GraphModule, node: fx.Node, rule: _Rule) -> list[str]:
    bound = _bind(node)
    ranks = group_ranks(bound["group_name"])
    op = COLLECTIVE_OPS[rule.kind]
    graph = gm.graph
    tail = _typed_args(rule, bound, ranks)

    def emit(x: fx.Node, val: Any) -> fx.Node:
        new = graph.call_function(op, (x, *tail))
        new.meta.update({k: v for k, v in node.meta.items() if k in _KEPT_META})
        if val is not None:
            new.meta["val"] = val
        return new

    def copy_back(dst: fx.Node, src: fx.Node) -> fx.Node:
        copied = graph.call_function(torch.ops.aten.copy_.default, (dst, src))
        if "val" in dst.meta:
            copied.meta["val"] = dst.meta["val"]
        return copied

    if rule.mode.startswith("coalesced"):
        for user in node.users:
            if user.target is not operator.getitem:
                raise TensorRTDistError(f"coalesced result used by {user.format_node()}")
    val = node.meta.get("val")
    with graph.inserting_before(node):
        if rule.mode in ("value", "inplace", "out"):
            x = bound["input"]
            new = emit(x, val)
            result = new
            if rule.mode == "inplace":
                result = copy_back(x, new)
                _drop_waits_on(x, node)
            elif rule.mode == "out":
                result = copy_back(bound["out"], new)
                _drop_waits_on(bound["out"], node)
            _redirect_users(node, result)
            fused = [rule.kind]
        else:  # coalesced: one typed op per tensor, read through getitem
            inputs = list(bound["inputs"])
            vals = list(val) if isinstance(val, (list, tuple)) else [None] * len(inputs)
            outs = [emit(x, v) for x, v in zip(inputs, vals)]
            if rule.mode == "coalesced_inplace":
                outs = [copy_back(x, o) for x, o in zip(inputs, outs)]
                for x in inputs:
                    _drop_waits_on(x, node)
            for user in list(node.users):
                _redirect_users(user, outs[int(user.args[1])])  # type: ignore[arg-type]
                graph.erase_node(user)
            fused = [rule.kind] * len(inputs)
    graph.erase_node(node)
    return fused


def fuse_collectives(
    gm: fx.GraphModule, settings: Any = None, *, strict: bool = False
) -> fx.GraphModule:
    """Fuse every ``_c10d_functional`` collective with its wait into a typed op, in place.

    ``settings`` is accepted for Torch-TensorRT's pass signature ``(gm, settings) -> gm``.
    With ``strict=True`` a collective that cannot be fused raises instead of being reported.
    """
    report = gm.meta.setdefault(META_KEY, FusionReport())
    changed = False
    for node in list(gm.graph.nodes):
        rule = SOURCE_COLLECTIVES.get(node.target) if node.op == "call_function" else None
        if rule is None:
            continue
        try:
            report.fused.extend(_fuse_one(gm, node, rule))
            changed = True
        except TensorRTDistError as exc:
            if strict:
                raise
            reason = f"{node.target}: {exc}"
            logger.warning("collective %s left unfused: %s", node.name, reason)
            report.unfused.append((node.name, reason))
    if changed:
        gm.graph.lint()
        gm.recompile()
    return gm
