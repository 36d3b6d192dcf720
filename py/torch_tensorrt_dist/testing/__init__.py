"""Helpers for tests of this package and of code built on it (multi-rank runs on CPU)."""

from torch_tensorrt_dist.testing.multiprocess import RankFailure, free_port, run_on_ranks

__all__ = ["RankFailure", "free_port", "run_on_ranks"]
