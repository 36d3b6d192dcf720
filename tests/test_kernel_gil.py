"""Inductor's CPU kernels compiled by our backend run without the interpreter lock
(``backend/kernel_gil.py``): another Python thread runs while one kernel does."""

from __future__ import annotations

import sys
import threading
import time

import pytest
import torch

import torch_tensorrt_dist  # noqa: F401  (registers the backend)
from torch_tensorrt_dist.backend import kernel_gil


def _work(x: torch.Tensor) -> torch.Tensor:
    # elementwise only: one fused C++ kernel of Inductor, no aten op (those release the GIL)
    for _ in range(8):
        x = torch.sin(x) * 1.0001 + torch.cos(x)
    return x


def _counted_while(fn, x: torch.Tensor) -> tuple[int, float]:
    """Iterations another Python thread made while ``fn(x)`` ran once, and how long it ran."""
    count, stop = [0], threading.Event()

    def spin() -> None:
        while not stop.is_set():
            count[0] += 1

    thread = threading.Thread(target=spin)
    thread.start()
    time.sleep(0.05)  # the spinning thread is running
    start_count = count[0]
    start = time.perf_counter()
    fn(x)
    elapsed = time.perf_counter() - start
    during = count[0] - start_count
    stop.set()
    thread.join()
    return during, elapsed


def _shares(compiled, x: torch.Tensor) -> list[float]:
    """How fast another thread counted while the kernel ran, over how fast it counts while
    this thread sleeps as long (1: the kernel never held it back; 0: it never ran), three
    times. A loaded machine moves each figure (the OS may stop either thread at any time), so
    the tests take the best of the three for what they expect."""
    compiled(x)  # compiled, and loaded
    shares = []
    for _ in range(3):
        during, elapsed = _counted_while(compiled, x)
        assert elapsed > 0.02, f"the kernel ran {elapsed * 1e3:.1f} ms: too short to tell"
        alone, slept = _counted_while(lambda _, s=elapsed: time.sleep(s), x)
        shares.append((during / elapsed) / (alone / slept))
    return shares


@pytest.fixture
def one_thread():
    """One intra-op thread, and a short switch interval: the main thread waits at most 0.1 ms
    for the GIL at the call's edges, so the spinning thread's count is the kernel's doing."""
    saved = torch.get_num_threads(), sys.getswitchinterval()
    torch.set_num_threads(1)
    sys.setswitchinterval(1e-4)
    yield
    torch.set_num_threads(saved[0])
    sys.setswitchinterval(saved[1])


def test_this_torch_has_the_bindings_it_changes():
    assert kernel_gil.released(), "torch's kernel bindings changed: kernel_gil.py needs a look"


def test_another_thread_runs_while_a_compiled_kernel_does(one_thread):
    x = torch.randn(4_000_000)
    torch._dynamo.reset()
    ours = torch.compile(_work, backend="torch_tensorrt_dist", options={"engine": "inductor"})
    assert max(_shares(ours, x)) > 0.4


def test_plain_inductor_kernels_keep_the_gil(one_thread):
    """The control: the same kernel compiled by torch's own backend holds the GIL (so the test
    above measures the change, not the machine), and our compile left torch's bindings as
    they were."""
    x = torch.randn(4_000_000)
    torch._dynamo.reset()
    ours = torch.compile(_work, backend="torch_tensorrt_dist", options={"engine": "inductor"})
    ours(x)
    torch._dynamo.reset()
    theirs = torch.compile(_work, backend="inductor")
    assert min(_shares(theirs, x)) < 0.1


def test_unknown_bindings_are_left_alone(monkeypatch):
    from torch._inductor.codecache import CppPythonBindingsCodeCache as cls

    monkeypatch.setattr(cls, "call_entry_function", "something_else({});")
    assert not kernel_gil.released()
    with kernel_gil.kernels_release_gil() as changed:
        assert changed is False
        assert cls.call_entry_function == "something_else({});"
    assert cls.call_entry_function == "something_else({});"


def test_the_change_lasts_for_the_block_only():
    from torch._inductor.codecache import CppPythonBindingsCodeCache as cls

    before = cls.call_entry_function, cls.extra_parse_arg
    with kernel_gil.kernels_release_gil() as changed:
        assert changed is True
        assert cls.call_entry_function == kernel_gil.CALL
        with kernel_gil.kernels_release_gil():  # nested: the same thread again
            assert cls.call_entry_function == kernel_gil.CALL
        assert cls.call_entry_function == kernel_gil.CALL
    assert (cls.call_entry_function, cls.extra_parse_arg) == before
    with pytest.raises(RuntimeError), kernel_gil.kernels_release_gil():
        raise RuntimeError("a failed compile")
    assert (cls.call_entry_function, cls.extra_parse_arg) == before


def test_the_step_loops_switch_interval_follows_the_kernels(monkeypatch):
    from torch_tensorrt_dist.serving import interpreter

    assert interpreter.switch_interval("inductor") == interpreter.GIL_SWITCH_S
    assert interpreter.switch_interval("eager") == interpreter.GIL_SWITCH_S  # aten ops release it
    monkeypatch.setattr(kernel_gil, "released", lambda: False)
    assert interpreter.switch_interval("inductor") == interpreter.GIL_SWITCH_HELD_S
    assert interpreter.switch_interval("tensorrt") == interpreter.GIL_SWITCH_S
    assert interpreter.GIL_SWITCH_S < interpreter.GIL_SWITCH_HELD_S
