"""A graph that holds weights as constants (the TensorRT engine's frozen weights) runs with the
weights of the module it is called for: Dynamo guards a parameter by its shape, not by which
tensor it is, so a second module of the same class passes the first one's guards
(``lowering/freeze_constants.drop_frozen``)."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
import torch

from torch_tensorrt_dist.lowering.freeze_constants import drop_frozen


def _boxed(tag: str, calls: list[tuple[str, int]]) -> Any:
    def fn(kept: list[Any]) -> str:
        calls.append((tag, len(kept)))
        return tag

    return fn


class _Rebuild:
    """A ``rebuild`` that records the inputs of each build; build ``n`` answers ``builtN``."""

    def __init__(self, calls: list[tuple[str, int]]) -> None:
        self.calls = calls
        self.builds: list[list[Any]] = []

    def __call__(self, args: list[Any]) -> Any:
        self.builds.append(args)
        return _boxed(f"built{len(self.builds)}", self.calls)


def test_the_held_tensors_run_the_graph_and_others_build_once_each():
    w1, w2, x = torch.ones(2), torch.zeros(2), torch.randn(2)
    calls: list[tuple[str, int]] = []
    rebuild = _Rebuild(calls)
    run = drop_frozen(_boxed("first", calls), [1], [w1, x], rebuild)
    assert run([w1, x]) == "first"
    assert run([w2, x]) == "built1"
    assert run([w1, x]) == "first" and run([w2, x]) == "built1"  # each kept, none built again
    assert len(rebuild.builds) == 1 and rebuild.builds[0][0] is w2
    assert calls == [("first", 1), ("built1", 1), ("first", 1), ("built1", 1)]
    args = [w1, x]
    run(args)
    assert args == []  # the boxed convention: the callee clears the list


def test_a_write_into_a_held_tensor_builds_again_after_each_write():
    w, x = torch.ones(2), torch.randn(2)
    rebuild = _Rebuild([])
    run = drop_frozen(_boxed("first", []), [1], [w, x], rebuild)
    assert run([w, x]) == "first"
    w.add_(1.0)  # load_state_dict's copy_ raises the version the same way
    assert run([w, x]) == "built1" and run([w, x]) == "built1"
    w.add_(1.0)
    assert run([w, x]) == "built2" and len(rebuild.builds) == 2
    assert len(run.builds) == 1  # the builds of older versions are gone


def test_a_build_runs_only_for_its_own_tensors_and_goes_with_them():
    """A build runs only for the very tensors it was built for: another tensor at their
    address with their shape, dtype and version (here a second view of the same storage; in
    life a new weight where a freed one was) builds again. A build whose tensor died is
    dropped, and keeps nothing alive."""
    base, x = torch.ones(2), torch.randn(2)
    w1, w2 = base.view(2), torch.zeros(2)
    calls: list[tuple[str, int]] = []
    rebuild = _Rebuild(calls)
    run = drop_frozen(_boxed("first", calls), [1], [w1, x], rebuild)
    assert run([w2, x]) == "built1"
    alias = base.view(2)  # w1's address, shape, dtype and version; not w1
    assert run([alias, x]) == "built2"
    assert run([w1, x]) == "first" and len(run.builds) == 3
    dead = weakref.ref(w2)
    del w2, rebuild.builds[0]  # the test's own reference to it
    gc.collect()
    assert dead() is None and len(run.builds) == 2


def test_inference_tensors_are_checked_by_identity_only():
    with torch.inference_mode():  # no version counter
        w, x = torch.ones(2), torch.randn(2)
    calls: list[tuple[str, int]] = []
    run = drop_frozen(_boxed("first", calls), [1], [w, x], lambda args: _boxed("again", calls))
    assert run([w, x]) == "first" and run([torch.zeros(2), x]) == "again"


def test_without_a_rebuild_other_weights_are_refused():
    w1, x = torch.ones(2), torch.randn(2)
    run = drop_frozen(_boxed("first", []), [1], [w1, x])
    assert run([w1, x]) == "first"
    with pytest.raises(RuntimeError, match="froze 1 weights as constants"):
        run([w1.clone(), x])
    w1.mul_(2.0)
    with pytest.raises(RuntimeError, match="new values in them"):
        run([w1, x])
