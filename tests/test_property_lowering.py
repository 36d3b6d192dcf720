"""Property test: on random collective programs, the fused graph computes what the collectives
compute when completed at once, leaves no raw collective or wait, and is a fixed point."""

from __future__ import annotations

from torch_tensorrt_dist.testing import run_on_ranks

from . import _property


def test_random_programs_on_two_gloo_ranks() -> None:
    counts = run_on_ranks(_property.check_random_programs, 2, 40, timeout=240)
    assert counts == [40, 40]  # both ranks ran every example in lockstep
