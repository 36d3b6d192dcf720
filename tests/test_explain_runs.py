"""``explain`` counts what runs: each graph's runs per call, per-block compile, collectives
outside the graphs, against what the uncompiled model issues; ``compile_blocks``."""

from __future__ import annotations

import types

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.autograd.profiler_legacy import profile

import torch_tensorrt_dist
from torch_tensorrt_dist import ConfigError, compile_blocks, explain
from torch_tensorrt_dist.backend.collective_events import (
    is_collective,
    outermost_collectives,
    untyped,
)
from torch_tensorrt_dist.backend.fake_world import fake_world

# --- pure: which profiler events are collectives that ran -------------------------------------


def _event(name: str, parent: object = None, shapes: object = ()) -> types.SimpleNamespace:
    return types.SimpleNamespace(name=name, cpu_parent=parent, input_shapes=shapes)


def test_outermost_collectives_only_and_never_waits() -> None:
    typed = _event("tensorrt_dist::all_reduce", shapes=[[4, 8], [], [], []])
    inner = _event("_c10d_functional::all_reduce", typed, [[4, 8], [], []])
    events = [
        typed,
        inner,
        _event("c10d::allreduce_", inner),  # nested twice: the typed op's own
        _event("_c10d_functional::wait_tensor", None, [[4, 8]]),
        _event("c10d::allreduce_", _event("aten::linear"), [[], [], []]),  # eager, in a module
        _event("_c10d_functional::all_gather_into_tensor", None, [[2, 8], [], []]),
        _event("_c10d_functional::all_gather_into_tensor", None, [[2, 8], [], []]),
        _event("c10d::_reduce_scatter_base_", None, [[1, 8], [2, 8], [], [], []]),  # (out, in)
        _event("c10d::barrier"),
        _event("aten::mm"),
    ]
    assert [e.name for e in outermost_collectives(events)] == [
        "tensorrt_dist::all_reduce",
        "c10d::allreduce_",
        "_c10d_functional::all_gather_into_tensor",
        "_c10d_functional::all_gather_into_tensor",
        "c10d::_reduce_scatter_base_",
    ]
    outside = untyped(events)
    assert [(c.kind, c.shape, c.count) for c in outside] == [
        ("all_reduce", None, 1),
        ("all_gather", (2, 8), 2),
        ("reduce_scatter", (2, 8), 1),  # the tensor sent, not the output
    ]
    assert not is_collective("_c10d_functional::wait_tensor") and not is_collective("aten::mm")


# --- a model of blocks, on the fake process group ---------------------------------------------


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wo = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + funcol.all_reduce(self.wo(x), "sum", dist.group.WORLD)


class _Stack(torch.nn.Module):
    """An eager collective before the blocks (a vocab-parallel embedding's), then 3 blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(8, 8)
        self.layers = torch.nn.ModuleList(_Block() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        dist.all_reduce(h)  # in-place c10d, as spmd_types and HF's TP hooks issue them
        for layer in self.layers:
            h = layer(h)
        return h


def _uncompiled_collectives(model: torch.nn.Module, x: torch.Tensor) -> int:
    with torch.no_grad(), profile() as prof:
        model(x)
    return len(outermost_collectives(prof.function_events))


def test_whole_and_per_block_count_what_the_uncompiled_model_runs() -> None:
    with fake_world(1, 2):
        torch.manual_seed(0)
        model, x = _Stack(), torch.randn(2, 8)
        expected = _uncompiled_collectives(model, x)
        whole = explain(model, x)
        assert compile_blocks(model, options={"engine": "eager"}) == [
            "layers.0",
            "layers.1",
            "layers.2",
        ]
        per_block = explain(model, x)
        with torch.no_grad():
            torch.testing.assert_close(model(x), torch.compile(model, backend="eager")(x))
        assert model.layers[0]._compiled_call_impl is not None  # explain put the user's back
    assert expected == 4
    assert (whole.graph_count, whole.collectives_per_call, whole.compile_units) == (1, 4, [])
    assert [(g.runs, g.units) for g in whole.graphs] == [(1, {"": 1})]
    assert [c.module for c in whole.collectives] == ["", "layers.0", "layers.1", "layers.2"]
    assert whole.outside_graphs == []
    assert "graph 0 runs" not in str(whole)

    assert per_block.compile_units == ["layers.0", "layers.1", "layers.2"]
    assert per_block.graph_count == 1 and per_block.graph_breaks == []
    (graph,) = per_block.graphs
    assert graph.runs == 3 and graph.units == {"layers.0": 1, "layers.1": 1, "layers.2": 1}
    assert len(per_block.collectives) == 1  # listed once ...
    assert per_block.collectives_per_call == expected  # ... counted as it runs
    outside = per_block.outside_graphs
    assert outside is not None and [(c.kind, c.count) for c in outside] == [("all_reduce", 1)]
    assert per_block.bytes_per_call == 3 * per_block.collectives[0].bytes
    text = str(per_block)
    summary = text.splitlines()[1]
    assert "graphs: 1 for 3 blocks compiled one by one" in summary
    assert "graph 0 runs 3x per call: one graph reused by layers.[0-2]" in summary
    assert "collectives: 4 per call (1 listed: each graph once; 1 outside graphs)" in summary
    assert text.splitlines()[-2].endswith("layers.[0-2]")  # the one row of the table
    assert "outside graphs: all_reduce x1 per call (c10d::allreduce_)" in text
    data = per_block.as_dict()
    assert data["collectives_per_call"] == 4 and data["graphs"][0]["runs"] == 3


def test_compile_blocks_errors_name_the_fix() -> None:
    model = _Stack()
    with pytest.raises(ConfigError, match=r"_Stack has no submodule 'blocks'; pass blocks="):
        compile_blocks(model, blocks="blocks")
    with pytest.raises(ConfigError, match=r"'embed' \(Linear\) has no child modules"):
        compile_blocks(model, blocks="embed")
    with pytest.raises(ConfigError, match="unknown torch_tensorrt_dist option 'engin'"):
        compile_blocks(model, options={"engin": "eager"})
    assert model.layers[0]._compiled_call_impl is None  # nothing compiled on an error
    assert torch_tensorrt_dist.compile_blocks is compile_blocks


class _Counting(torch.nn.Module):
    """Its output depends on a Python int it increments: Dynamo specialises on the int, so
    every call compiles a new graph."""

    def __init__(self) -> None:
        super().__init__()
        self.step = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.step += 1
        return funcol.all_reduce(x * self.step, "sum", dist.group.WORLD)


def test_a_graph_compiled_again_on_the_counted_call_is_said_and_counted() -> None:
    with fake_world(0, 2):
        report = explain(_Counting(), torch.randn(2, 8))
    assert report.graph_count == 2
    assert [g.runs for g in report.graphs] == [0, 1]  # the counted call ran the new graph
    assert report.graph_breaks == ["1 graph(s) recompiled on the second call"]
    assert report.collectives_per_call == 1


class _HandWritten(torch.nn.Module):
    """The ways hand-written TP code issues a collective."""

    def __init__(self, form: str) -> None:
        super().__init__()
        self.linear, self.form = torch.nn.Linear(8, 8), form

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        if self.form == "ranks":  # a group given as its list of ranks
            return funcol.all_reduce(y, "sum", [0, 1, 2, 3])
        if self.form == "gather":
            return funcol.all_gather_tensor(y, 0, dist.group.WORLD)
        if self.form == "in_place":  # Dynamo rewrites it to the functional form
            dist.all_reduce(y)
            return y
        work = dist.all_reduce(y, async_op=True)  # a Work object: Dynamo breaks the graph
        assert work is not None
        work.wait()
        return y


def test_hand_written_collectives_in_the_graph_and_an_async_one_outside() -> None:
    with fake_world(1, 4):
        x = torch.randn(2, 8)
        reports = {f: explain(_HandWritten(f), x) for f in ("ranks", "gather", "in_place", "async")}
    for form in ("ranks", "gather", "in_place"):
        report = reports[form]
        assert (report.graph_count, report.graph_breaks, report.outside_graphs) == (1, [], [])
        (c,) = report.collectives
        assert c.op == ("all_gather" if form == "gather" else "all_reduce")
        assert c.group_ranks == (0, 1, 2, 3)
    async_ = reports["async"]
    assert async_.collectives == [] and len(async_.graph_breaks) == 2
    assert async_.outside_graphs is not None
    assert [(c.op, c.count) for c in async_.outside_graphs] == [("c10d::allreduce_", 1)]
    assert async_.collectives_per_call == 1
    assert "outside graphs: all_reduce x1 per call (c10d::allreduce_)" in str(async_)
