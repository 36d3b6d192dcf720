"""Real sharded models traced on the fake process group: one graph, typed collectives, the
sub-group's ranks, for world sizes 2..8 and 2-D meshes, in one CPU process."""

from __future__ import annotations

import argparse

import pytest
import torch

from torch_tensorrt_dist import explain
from torch_tensorrt_dist.backend.fake_world import fake_world
from torch_tensorrt_dist.cli.explain import BUILTIN_MODELS
from torch_tensorrt_dist.parallel import make_mesh

EXPECTED_OPS = {
    "mlp": ["all_reduce"],
    "funcol-mlp": ["all_reduce"],
    "mlp-sp": ["all_gather", "reduce_scatter"],
    "block": ["all_reduce", "all_reduce"],
    "all-to-all": ["all_to_all", "all_to_all"],
}

# (world size, tp, rank): 1-D meshes (tp = world) and 2-D (dp x tp, TP inner)
LAYOUTS = [(2, 2, 1), (4, 4, 2), (8, 8, 7), (4, 2, 3), (8, 4, 5), (8, 2, 6)]


def _args(**kw: object) -> argparse.Namespace:
    return argparse.Namespace(**{"dim": 64, "batch": 2, "seq": 16, **kw})


@pytest.mark.parametrize("model", sorted(EXPECTED_OPS))
@pytest.mark.parametrize(("world", "tp", "rank"), LAYOUTS)
def test_one_graph_with_typed_collectives_on_the_tp_group(
    model: str, world: int, tp: int, rank: int
) -> None:
    with fake_world(rank, world):
        mesh = make_mesh(tp=tp)
        torch.manual_seed(0)
        module, inputs = BUILTIN_MODELS[model][1](mesh["tp"], _args())
        report = explain(module, *inputs)
    first = rank // tp * tp
    assert report.graph_count == 1
    assert report.graph_breaks == []
    assert report.unfused == []
    assert [c.op for c in report.collectives] == EXPECTED_OPS[model]
    for c in report.collectives:
        assert list(c.group_ranks) == list(range(first, first + tp))
        assert c.dtype == "float32"
        assert c.bytes == 4 * torch.Size(c.shape).numel()


def test_dtype_and_bytes_follow_the_model() -> None:
    with fake_world(0, 2):
        mesh = make_mesh(tp=2)
        module, (x,) = BUILTIN_MODELS["mlp"][1](mesh["tp"], _args(batch=3))
        report = explain(module.to(torch.bfloat16), x.to(torch.bfloat16))
    (c,) = report.collectives
    assert (c.dtype, c.shape, c.bytes) == ("bfloat16", (3, 64), 3 * 64 * 2)


def test_graph_breaks_are_counted_with_reasons() -> None:
    with fake_world(1, 2):
        mesh = make_mesh(tp=2)
        module, (x,) = BUILTIN_MODELS["mlp"][1](mesh["tp"], _args())

        def with_break(t: torch.Tensor) -> torch.Tensor:
            y = module(t)
            torch._dynamo.graph_break()
            return module(y)

        report = explain(with_break, x)
    assert report.graph_count == 2
    assert len(report.graph_breaks) == 1
    assert "graph_break" in report.graph_breaks[0]
    assert [c.op for c in report.collectives] == ["all_reduce", "all_reduce"]
    assert "graph breaks: 1" in str(report)


def test_report_says_which_tensorrt_layer_each_collective_would_become() -> None:
    with fake_world(2, 4):
        mesh = make_mesh(tp=2)
        swap, (x,) = BUILTIN_MODELS["all-to-all"][1](mesh["tp"], _args())
        a2a = explain(swap, x)
        mlp, (y,) = BUILTIN_MODELS["mlp"][1](mesh["tp"], _args())
        ar = explain(mlp.to(torch.float16), y.to(torch.float16))
    assert [c.converts for c in ar.collectives] == ["native+plugin+torch_nccl"]
    assert all(c.converts == "native+torch_nccl" for c in a2a.collectives)
    reason = a2a.collectives[0].tensorrt["plugin"]
    assert reason is not None and "no all_to_all plugin" in reason
    assert "no TensorRT plugin layer: TensorRT-LLM has no all_to_all plugin" in str(a2a)
    assert a2a.as_dict()["collectives"][0]["tensorrt"]["native"] is None


def test_module_path_of_a_node_as_named_modules_spells_it() -> None:
    from torch import fx

    from torch_tensorrt_dist.backend.report import module_path

    node = fx.Graph().placeholder("x")
    assert module_path(node) == ""  # no module stack: issued by the top-level forward
    for dynamo_name, path in [
        ("L['self'].layers.3.attention", "layers.3.attention"),
        ("G['model'].tok_embeddings", "tok_embeddings"),
        ("L['model']", ""),
    ]:
        stack = {"outer": ("L['self']", object), "inner": (dynamo_name, object)}
        node.meta["nn_module_stack"] = stack  # outermost first: the innermost module counts
        assert module_path(node) == path
