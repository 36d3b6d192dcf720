"""``explain`` names modules as ``named_modules()`` does, through every wrapper of a forward.

Pure tests of the path evaluator on hand-built objects, then real Dynamo paths on the fake
process group: a forward replaced by a closure over the bound method (torchtitan's
``Module.parallelize``), by a bound method of another object, by ``functools.partial``, and a
forward hook that calls another module.
"""

from __future__ import annotations

import functools
import types

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from torch_tensorrt_dist import explain
from torch_tensorrt_dist.backend.explain import _owning_module
from torch_tensorrt_dist.backend.explain_format import unit_pattern
from torch_tensorrt_dist.backend.fake_world import fake_world
from torch_tensorrt_dist.backend.module_names import (
    ModuleNamer,
    UnresolvedPath,
    evaluate_path,
    split_root,
)

# --- pure: the evaluator on hand-written forms of each wrapper ---------------------------------


class _Owner(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wo = torch.nn.Linear(2, 2)


def _closure_over(fn: object) -> types.FunctionType:
    def wrapped(*args: object) -> object:
        return fn(*args)  # type: ignore[operator]

    return wrapped  # type: ignore[return-value]


def test_paths_through_closures_bound_methods_partials_and_hooks() -> None:
    owner = _Owner()
    closure = _closure_over(owner.forward)
    partial = functools.partial(_Owner.forward, owner)
    hooks = {7: _closure_over(owner)}
    root = types.SimpleNamespace(attention=types.SimpleNamespace(forward=closure))
    roots = {"L['self']": root, "G['p']": partial, "L['hooks']": hooks}
    path = "L['self'].attention.forward.__closure__[0].cell_contents.__self__.wo"
    assert evaluate_path(path, roots) is owner.wo
    assert evaluate_path("G['p'].args[0].wo", roots) is owner.wo
    assert evaluate_path("G['p'].func", roots) is _Owner.forward
    hook = "L['hooks'][list(dict.keys(L['hooks']))[0]].__closure__[0].cell_contents.wo"
    assert evaluate_path(hook, roots) is owner.wo
    assert split_root(path) == ("L['self']", path)
    assert split_root(hook)[0] == "L['hooks']"
    assert split_root("not a path(")[0] == ""


def test_numbered_children_and_what_is_never_evaluated() -> None:
    model = torch.nn.Sequential(torch.nn.ModuleDict({"0": _Owner()}))
    # Dynamo writes numbered children as attributes: ``layers.0``
    assert evaluate_path("L['m'].0.0.wo", {"L['m']": model}) is model[0]["0"].wo
    assert evaluate_path("L['m']._modules['0']['0'].wo", {"L['m']": model}) is model[0]["0"].wo
    for bad in (
        "__import__('os').system('true')",  # a call we do not make
        "L['m'].missing",  # a step that fails
        "L['other'].wo",  # a root we do not know
        "L['m'].0.0.wo + 1",  # not a path
    ):
        with pytest.raises(UnresolvedPath):
            evaluate_path(bad, {"L['m']": model})


def test_namer_names_modules_and_nothing_else() -> None:
    model = torch.nn.Sequential(_Owner(), _Owner())
    namer = ModuleNamer(model)
    assert namer.name_of(model[1].wo) == "1.wo"
    assert namer.name_of(model) == ""
    assert namer.name_of(model[1].wo.weight) is None  # a parameter is not a module
    assert namer.resolve("L['x'].1.wo", {"L['x']": model}) == "1.wo"
    assert namer.resolve("L['x'].9", {"L['x']": model}) is None


def test_the_module_a_callable_works_on_names_the_modules() -> None:
    model, other = _Owner(), _Owner()
    assert _owning_module(model) is model
    assert _owning_module(model.forward) is model  # bound method
    assert _owning_module(functools.partial(_Owner.forward, model)) is model
    assert _owning_module(lambda x: model(x) * 2) is model  # closure
    assert _owning_module(_closure_over(model.forward)) is model  # closure over a method
    assert _owning_module(lambda x: model(x) + other(x)) is None  # two: no one root
    assert _owning_module(print) is None


def test_unit_pattern() -> None:
    assert unit_pattern(["layers.1", "layers.2", "layers.3", "layers.5"]) == "layers.[1-3,5]"
    assert unit_pattern(["model.layers.0"]) == "model.layers.0"
    assert unit_pattern(["blocks.a", "blocks.b"]) == "blocks.[a,b]"
    assert unit_pattern(["a.0", "b.1"]) == "a.0, b.1"


# --- Dynamo's real paths, on the fake process group --------------------------------------------


class _Reduce(torch.nn.Module):
    """A linear layer whose output is all-reduced (a row-parallel projection)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return funcol.all_reduce(self.proj(x), "sum", dist.group.WORLD)


class _Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wo = _Reduce()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wo(x)


class _Holder:
    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def run(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)


class _Wrapped(torch.nn.Module):
    """Each child reaches its collective through another kind of wrapper."""

    def __init__(self) -> None:
        super().__init__()
        self.closure = _Attention()
        self.bound = _Attention()
        self.partial = _Attention()
        self.hooked = torch.nn.Linear(8, 8)
        self.by_hook = _Reduce()
        inner = self.closure.forward

        def forward_with_redistribution(*args: torch.Tensor) -> torch.Tensor:
            return inner(*args)  # what torchtitan's Module.parallelize installs

        self.closure.forward = forward_with_redistribution  # type: ignore[method-assign]
        self.bound.forward = _Holder(self.bound.wo).run  # type: ignore[method-assign]
        self.partial.forward = functools.partial(_Attention.forward, self.partial)  # type: ignore[method-assign]
        by_hook = self.by_hook
        self.hooked.register_forward_hook(lambda module, args, out: by_hook(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.closure(x) + self.bound(x) + self.partial(x) + self.hooked(x)


EXPECTED = ["closure.wo", "bound.wo", "partial.wo", "by_hook"]


def test_explain_names_modules_through_every_wrapper() -> None:
    with fake_world(0, 2):
        torch.manual_seed(0)
        model = _Wrapped()
        x = torch.randn(2, 8)
        report = explain(model, x)
    assert [c.module for c in report.collectives] == EXPECTED
    assert report.graph_count == 1 and report.collectives_per_call == 4
    text = str(report)
    for name in EXPECTED:
        assert f"  {name}\n" in text + "\n"
    assert "__closure__" not in text and "L[" not in text
