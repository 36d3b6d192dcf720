"""The torchrun launch is quiet: what torchrun sets with a banner is set silently, and its
agent's loggers are silenced for the launch (restored after); the caller's signal handlers are
its own again when the launch returns."""

from __future__ import annotations

import logging
import os
import signal

import pytest

from torch_tensorrt_dist.runtime import launch
from torch_tensorrt_dist.runtime.torchrun_agent import quiet_agent, torchrun_env


def test_omp_threads_set_silently_only_when_unset_and_several_ranks() -> None:
    assert torchrun_env(2, {}, cores=16) == {"OMP_NUM_THREADS": "8"}  # each rank's share
    assert torchrun_env(2, {}, cores=1) == {"OMP_NUM_THREADS": "1"}  # never below 1
    assert torchrun_env(2, {"OMP_NUM_THREADS": "4"}, cores=16) == {}  # the user's choice
    assert torchrun_env(1, {}, cores=16) == {}


def test_agent_loggers_silenced_then_restored() -> None:
    import torch.distributed.run  # noqa: F401  (creates torchrun's loggers)

    run_logger = logging.getLogger("torch.distributed.run")
    before = run_logger.level
    with quiet_agent():
        assert not run_logger.isEnabledFor(logging.CRITICAL)
        assert not logging.getLogger("torch.distributed.elastic.agent").isEnabledFor(logging.ERROR)
    assert run_logger.level == before


def test_debug_logging_keeps_the_agent_loggers() -> None:
    ours = logging.getLogger("torch_tensorrt_dist.runtime.launcher")
    saved = ours.level
    ours.setLevel(logging.DEBUG)
    try:
        with quiet_agent():
            assert logging.getLogger("torch.distributed.run").isEnabledFor(logging.WARNING)
    finally:
        ours.setLevel(saved)


def test_launch_leaves_the_callers_signal_handlers() -> None:
    """torchelastic installs SIGTERM/SIGINT/SIGHUP/SIGQUIT handlers that raise its
    SignalException; after ``launch`` returns, the caller's are back (Ctrl-C is a
    KeyboardInterrupt again)."""

    def mine(signum: int, frame: object) -> None:
        raise AssertionError("not called")

    # Ctrl-C as an interactive Python has it: a shell's background job (`pytest ... &` without
    # job control) starts with SIGINT ignored, and that would be the caller's handler here
    saved_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGHUP)}
    saved = signal.signal(signal.SIGTERM, mine)
    try:
        result = launch(os.getpid, 1)
        assert result.ok and result.values[0] != os.getpid()  # it ran in a rank of its own
        assert signal.getsignal(signal.SIGTERM) is mine
        assert {sig: signal.getsignal(sig) for sig in before} == before
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGTERM, saved)
        signal.signal(signal.SIGINT, saved_int)
