"""The compiled step's Dynamo settings (``runner.compile_step``), each set for its calls only:
guards built to skip a module subtree whose dicts have not changed, without the flag leaking to
other compiles, and still failing for a rebound weight; a recompile limit that holds every
shape class."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn
from torch._dynamo import config as dynamo_config
from torch._dynamo.utils import counters

from torch_tensorrt_dist.generation.runner import (
    compile_step,
    decode_example,
    paged_step,
    setup_example,
)
from torch_tensorrt_dist.models.llama import ModelArgs, Transformer

ARGS = ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=128, vocab_size=96)


def _model() -> Transformer:
    torch.manual_seed(0)
    model = Transformer(ARGS).eval()
    setup_example(model, 1, 64)
    return model


def test_the_flag_holds_for_the_call_only_and_a_rebound_weight_is_seen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torch._dynamo.guards import GuardManagerWrapper

    searched: list[object] = []  # Dynamo looks for tag-safe subtrees only with the flag on
    find = GuardManagerWrapper.find_tag_safe_roots
    monkeypatch.setattr(
        GuardManagerWrapper,
        "find_tag_safe_roots",
        lambda self: (searched.append(self), find(self))[1],
    )
    torch._dynamo.reset()
    model = _model()
    reference = _model()  # the same weights, run in plain PyTorch
    inputs = decode_example(1)
    step, eager = compile_step(paged_step(model), "eager"), paged_step(reference)
    with torch.no_grad():
        torch.testing.assert_close(step(*inputs), eager(*inputs))
        assert searched  # the graph's guards were built with the flag on
        assert dynamo_config.use_recursive_dict_tags_for_guards is False  # not left on
        frames = counters["stats"]["unique_graphs"]
        step(*inputs)
        assert counters["stats"]["unique_graphs"] == frames  # the guards pass: no recompile

        # a weight rebound to another tensor (the module's dict changes): the call sees it
        new = torch.randn_like(model.layers[0].attention.wq.weight)
        model.layers[0].attention.wq.weight = nn.Parameter(new)
        reference.layers[0].attention.wq.weight = nn.Parameter(new.clone())
        torch.testing.assert_close(step(*inputs), eager(*inputs))

        # rebound to another dtype: the guard fails and the step recompiles
        model.layers[1].feed_forward.w2.weight = nn.Parameter(
            model.layers[1].feed_forward.w2.weight.double()
        )
        before = counters["stats"]["unique_graphs"]
        with contextlib.suppress(RuntimeError):  # a mixed-dtype matmul may refuse
            step(*inputs)
        assert counters["stats"]["unique_graphs"] > before
    torch._dynamo.reset()


def test_the_step_keeps_more_graphs_than_dynamos_limit_without_raising_it() -> None:
    """A step compiles each of its shape classes (two forms of up to four over one function)
    past Dynamo's default ``recompile_limit`` (8) instead of falling back to eager, while the
    global limit stays what it was (set for each call of the step only)."""
    limit = dynamo_config.recompile_limit
    assert limit < 12  # the default, as the case needs

    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1

    torch._dynamo.reset()
    counters.clear()
    step = compile_step(double, "eager")
    with dynamo_config.patch(automatic_dynamic_shapes=False):  # a graph per shape
        for n in range(2, 14):
            assert torch.equal(step(torch.ones(n)), torch.full((n,), 3.0))
    assert counters["stats"]["unique_graphs"] == 12
    assert dynamo_config.recompile_limit == limit


def test_every_compiled_step_keeps_its_own_graphs_past_the_limit_of_one() -> None:
    """Steps compiled from one function's closures, each over its own module (as every
    generator's ``paged_step``): more of them than the recompile limit all compile and give
    their module's result, in one process; each compiled step counts its own graphs only."""
    from torch_tensorrt_dist.generation.runner import RECOMPILE_LIMIT

    def make(module: nn.Module):  # paged_step's shape: one code object, a closure a module
        def step(x: torch.Tensor) -> torch.Tensor:
            return module(x)

        return step

    torch._dynamo.reset()
    counters.clear()
    x = torch.randn(2, 4)
    for i in range(RECOMPILE_LIMIT + 2):
        torch.manual_seed(i)
        module = nn.Linear(4, 3)
        with torch.no_grad():
            assert torch.equal(compile_step(make(module), "eager")(x), module(x))
    assert counters["stats"]["unique_graphs"] == RECOMPILE_LIMIT + 2
    torch._dynamo.reset()
