"""The HTTP process is a fork of rank 0; its request threads run tensor ops (a grammar's
check) at once. torch rebuilds its intra-op pool after a fork at the first use, and two
threads that get there together race ("Invalid thread pool!"); ``fresh_torch_pool`` rebuilds
it first, with one thread."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from torch_tensorrt_dist.serving.http_process import fresh_torch_pool

CHILDREN = 12


def _child_runs_threads(fresh: bool) -> bool:
    """Fork; in the child (after ``fresh_torch_pool`` when ``fresh``) four threads run tensor
    ops at once; whether every one of them succeeded."""
    pid = os.fork()
    if pid == 0:
        if fresh:
            fresh_torch_pool()
        errors: list[str] = []

        def work() -> None:
            try:
                a = torch.rand(4096) > 0.5
                (a & ~a).nonzero().flatten().tolist()
            except RuntimeError as exc:
                errors.append(str(exc))

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        os._exit(1 if errors else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the HTTP process is forked (Linux)")
def test_a_forked_child_s_threads_run_tensor_ops_together() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as a rank of serve runs (without fresh_torch_pool, about half
    try:  # of such children fail here)
        (torch.ones(1024) > 0).nonzero()  # the parent's pool in use before the fork
        assert all(_child_runs_threads(fresh=True) for _ in range(CHILDREN))
    finally:
        torch.set_num_threads(before)
