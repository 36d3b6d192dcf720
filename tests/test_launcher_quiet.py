"""The torchrun launch is quiet: what torchrun sets with a banner is set silently, and its
agent's loggers are silenced for the launch (restored after)."""

from __future__ import annotations

import logging

from torch_tensorrt_dist.runtime.launcher import LaunchOptions, _quiet_torchrun, torchrun_env


def test_omp_threads_set_silently_only_when_unset_and_several_ranks() -> None:
    two = LaunchOptions(nproc_per_node=2)
    assert torchrun_env(two, {}) == {"OMP_NUM_THREADS": "1"}
    assert torchrun_env(two, {"OMP_NUM_THREADS": "4"}) == {}  # the user's choice stays
    assert torchrun_env(LaunchOptions(nproc_per_node=1), {}) == {}


def test_agent_loggers_silenced_then_restored() -> None:
    import torch.distributed.run  # noqa: F401  (creates torchrun's loggers)

    run_logger = logging.getLogger("torch.distributed.run")
    before = run_logger.level
    with _quiet_torchrun():
        assert not run_logger.isEnabledFor(logging.CRITICAL)
        assert not logging.getLogger("torch.distributed.elastic.agent").isEnabledFor(logging.ERROR)
    assert run_logger.level == before


def test_debug_logging_keeps_the_agent_loggers() -> None:
    ours = logging.getLogger("torch_tensorrt_dist.runtime.launcher")
    saved = ours.level
    ours.setLevel(logging.DEBUG)
    try:
        with _quiet_torchrun():
            assert logging.getLogger("torch.distributed.run").isEnabledFor(logging.WARNING)
    finally:
        ours.setLevel(saved)
