"""One verdict for every rank: a step each rank does on its own (check its files, load its
shard, write its part) succeeds everywhere before any rank goes on to a collective.

    failure = None
    try:
        check_my_files()
    except Exception as exc:          # this rank's refusal, or any error
        failure = exc
    agree(failure, step="the artifact check")   # on every rank of the world

    with agreed("loading the checkpoint"):      # the same, as a block
        model = load_my_shard()

Each rank publishes its verdict (None, or its error in one line) in the c10d store and reads
every other rank's. When all passed, ``agree`` returns. When a rank failed, every rank raises:
the failed rank its own error, the others :class:`RankFailedError` naming that rank and quoting
its error, so no rank runs on alone into a collective that would hang, and every rank exits
with the same message. Launchers report the rank that failed (``RankFailedError.failed_rank``),
not the ranks that stopped after it.

Nothing is exchanged in a single process (or before ``torch.distributed`` is initialised): the
failure, if any, is raised as it is.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from torch_tensorrt_dist.errors import DistributedSetupError, RankFailedError
from torch_tensorrt_dist.runtime._rank_entry import one_line
from torch_tensorrt_dist.runtime.store_exchange import StoreExchange
from torch_tensorrt_dist.runtime.timeouts import configured_timeout, resolve_timeout

__all__ = ["agree", "agreed"]

logger = logging.getLogger(__name__)

_KEY_PREFIX = "torchtrt_dist/agree"


def _timeout() -> timedelta:
    return configured_timeout() or resolve_timeout(None, os.environ)


def agree(
    failure: BaseException | None,
    *,
    step: str,
    timeout: timedelta | None = None,
    store: Any = None,
    rank: int | None = None,
    world_size: int | None = None,
) -> None:
    """Raise on every rank if ``step`` failed on any rank (see the module docstring).

    Call it on every rank of the world, with the same ``step``, in the same order. ``failure``
    is this rank's error (None: passed); it is raised again, unchanged, after the exchange.
    ``store``, ``rank`` and ``world_size`` default to the default process group's.
    """
    if store is None and not dist.is_initialized():
        if failure is not None:
            raise failure
        return
    exchange = StoreExchange.next_round(store, _KEY_PREFIX, step, rank=rank)
    rank, store = exchange.rank, exchange.store
    world = dist.get_world_size() if world_size is None else world_size
    limit = timeout or _timeout()
    base = exchange.base
    mine = None if failure is None else one_line(failure)
    try:
        exchange.publish({"failure": mine})
        verdicts = {r: v["failure"] for r, v in exchange.gather(range(world), limit).items()}
        failed = {r: v for r, v in verdicts.items() if v is not None}
        if failed:
            # every rank reads every verdict before any leaves: rank 0 may host the store
            if store.add(f"{base}/read", 1) == world:
                store.set(f"{base}/all-read", "1")
            store.wait([f"{base}/all-read"], limit)
    except (RuntimeError, OSError) as exc:  # DistStoreError, DistNetworkError, a timeout
        if failure is not None:
            raise failure from None
        lost = DistributedSetupError(
            f"rank {rank}: could not learn the other ranks' verdicts on {step} through the c10d "
            f"store within {limit.total_seconds():g} s ({one_line(exc)}); a rank has probably "
            "failed or exited before it: its error is the cause"
        )
        lost.peer_lost = True  # type: ignore[attr-defined]  # launchers look for that rank
        raise lost from exc
    if failure is not None:
        raise failure
    if failed:
        first = min(failed)
        others = sorted(set(failed) - {first})
        also = f" (ranks {others} failed too)" if others else ""
        logger.debug("rank %d: rank %d failed %s: %s", rank, first, step, failed[first])
        raise RankFailedError(
            f"rank {first} failed {step}{also}: {failed[first]}", failed_rank=first
        )


@contextmanager
def agreed(step: str, *, timeout: timedelta | None = None) -> Iterator[None]:
    """Run the block, then :func:`agree` on its outcome (an ``Exception`` it raised, or None)."""
    failure: Exception | None = None
    try:
        yield
    except Exception as exc:  # this rank's error: every rank learns it, then it is raised again
        failure = exc
    agree(failure, step=step, timeout=timeout)
