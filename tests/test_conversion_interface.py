"""Every collective implementation against the interface (``conversion/interface.py``), and a
fourth one registered beside the three: the core must take it with no other change."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import fx

import torch_tensorrt_dist  # registers torch.ops.tensorrt_dist
from torch_tensorrt_dist.conversion import impl as registry
from torch_tensorrt_dist.conversion.capability import conversion_decision, node_decision
from torch_tensorrt_dist.conversion.choice import REQUESTABLE_IMPLS, choose, select_impl
from torch_tensorrt_dist.conversion.converters import make_validator
from torch_tensorrt_dist.conversion.impl import IMPLEMENTATIONS
from torch_tensorrt_dist.conversion.interface import (
    CollectiveImpl,
    CollectiveQuery,
    Decision,
    PluginSpec,
)
from torch_tensorrt_dist.conversion.node_args import CollectiveCall
from torch_tensorrt_dist.conversion.table import COLLECTIVES
from torch_tensorrt_dist.errors import UnsupportedCollectiveError

IMPL_DIR = Path(torch_tensorrt_dist.__file__).parent / "conversion" / "impl"
ATTRIBUTES = {"name": str, "label": str, "description": str, "one_communicator_per_engine": bool}
METHODS = sorted(
    n for n, v in vars(CollectiveImpl).items() if callable(v) and not n.startswith("_")
)


def _shape(fn: Any) -> list[tuple[str, Any]]:
    return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()]


def interface_problems(impl: object) -> list[str]:
    """What ``impl`` lacks of :class:`CollectiveImpl` (attributes, methods and their
    parameters), as one line each."""
    problems = []
    for attr, kind in ATTRIBUTES.items():
        if not isinstance(getattr(impl, attr, None), kind):
            problems.append(f"{attr}: not a {kind.__name__}")
    for method in METHODS:
        ours = getattr(type(impl), method, None)
        if not callable(ours):
            problems.append(f"{method}: missing")
        elif _shape(ours) != _shape(getattr(CollectiveImpl, method)):
            problems.append(f"{method}{inspect.signature(ours)}: not the interface's parameters")
    return problems


def test_the_interface_is_what_the_docs_list() -> None:
    assert set(ATTRIBUTES) == set(CollectiveImpl.__annotations__)
    assert METHODS == [
        "auto_rank",
        "check_launch",
        "decide",
        "emit",
        "facts",
        "install",
        "missing",
        "prepare",
        "spec",
    ]


@pytest.mark.parametrize("impl", IMPLEMENTATIONS, ids=lambda i: i.name)
def test_every_implementation_provides_the_whole_interface(impl: CollectiveImpl) -> None:
    assert interface_problems(impl) == []
    folder = IMPL_DIR / type(impl).__module__.rsplit(".", 1)[-1]
    assert sorted(
        p.name
        for p in folder.glob("*.py")
        if p.stem in ("__init__", "rules", "spec", "availability", "emitter")
    ) == ["__init__.py", "availability.py", "emitter.py", "rules.py", "spec.py"]
    reason = impl.missing()  # no TensorRT here: a reason; never an exception
    assert reason is None or (isinstance(reason, str) and reason)


def test_an_implementation_missing_a_part_is_caught() -> None:
    class Partial:  # no emit, a spec of another shape, no description
        name, label, one_communicator_per_engine = "partial", "partial", False

        def spec(self, call: CollectiveCall) -> None: ...

    problems = interface_problems(Partial())
    assert "description: not a str" in problems
    assert "emit: missing" in problems
    assert any(p.startswith("spec(self, call: 'CollectiveCall')") for p in problems)


def test_names_and_auto_ranks_are_distinct_and_listed_everywhere() -> None:
    import argparse

    from torch_tensorrt_dist.backend.settings import COLLECTIVE_IMPLS
    from torch_tensorrt_dist.cli import build_parser

    names = [i.name for i in IMPLEMENTATIONS]
    assert REQUESTABLE_IMPLS == ("auto", *names) == COLLECTIVE_IMPLS
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    explain = commands.choices["explain"]
    choices = next(a.choices for a in explain._actions if a.dest == "collective_impl")
    assert tuple(choices or ()) == REQUESTABLE_IMPLS
    for one_group in (True, False):
        ranks = [i.auto_rank(one_group=one_group) for i in IMPLEMENTATIONS]
        assert len(set(ranks)) == len(ranks)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS, ids=lambda i: i.name)
@pytest.mark.parametrize("op", list(COLLECTIVES))
@pytest.mark.parametrize("dtype", [torch.float16, torch.int64])
def test_spec_agrees_with_decide_for_every_collective(
    impl: CollectiveImpl, op: str, dtype: torch.dtype
) -> None:
    row = COLLECTIVES[op]
    call = CollectiveCall(
        op=op,
        group_ranks=(2, 3),
        group_name="tp",
        reduce_op="sum" if row.reduces else None,
        src=1 if row.rooted else None,
        dtype=dtype,
        dim0=4,
    )
    facts = impl.facts(None)
    decision = conversion_decision(
        op,
        dtype,
        [2, 3],
        impl=impl.name,
        reduce_op=call.reduce_op,
        src=call.src,
        dim0=4,
        **facts,
    )
    assert isinstance(decision, Decision) and decision.reason
    if decision.convertible:
        assert impl.spec(call, dtype, **facts) is not None
    else:
        with pytest.raises(UnsupportedCollectiveError) as info:
            impl.spec(call, dtype, **facts)
        assert decision.reason.split(";")[0] in str(info.value)


class OneShot:
    """A fourth implementation, as a new folder would add it: fp16 sum all_reduce only."""

    name = "oneshot"
    label = "one-shot all-reduce"
    description = "our one-shot all-reduce"
    one_communicator_per_engine = False

    def __init__(self, missing: str | None) -> None:
        self._missing = missing

    def auto_rank(self, *, one_group: bool) -> int:
        return 5

    def missing(self, plugin_path: str | None = None) -> str | None:
        return self._missing

    def facts(self, engine_ranks: Sequence[int] | None) -> dict[str, Any]:
        return {}

    def decide(self, query: CollectiveQuery) -> Decision:
        if query.op != "all_reduce" or query.dtype != torch.float16:
            return Decision(False, f"the one-shot all-reduce does not do {query.op}")
        return Decision(True, f"one-shot all-reduce over ranks {query.ranks}")

    def spec(self, call: CollectiveCall, dtype: torch.dtype, **facts: Any) -> PluginSpec:
        return PluginSpec("OneShot", "1", "test", {"group": np.asarray(call.group_ranks)})

    def check_launch(self, groups: Sequence[Sequence[int]]) -> None:
        return None

    def install(self) -> None:
        return None

    def prepare(self, calls: Sequence[CollectiveCall], plugin_path: str | None) -> None:
        return None

    def emit(
        self, trt: Any, ctx: Any, x: Any, call: CollectiveCall, dtype: torch.dtype, name: str
    ) -> Any:
        raise NotImplementedError("no TensorRT here")


def _node(op: str, *args: Any) -> tuple[fx.GraphModule, fx.Node]:
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(8, 4, dtype=torch.float16)
    node = graph.call_function(getattr(torch.ops.tensorrt_dist, op).default, (x, *args))
    graph.output(node)
    return fx.GraphModule(torch.nn.Module(), graph), node


def test_a_fourth_implementation_is_one_registration(monkeypatch: pytest.MonkeyPatch) -> None:
    usable = OneShot(None)
    assert interface_problems(usable) == []
    monkeypatch.setattr(registry, "IMPLEMENTATIONS", (*IMPLEMENTATIONS, usable))
    # its rules behind the shared checks
    assert conversion_decision("all_reduce", "fp16", [0, 1], impl="oneshot") == (
        True,
        "one-shot all-reduce over ranks [0, 1]",
    )
    assert not conversion_decision("all_gather", "fp16", [0, 1], impl="oneshot").convertible
    assert conversion_decision("all_reduce", "fp16", [0, 0], impl="oneshot") == (
        False,
        "group ranks [0, 0] repeat a rank",
    )
    # auto's order: its rank (5) puts it first; the others' reasons quote it
    assert select_impl("auto", oneshot_missing=None, native_missing=None) == (
        "oneshot",
        "our one-shot all-reduce is available (auto)",
    )
    assert select_impl("auto", oneshot_missing="no NVLink", native_missing=None) == (
        "native",
        "TensorRT DistCollective (auto; one-shot all-reduce: no NVLink)",
    )
    assert choose("oneshot", lambda impl: "not built").reason == (
        "collective_impl='oneshot' was requested but not built"
    )
    nothing = choose("auto", lambda impl: f"{impl.name} absent")
    assert nothing.reason.endswith(
        "; torch_nccl: torch_nccl absent; one-shot all-reduce: oneshot absent"
    )
    # the validators and explain's TensorRT column take it, this process choosing it (auto)
    gm, node = _node("all_reduce", "sum", "tp", [0, 1])
    assert make_validator("oneshot")(node, None) is True
    assert make_validator("native")(node, None) is False
    assert node_decision(node, "oneshot").convertible
    from torch_tensorrt_dist.backend.report import collectives_in

    column = collectives_in(gm)[0].tensorrt
    assert list(column) == ["native", "plugin", "torch_nccl", "oneshot"]
    assert column["oneshot"] is None and column["plugin"] is None
