"""A graph that holds weights as constants (``cpu_gemm="template"`` / ``"auto"``, the TensorRT
engine's frozen weights) runs with the weights of the module it is called for: Dynamo guards a
parameter by its shape, not by which tensor it is, so a second module of the same class passes
the first one's guards (``lowering/freeze_constants.drop_frozen``)."""

from __future__ import annotations

import gc
import logging
import weakref
from typing import Any

import pytest
import torch
from torch._dynamo.utils import counters
from torch._guards import TracingContext

import torch_tensorrt_dist  # noqa: F401  (registers the backend)
import torch_tensorrt_dist.backend.backend as backend_module
from torch_tensorrt_dist.backend.backend import lower_graph
from torch_tensorrt_dist.generation import Generator
from torch_tensorrt_dist.lowering.freeze_constants import drop_frozen
from torch_tensorrt_dist.models.llama import ModelArgs, Transformer


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


def _mlp(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 32)
    ).eval()


@pytest.mark.parametrize("cpu_gemm", ["template", "auto"])
def test_two_modules_of_one_class_each_run_their_own_weights(cpu_gemm, caplog, monkeypatch):
    torch._dynamo.reset()
    counters.clear()
    first, second, x = _mlp(0), _mlp(1), torch.randn(4, 64)
    options = {"engine": "inductor", "cpu_gemm": cpu_gemm}
    contexts: list[Any] = []  # the tracing context each build lowers in

    def lower(*args: Any, **kwargs: Any) -> Any:
        contexts.append(TracingContext.try_get())
        return lower_graph(*args, **kwargs)

    monkeypatch.setattr(backend_module, "lower_graph", lower)
    a = torch.compile(first, backend="torch_tensorrt_dist", options=options)
    b = torch.compile(second, backend="torch_tensorrt_dist", options=options)
    with torch.no_grad(), caplog.at_level(logging.WARNING):
        want_a, want_b = first(x), second(x)
        torch.testing.assert_close(a(x), want_a, rtol=1e-5, atol=1e-5)
        built = counters["inductor"]["cpp_templated_kernel_counter"]
        assert built == 2  # both linears on the template
        torch.testing.assert_close(b(x), want_b, rtol=1e-5, atol=1e-5)
        assert counters["inductor"]["cpp_templated_kernel_counter"] == 2 * built  # built again
        for _ in range(2):  # alternating: each module's build kept
            torch.testing.assert_close(a(x), want_a, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(b(x), want_b, rtol=1e-5, atol=1e-5)
        assert counters["inductor"]["cpp_templated_kernel_counter"] == 2 * built
    assert sum("building it again" in r.getMessage() for r in caplog.records) == 1
    # the rebuild, inside a call, lowered in the first build's context (its fw_metadata)
    assert len(contexts) == 2 and contexts[0] is not None and contexts[1] is contexts[0]


@pytest.mark.parametrize("cpu_gemm", ["template", "auto"])
def test_two_generators_of_one_shape_give_each_models_tokens(cpu_gemm):
    """What showed it: a second generator of the same shapes with ``template`` gave the first
    model's tokens; with ``auto`` its decode steps did (its prefill, on ATen's graph, was
    right). ``template``'s steps also run through ``StepDispatch``'s direct calls."""
    args = ModelArgs(
        dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=96, intermediate_size=96,
        max_seq_len=32,
    )  # fmt: skip
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9]]
    torch._dynamo.reset()
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = Transformer(args).eval()
        want = Generator(model, max_batch_size=2, cache_len=32).generate(prompts, max_new_tokens=6)
        gen = Generator(model, engine="inductor", max_batch_size=2, cache_len=32, cpu_gemm=cpu_gemm)
        assert gen.generate(prompts, max_new_tokens=6).tokens == want.tokens, seed
