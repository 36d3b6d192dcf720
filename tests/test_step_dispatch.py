"""The step's compiled code called directly (``generation/step_dispatch.py``): the same results
as Dynamo's path, and Dynamo's path wherever the direct call could be wrong."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from torch_tensorrt_dist.generation import step_dispatch
from torch_tensorrt_dist.generation.generate import Generator
from torch_tensorrt_dist.generation.step_dispatch import StepDispatch, shape_class
from torch_tensorrt_dist.models.llama import ModelArgs
from torch_tensorrt_dist.parallel.llama_load import random_llama


def _dispatch(
    route_key: Callable[[tuple[Tensor, ...]], object] = shape_class,
    version: Callable[[], int] = lambda: 0,
) -> tuple[StepDispatch, nn.Linear]:
    torch._dynamo.reset()
    lin = nn.Linear(4, 3)

    def step(*inputs: Tensor) -> Tensor:
        return lin(inputs[0]).relu()

    compiled = torch.compile(step, backend="eager", fullgraph=True)
    route = lambda inputs: (route_key(inputs), compiled)  # noqa: E731
    return StepDispatch(step, route, version=version), lin


def _class(dispatch: StepDispatch, rows: int, grad: bool = False, version: int = 0) -> Any:
    return dispatch.classes[(shape_class((_x(rows),)), grad, version)]


def _x(rows: int, tokens: int = 3) -> Tensor:
    x = torch.randn(rows, tokens, 4)
    if rows >= 2:
        torch._dynamo.mark_dynamic(x, 0, min=2, max=64)
    return x


def test_a_confirmed_class_is_called_directly_with_dynamos_results() -> None:
    dispatch, lin = _dispatch()
    with torch.no_grad():
        for rows in (2, 5, 3, 7, 4):
            x = _x(rows)
            torch.testing.assert_close(dispatch(x), lin(x).relu(), rtol=0, atol=0)
        c = _class(dispatch, 2)
        assert c.through_dynamo == step_dispatch.CONFIRM  # then directly: 3 calls
        assert dispatch.direct == [shape_class((_x(2),))]
        # the direct code reads the model's tensors at each call: a rebound weight is used
        lin.weight = nn.Parameter(torch.randn(3, 4))
        x = _x(6)
        torch.testing.assert_close(dispatch(x), lin(x).relu(), rtol=0, atol=0)


def test_direct_calls_skip_dynamos_guards_and_recheck_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(step_dispatch, "RECHECK", 4)
    dispatch, _ = _dispatch()
    seen: list[int] = []
    with torch.no_grad():
        for _ in range(12):
            dispatch(_x(3))
            seen.append(_class(dispatch, 3).through_dynamo)
    # two to confirm, then every fourth direct-path call goes through Dynamo again
    assert seen == [1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4]


def test_grad_mode_threads_and_version() -> None:
    """The grad mode and the model's version are part of a class (the no-grad class stays
    direct beside a grad-enabled call); a call under another global state (threads) goes
    through Dynamo."""
    version = [0]
    dispatch, lin = _dispatch(version=lambda: version[0])
    with torch.no_grad():
        for _ in range(3):
            dispatch(_x(2))
    dispatch(_x(2))  # grad enabled: its own class
    assert _class(dispatch, 2, grad=True).through_dynamo == 1
    assert _class(dispatch, 2).direct is not None
    before = _class(dispatch, 2).through_dynamo
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        with torch.no_grad():
            x = _x(2)
            torch.testing.assert_close(dispatch(x), lin(x).relu(), rtol=0, atol=0)
    finally:
        torch.set_num_threads(threads)
    assert _class(dispatch, 2).through_dynamo == before + 1
    version[0] = 1  # the model's pools set up again
    with torch.no_grad():
        dispatch(_x(2))
    assert _class(dispatch, 2, version=1).through_dynamo == 1


def test_a_class_that_compiles_twice_stays_on_dynamos_path(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One key for every shape: one row and several compile two codes (Dynamo specialises a
    size of 1), so the class is dropped and every later call goes through the guards. (Found
    while the class is confirmed, as here, or at a recheck: a route's key must tell apart
    what the guards do; ``shape_class`` tells one row and one token apart.)"""
    dispatch, lin = _dispatch(route_key=lambda inputs: "one key")
    with caplog.at_level(logging.WARNING), torch.no_grad():
        for rows in (2, 1, 3, 4, 1, 2):
            x = _x(rows)
            torch.testing.assert_close(dispatch(x), lin(x).relu(), rtol=0, atol=0)
    c = dispatch.classes[("one key", False, 0)]
    assert c.dropped and c.direct is None and dispatch.direct == []
    assert c.through_dynamo == 6
    assert "compiled a second time" in caplog.text


def test_the_generators_steps_run_directly_with_the_same_tokens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Generation through the direct calls gives the tokens of Dynamo's path (every call
    guarded), and every shape class the prompts reach ends up called directly."""
    args = ModelArgs.from_name("tiny")
    prompts = [[1, 5, 7, 9, 2], [3], [4, 4, 8], [6, 2, 9, 9, 1, 1, 3]]

    def tokens(guards: bool) -> tuple[list[list[int]], list[object]]:
        if guards:  # as a torch without Dynamo's bytecode hook: every call guarded
            monkeypatch.setattr(step_dispatch, "_hook", [None])
        else:
            monkeypatch.undo()
        torch._dynamo.reset()
        gen = Generator(random_llama(args, seed=2), engine="eager", max_batch_size=4, cache_len=64)
        out = gen.generate(prompts, max_new_tokens=12).tokens
        assert isinstance(gen.runner.step, StepDispatch)
        return out, gen.runner.step.direct

    guarded, none_direct = tokens(True)
    direct, classes = tokens(False)
    assert none_direct == []
    assert direct == guarded
    assert (2, True, False, 5) in classes  # the decode steps of several rows


def test_without_the_hook_every_call_goes_through_dynamo(monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch without Dynamo's bytecode hook (or the global-state guard): nothing is called
    directly, results unchanged."""
    monkeypatch.setattr(step_dispatch, "_hook", [None])
    dispatch, lin = _dispatch()
    assert not dispatch.enabled
    with torch.no_grad():
        for _ in range(4):
            x = _x(3)
            torch.testing.assert_close(dispatch(x), lin(x).relu(), rtol=0, atol=0)
    assert dispatch.direct == [] and _class(dispatch, 3).through_dynamo == 4
