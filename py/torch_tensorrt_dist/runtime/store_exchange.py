"""One exchange of small JSON values between ranks through the c10d store.

    exchange = StoreExchange.next_round(store, "torch_tensorrt_dist/verify", (0, 1), rank=0)
    exchange.publish({"failure": None})                  # under .../0-1/<round>/0
    theirs = exchange.gather([1], timedelta(seconds=30))  # {1: {...}}, or PeersMissing

Each process counts the rounds of each ``(prefix, name, rank)`` (a step, a group), so the n-th
exchange of a step on every rank meets under the same keys: ``prefix/name/round/rank``. Used
by ``runtime.agree`` (one verdict per step), the collective-schedule check and the ``verify``
verdicts (``backend/``); each says in its own words what a missing peer means.
"""

from __future__ import annotations

import collections
import json
import threading
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch.distributed as dist

__all__ = ["PeersMissing", "StoreExchange"]

_lock = threading.Lock()
_rounds: collections.Counter[tuple[str, str, int]] = collections.Counter()


class PeersMissing(RuntimeError):
    """The ranks whose values did not reach the store in time (the store's error is the
    cause)."""

    def __init__(self, missing: list[int]) -> None:
        super().__init__(f"ranks {missing} did not publish their value")
        self.missing = missing


class StoreExchange:
    """One round of an exchange: this rank's value under ``base/rank``, its peers' beside."""

    def __init__(self, store: Any, base: str, rank: int) -> None:
        self.store, self.base, self.rank = store, base, rank

    @classmethod
    def next_round(
        cls, store: Any, prefix: str, name: str | Sequence[int], *, rank: int | None = None
    ) -> StoreExchange:
        """The next round of ``name`` (a step, or a group's ranks: ``0-1``) under ``prefix`` for
        this rank; ``store`` and ``rank`` default to the default process group's."""
        if not isinstance(name, str):
            name = "-".join(map(str, name))
        store = store if store is not None else dist.distributed_c10d._get_default_store()
        rank = dist.get_rank() if rank is None else rank
        with _lock:
            round_ = _rounds[prefix, name, rank]
            _rounds[prefix, name, rank] += 1
        return cls(store, f"{prefix}/{name}/{round_}", rank)

    def key(self, rank: int) -> str:
        return f"{self.base}/{rank}"

    def publish(self, value: Any) -> None:
        """Write this rank's ``value`` (JSON)."""
        self.store.set(self.key(self.rank), json.dumps(value))

    def gather(self, ranks: Sequence[int], timeout: timedelta) -> dict[int, Any]:
        """The values of ``ranks``, waiting up to ``timeout`` for them; :class:`PeersMissing`
        names the ranks whose value never came (chained to the store's own error)."""
        keys = [self.key(r) for r in ranks]
        try:
            self.store.wait(keys, timeout)
        except Exception as exc:  # the store raises RuntimeError / DistStoreError on a timeout
            missing = [r for r, k in zip(ranks, keys) if not self.store.check([k])]
            raise PeersMissing(missing or list(ranks)) from exc
        return {r: json.loads(self.store.get(k)) for r, k in zip(ranks, keys)}
