"""Collective-schedule check: ranks whose graphs would issue different collectives fail fast.

NCCL hangs when the ranks of a group disagree on the sequence of collectives (a different op,
shape, dtype or reduce op, or one rank missing a collective). Before a compiled graph first runs,
each rank publishes, for every group its graph uses, the fingerprint of its collective sequence
on that group in the c10d store, and reads its peers' fingerprints with a timeout. A mismatch
raises :class:`ScheduleMismatchError` on every rank that sees it, naming the first differing
collective and the ranks; a peer that never arrives (it compiled something else, or died) is an
error naming it when the timeout expires. Cost: one store write and one read per peer, per
group, per compiled graph, once.

Uses the private ``torch.distributed.distributed_c10d._get_default_store`` (guarded by
``tests/test_torch_internals.py``).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from torch_tensorrt_dist.backend.report import CollectiveInfo
from torch_tensorrt_dist.errors import ScheduleMismatchError
from torch_tensorrt_dist.runtime.store_exchange import PeersMissing, StoreExchange

__all__ = ["Schedule", "check_schedule", "first_difference", "schedule_of", "with_schedule_check"]

logger = logging.getLogger(__name__)

#: per group: the list of collective signatures, in graph order
Schedule = dict[tuple[int, ...], list[str]]

_KEY_PREFIX = "torch_tensorrt_dist/schedule"


def _signature(c: CollectiveInfo) -> str:
    reduce = f"({c.reduce_op})" if c.reduce_op else ""
    return f"{c.op}{reduce} {c.dtype}{list(c.shape)}"


def schedule_of(collectives: Sequence[CollectiveInfo]) -> Schedule:
    """Group the graph's collectives by group (ranks), keeping their order."""
    schedule: Schedule = {}
    for c in collectives:
        if len(c.group_ranks) > 1:
            schedule.setdefault(tuple(c.group_ranks), []).append(_signature(c))
    return schedule


def first_difference(mine: list[str], theirs: list[str]) -> tuple[int, str, str] | None:
    """``(index, my entry, their entry)`` of the first difference ("<none>" past an end)."""
    for i, (a, b) in enumerate(itertools.zip_longest(mine, theirs, fillvalue="<none>")):
        if a != b:
            return i, a, b
    return None


def check_schedule(
    schedule: Schedule,
    *,
    timeout_s: float,
    store: Any = None,
    rank: int | None = None,
) -> None:
    """Compare this rank's schedule with every peer's, group by group (raises on a mismatch)."""
    if not schedule:
        return
    for ranks in sorted(schedule):
        exchange = StoreExchange.next_round(store, _KEY_PREFIX, ranks, rank=rank)
        try:
            exchange.publish(schedule[ranks])
            _compare(exchange, ranks, schedule[ranks], timeout_s)
        except ScheduleMismatchError as exc:
            message = f"rank {exchange.rank}: {exc}"
            with contextlib.suppress(Exception):
                exchange.store.set(f"{exchange.base}/error", message)  # later peers fail too
            raise ScheduleMismatchError(message) from exc.__cause__
        except (RuntimeError, OSError) as exc:  # DistNetworkError, DistStoreError...
            raise ScheduleMismatchError(
                f"rank {exchange.rank}: could not reach the c10d store for the "
                f"collective-schedule check of group {list(ranks)} ({type(exc).__name__}: "
                f"{exc}); the rank that hosts it (usually rank 0) has probably failed or exited: "
                "look at its log"
            ) from exc
    logger.debug("collective schedule agreed with peers for %d group(s)", len(schedule))


def _compare(
    exchange: StoreExchange, ranks: tuple[int, ...], mine: list[str], timeout_s: float
) -> None:
    rank, store = exchange.rank, exchange.store
    round_ = exchange.base.rsplit("/", 1)[1]
    try:
        peers = exchange.gather([r for r in ranks if r != rank], timedelta(seconds=timeout_s))
    except PeersMissing as exc:
        cause = exc.__cause__
        raise ScheduleMismatchError(
            f"ranks {exc.missing} of group {list(ranks)} did not reach the "
            f"collective-schedule check #{round_} within {timeout_s:g} s: they compiled a "
            "different graph (different code path, inputs or recompilation), are much "
            "slower, or died. Look at their logs; raise schedule_timeout_s if they are only "
            f"slow ({type(cause).__name__}: {cause})"
        ) from cause
    if store.check([f"{exchange.base}/error"]):
        raise ScheduleMismatchError(
            f"a peer gave up on the collective-schedule check #{round_} of group "
            f"{list(ranks)}: {store.get(f'{exchange.base}/error').decode()}"
        )
    for peer, theirs in peers.items():
        diff = first_difference(mine, theirs)
        if diff is not None:
            i, a, b = diff
            raise ScheduleMismatchError(
                f"collective #{i} on group {list(ranks)} differs between rank {rank} ({a}) "
                f"and rank {peer} ({b}); running would hang or give wrong results. Rank "
                f"{rank} issues {len(mine)} collectives on this group, rank {peer} "
                f"{len(theirs)}. Give every rank the same input shapes and dtypes and the "
                "same code path"
            )


def with_schedule_check(
    run: Callable[..., Any], collectives: Sequence[CollectiveInfo], timeout_s: float
) -> Callable[..., Any]:
    """Wrap a boxed engine callable so the schedule is checked once, before its first run."""
    schedule = schedule_of(collectives)
    if not schedule or not dist.is_initialized() or dist.get_backend() == "fake":
        return run
    checked = threading.Event()

    def checked_run(args: list[Any]) -> Any:
        if not checked.is_set():
            check_schedule(schedule, timeout_s=timeout_s)
            checked.set()
        return run(args)

    checked_run._boxed_call = True  # type: ignore[attr-defined]
    return checked_run
