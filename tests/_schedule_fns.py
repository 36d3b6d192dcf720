"""Rank functions for the collective-schedule check tests."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import torch

import torch_tensorrt_dist  # noqa: F401
from torch_tensorrt_dist.models.toy import MLP
from torch_tensorrt_dist.parallel import make_mesh
from torch_tensorrt_dist.parallel.plans import FunctionalTPMLP


def _outcome(fn: Any) -> dict[str, Any]:
    start = time.monotonic()
    try:
        fn()
        result: dict[str, Any] = {"error": None}
    except Exception as exc:
        inner = getattr(exc, "inner_exception", None) or exc
        result = {"error": type(inner).__name__, "message": str(inner)}
    result["elapsed"] = time.monotonic() - start
    return result


def mismatched(rank: int, world: int, scenario: str, timeout_s: float) -> dict[str, Any]:
    """``shape``: rank 1 feeds a different batch; ``late``: rank 1 arrives after rank 0 timed out;
    ``same``: both agree (the check passes and the result is right)."""
    torch.manual_seed(0)
    full = MLP(16, 32)
    mesh = make_mesh(tp=world)
    model = FunctionalTPMLP(full, mesh["tp"])
    batch = 3 if (scenario == "shape" and rank == 1) else 2
    x = torch.randn(batch, 16)
    compiled = torch.compile(
        model,
        backend="torch_tensorrt_dist",
        options={"engine": "eager", "schedule_timeout_s": timeout_s},
    )

    store = torch.distributed.distributed_c10d._get_default_store()
    late = scenario == "late"

    def run() -> None:
        if late and rank == 1:  # arrives once rank 0 has given up (not after a fixed delay)
            store.wait(["rank-0-gave-up"], timedelta(seconds=120))
        try:
            with torch.no_grad():
                out = compiled(x)
                torch.testing.assert_close(out, full(x), rtol=1e-5, atol=1e-5)
        finally:
            if late and rank == 0:
                store.set("rank-0-gave-up", "1")

    return _outcome(run)
