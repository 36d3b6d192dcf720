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
import json
import logging
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from torch_tensorrt_dist.backend.report import CollectiveInfo
from torch_tensorrt_dist.errors import ScheduleMismatchError

__all__ = ["Schedule", "check_schedule", "first_difference", "schedule_of", "with_schedule_check"]

logger = logging.getLogger(__name__)

#: per group: the list of collective signatures, in graph order
Schedule = dict[tuple[int, ...], list[str]]

_KEY_PREFIX = "torch_tensorrt_dist/schedule"
_lock = threading.Lock()
_rounds: Counter[tuple[int, ...]] = Counter()  # checks made per group in this process


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
    store = store if store is not None else dist.distributed_c10d._get_default_store()
    rank = dist.get_rank() if rank is None else rank
    for ranks in sorted(schedule):
        with _lock:
            round_ = _rounds[ranks]
            _rounds[ranks] += 1
        base = f"{_KEY_PREFIX}/{'-'.join(map(str, ranks))}/{round_}"
        try:
            store.set(f"{base}/{rank}", json.dumps(schedule[ranks]))
            _compare(store, base, ranks, rank, schedule[ranks], round_, timeout_s)
        except ScheduleMismatchError as exc:
            message = f"rank {rank}: {exc}"
            with contextlib.suppress(Exception):
                store.set(f"{base}/error", message)  # peers that arrive later fail too
            raise ScheduleMismatchError(message) from exc.__cause__
        except (RuntimeError, OSError) as exc:  # DistNetworkError, DistStoreError...
            raise ScheduleMismatchError(
                f"rank {rank}: could not reach the c10d store for the collective-schedule check "
                f"of group {list(ranks)} ({type(exc).__name__}: {exc}); the rank that hosts it "
                "(usually rank 0) has probably failed or exited: look at its log"
            ) from exc
    logger.debug("collective schedule agreed with peers for %d group(s)", len(schedule))


def _compare(
    store: Any,
    base: str,
    ranks: tuple[int, ...],
    rank: int,
    mine: list[str],
    round_: int,
    timeout_s: float,
) -> None:
    peers = [r for r in ranks if r != rank]
    keys = [f"{base}/{r}" for r in peers]
    try:
        store.wait(keys, timedelta(seconds=timeout_s))
    except Exception as exc:  # the store raises a RuntimeError/DistStoreError on timeout
        missing = [r for r, k in zip(peers, keys) if not store.check([k])]
        raise ScheduleMismatchError(
            f"ranks {missing or peers} of group {list(ranks)} did not reach the "
            f"collective-schedule check #{round_} within {timeout_s:g} s: they compiled a "
            "different graph (different code path, inputs or recompilation), are much "
            "slower, or died. Look at their logs; raise schedule_timeout_s if they are only "
            f"slow ({type(exc).__name__}: {exc})"
        ) from exc
    if store.check([f"{base}/error"]):
        raise ScheduleMismatchError(
            f"a peer gave up on the collective-schedule check #{round_} of group "
            f"{list(ranks)}: {store.get(f'{base}/error').decode()}"
        )
    for peer, key in zip(peers, keys):
        theirs = json.loads(store.get(key))
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
