"""Graph inputs a lowered graph writes (a KV cache, say): in place, or copied back whole.

AOTAutograd (with ``keep_inference_input_mutations``, as our backend traces for the eager and
Inductor engines) ends an inference graph with ``copy_(<input>, <new value>)`` for each input
the model mutated. What that costs depends on where the new value comes from:

    k_cache.index_copy_(2, pos, k)          # index_copy(ph, 2, pos, k) -> copy_(ph, .)
                                            #   in place: only k's bytes are written
    k_cache[:b].index_copy_(2, pos, k)      # slice -> index_copy -> slice_scatter(ph, .)
                                            #   -> copy_(ph, .): the whole buffer, every call

:func:`input_writes` classifies each write (pure FX analysis, used by reports and ``explain``);
:func:`reinplace_input_writes` turns the in-place kind into the in-place op itself
(``index_copy_`` / ``index_put_`` on the input), so even the FX graph run as is (the ``eager``
engine) writes only the update. Inductor does the same rewrite itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from torch_tensorrt_dist.lowering.sizes import numel_hint

__all__ = ["InputWrite", "input_writes", "reinplace_input_writes"]

_aten = torch.ops.aten
#: functional write -> its in-place form (first argument: the tensor written)
_INPLACE: dict[Any, Any] = {
    _aten.index_copy.default: _aten.index_copy_.default,
    _aten.index_put.default: _aten.index_put_.default,
}
#: argument of each write that holds the values written
_VALUES_ARG: dict[Any, int] = {_aten.index_copy.default: 3, _aten.index_put.default: 2}


@dataclass(frozen=True)
class InputWrite:
    """One graph input the graph writes."""

    input: str  # the placeholder's name
    in_place: bool  # True: only the update is written; False: the whole input is copied back
    bytes: int  # bytes written per call (the update, or the whole input)


def _nbytes(node: Any) -> int:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    if not isinstance(val, torch.Tensor):
        return 0
    return numel_hint(val) * val.dtype.itemsize  # dynamic dimensions: at their example size


def _is_input_copy(node: fx.Node) -> bool:
    return (
        node.op == "call_function"
        and node.target is _aten.copy_.default
        and isinstance(node.args[0], fx.Node)
        and node.args[0].op == "placeholder"
    )


def _in_place_source(copy: fx.Node, order: dict[fx.Node, int]) -> fx.Node | None:
    """The functional write feeding ``copy_(ph, src)`` if it can be done in place on ``ph``:
    ``src = index_copy|index_put(ph, ...)``, used only by the graph after it (not by the
    output), and no other reader of ``ph`` runs after it (it would see the new value)."""
    ph, src = copy.args[0], copy.args[1]
    if not isinstance(src, fx.Node) or src.target not in _INPLACE or src.args[0] is not ph:
        return None
    assert isinstance(ph, fx.Node)
    readers = [u for u in ph.users if u is not src and u is not copy]
    if any(order[u] > order[src] for u in readers):
        return None
    if any(u.op == "output" for u in src.users):
        return None
    return src


def input_writes(gm: fx.GraphModule) -> list[InputWrite]:
    """Every graph input ``gm`` writes, in graph order, classified as in place or copied back.

    Reads both forms: ``copy_(ph, index_copy(ph, ...))`` (before :func:`reinplace_input_writes`)
    and ``index_copy_(ph, ...)`` (after it, or written so by hand).
    """
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    out: list[InputWrite] = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if _is_input_copy(node):
            ph = node.args[0]
            src = _in_place_source(node, order)
            if src is not None:
                out.append(InputWrite(ph.name, True, _nbytes(src.args[_VALUES_ARG[src.target]])))
            else:
                out.append(InputWrite(ph.name, False, _nbytes(ph)))
        elif node.target in _INPLACE.values():
            ph = node.args[0]
            if isinstance(ph, fx.Node) and ph.op == "placeholder":
                functional = next(k for k, v in _INPLACE.items() if v is node.target)
                out.append(InputWrite(ph.name, True, _nbytes(node.args[_VALUES_ARG[functional]])))
    return out


def reinplace_input_writes(gm: fx.GraphModule) -> int:
    """Rewrite ``copy_(ph, index_copy(ph, ...))`` as ``index_copy_(ph, ...)`` (and index_put),
    in place; returns how many writes it rewrote. Others are left as they are (correct)."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    rewritten = 0
    for copy in [n for n in gm.graph.nodes if n.op == "call_function" and _is_input_copy(n)]:
        src = _in_place_source(copy, order)
        if src is None:
            continue
        src.target = _INPLACE[src.target]  # same arguments; returns the written input
        copy.replace_all_uses_with(src)
        gm.graph.erase_node(copy)
        rewritten += 1
    if rewritten:
        gm.graph.lint()
        gm.recompile()
    return rewritten
