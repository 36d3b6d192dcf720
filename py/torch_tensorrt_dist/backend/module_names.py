"""Name the module a graph node came from as ``named_modules()`` names it.

Dynamo records, per node, the path by which the frame reached the module (its
``nn_module_stack``), starting at a frame local or global (``L['self']``, ``G['model']``) and going
through whatever wrapped the module's forward on the way:

    L['self'].attention.forward.__closure__[0].cell_contents.__self__.wo      # closure
    L['self']._modules['b'].forward.__self__.m                                # bound method
    L['self'].c.forward.func.__self__                                         # functools.partial
    L['self'].d._forward_hooks[list(dict.keys(L['self'].d._forward_hooks))[0]].__closure__[0]...

A string rewrite cannot tell which object such a path ends at, so :class:`ModuleNamer`
*evaluates* it: it finds the object behind the frame's root name (from the graph's parameter
inputs, whose Dynamo source and real tensor are both known), walks the path on it with a small
evaluator that accepts only attribute, item and ``list``/``dict.keys`` steps (never ``eval``),
and looks the module it reaches up by identity.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import fx

__all__ = ["ModuleNamer", "UnresolvedPath", "evaluate_path", "split_root"]


class UnresolvedPath(LookupError):
    """A Dynamo path that does not evaluate on the given roots (or uses a form we do not walk)."""


#: calls a Dynamo source name may contain, and what they do
_CALLS: dict[str, Any] = {
    "list": list,
    "tuple": tuple,
    "dict.keys": dict.keys,
    "dict.values": dict.values,
}


def _call_name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return f"{func.value.id}.{func.attr}"
    return ""


def _root_key(node: ast.expr) -> str | None:
    """``L['self']`` for the node ``L['self']`` (a frame local or global), else None."""
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and node.value.id in ("L", "G")
        and isinstance(node.slice, ast.Constant)
        and isinstance(node.slice.value, str)
    ):
        return f"{node.value.id}[{node.slice.value!r}]"
    return None


def _walk(node: ast.expr, roots: Mapping[str, Any]) -> Any:
    key = _root_key(node)
    if key is not None:
        if key not in roots:
            raise UnresolvedPath(f"no object known for {key}")
        return roots[key]
    try:
        if isinstance(node, ast.Attribute):
            return getattr(_walk(node.value, roots), node.attr)
        if isinstance(node, ast.Subscript):
            return _walk(node.value, roots)[_walk(node.slice, roots)]
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, str)):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -_walk(node.operand, roots)
        if isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords:
            call = _CALLS.get(_call_name(node.func))
            if call is not None:
                return call(_walk(node.args[0], roots))
    except (AttributeError, LookupError, TypeError) as exc:
        raise UnresolvedPath(f"{ast.unparse(node)}: {exc}") from exc
    raise UnresolvedPath(f"unsupported step {ast.unparse(node)!r}")


_NUMERIC_ATTR = re.compile(r"\.(\d+)(?=[.\[]|$)")


def _python_form(path: str) -> str:
    """Dynamo's ``layers.0`` (a numbered child, not a Python attribute) as
    ``layers._modules['0']``; text inside quotes is left alone."""
    parts = re.split(r"('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")", path)
    return "".join(
        part if i % 2 else _NUMERIC_ATTR.sub(r"._modules['\1']", part)
        for i, part in enumerate(parts)
    )


def _parse(path: str) -> ast.expr:
    try:
        return ast.parse(_python_form(path), mode="eval").body
    except SyntaxError as exc:
        raise UnresolvedPath(f"not a Dynamo path: {path!r}") from exc


def split_root(path: str) -> tuple[str, str]:
    """``("L['self']", path)``: the root name a Dynamo path starts at (``""`` if none)."""
    try:
        node = _parse(path)
    except UnresolvedPath:
        return "", path
    while True:
        key = _root_key(node)
        if key is not None:
            return key, path
        if isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        elif isinstance(node, ast.Call) and node.args:
            node = node.args[0]
        else:
            return "", path


def evaluate_path(path: str, roots: Mapping[str, Any]) -> Any:
    """The object a Dynamo path reaches from ``roots`` (root name -> object).

    Raises :class:`UnresolvedPath` when a step fails or is not an attribute, item or
    ``list(...)``/``dict.keys(...)`` step.
    """
    return _walk(_parse(path), roots)


def _source_name(node: fx.Node) -> tuple[str, Any] | None:
    """(Dynamo source name, real value) of a graph input, where Dynamo recorded them."""
    arg = node.meta.get("grapharg")
    source = getattr(arg, "source", None)
    if arg is None or source is None:
        return None
    name = source.name() if callable(source.name) else source.name
    try:
        example = arg.example
    except (AssertionError, AttributeError, RuntimeError):  # a dead weak reference
        return None
    return str(name), example


class ModuleNamer:
    """Names modules of ``root`` (``named_modules()`` names) from Dynamo paths."""

    def __init__(self, root: torch.nn.Module) -> None:
        self.root = root
        self._names: dict[int, str] = {}
        self._owners: dict[int, str] = {}  # parameter or buffer -> its module's name
        for name, module in root.named_modules(remove_duplicate=False):
            self._names.setdefault(id(module), name)
            for tensor in itertools.chain(module._parameters.values(), module._buffers.values()):
                if tensor is not None:
                    self._owners.setdefault(id(tensor), name)

    def name_of(self, obj: Any) -> str | None:
        """The name of a module of ``root`` (``""`` for root itself), None for anything else."""
        return self._names.get(id(obj))

    def roots(self, gm: fx.GraphModule) -> dict[str, Any]:
        """The objects behind the root names of a Dynamo graph's paths (``L['self']``, ...).

        Found from the graph's parameter and buffer inputs: the module whose path to the tensor
        is the input's Dynamo source is the root. Roots no such input reaches are left out.
        """
        roots: dict[str, Any] = {}
        for node in gm.graph.find_nodes(op="placeholder"):
            found = _source_name(node)
            if found is None or id(found[1]) not in self._owners:
                continue
            path, tensor = found
            key, _ = split_root(path)
            if not key or key in roots:
                continue
            owner = self._owners[id(tensor)]
            parts = owner.split(".") if owner else []
            for depth in range(len(parts), -1, -1):  # the owner, then its ancestors
                candidate = self.root.get_submodule(".".join(parts[:depth]))
                try:
                    if evaluate_path(path, {key: candidate}) is tensor:
                        roots[key] = candidate
                        break
                except UnresolvedPath:
                    continue
        return roots

    def resolve(self, path: str, roots: Mapping[str, Any]) -> str | None:
        """The ``named_modules()`` name of the module ``path`` reaches, or None."""
        try:
            return self.name_of(evaluate_path(path, roots))
        except UnresolvedPath:
            return None
