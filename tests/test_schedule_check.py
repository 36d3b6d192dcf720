"""The collective-schedule check: mismatched ranks fail fast with a message naming them."""

from __future__ import annotations

import pytest

from torch_tensorrt_dist.backend.report import CollectiveInfo
from torch_tensorrt_dist.backend.schedule_check import (
    check_schedule,
    first_difference,
    schedule_of,
)
from torch_tensorrt_dist.errors import ScheduleMismatchError
from torch_tensorrt_dist.testing import run_on_ranks

from . import _schedule_fns


def _c(op: str, ranks: tuple[int, ...], shape: tuple[int, ...] = (2, 4)) -> CollectiveInfo:
    return CollectiveInfo(op, ranks, "sum" if op == "all_reduce" else None, "float32", shape, 32)


def test_schedule_groups_collectives_by_group_in_order() -> None:
    cs = [_c("all_reduce", (0, 1)), _c("all_gather", (0, 2)), _c("all_reduce", (0, 1), (3, 4))]
    assert schedule_of(cs) == {
        (0, 1): ["all_reduce(sum) float32[2, 4]", "all_reduce(sum) float32[3, 4]"],
        (0, 2): ["all_gather float32[2, 4]"],
    }
    assert schedule_of([_c("all_reduce", (3,))]) == {}  # a group of one never communicates


def test_first_difference_finds_missing_and_changed_entries() -> None:
    assert first_difference(["a", "b"], ["a", "b"]) is None
    assert first_difference(["a", "b"], ["a", "c"]) == (1, "b", "c")
    assert first_difference(["a"], ["a", "b"]) == (1, "<none>", "b")


class _DictStore:
    """An in-memory store with the c10d Store calls the check uses."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def set(self, key: str, value: str) -> None:
        self.data[key] = value.encode()

    def get(self, key: str) -> bytes:
        return self.data[key]

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)

    def wait(self, keys: list[str], timeout: object) -> None:
        if not self.check(keys):
            raise RuntimeError("Wait timeout")


def test_check_names_the_first_differing_collective_and_the_ranks() -> None:
    store = _DictStore()
    store.set("torch_tensorrt_dist/schedule/4-5/0/5", '["all_reduce(sum) float32[3, 4]"]')
    mine = {(4, 5): ["all_reduce(sum) float32[2, 4]"]}
    with pytest.raises(ScheduleMismatchError) as info:
        check_schedule(mine, timeout_s=1, store=store, rank=4)
    msg = str(info.value)
    assert "rank 4: collective #0 on group [4, 5] differs between rank 4" in msg
    assert "(all_reduce(sum) float32[2, 4]) and rank 5 (all_reduce(sum) float32[3, 4])" in msg
    assert store.check(["torch_tensorrt_dist/schedule/4-5/0/error"])  # peers will see it


def test_missing_peer_is_named() -> None:
    with pytest.raises(ScheduleMismatchError, match=r"ranks \[7\] of group \[6, 7\] did not"):
        check_schedule({(6, 7): ["x"]}, timeout_s=1, store=_DictStore(), rank=6)


def test_gloo_ranks_with_different_shapes_both_fail_fast() -> None:
    results = run_on_ranks(_schedule_fns.mismatched, 2, "shape", 20.0, timeout=180)
    for rank, res in enumerate(results):
        assert res["error"] == "ScheduleMismatchError", res
        assert f"rank {rank}" in res["message"] and "differs between" in res["message"]
        assert "float32[2, 16]" in res["message"] and "float32[3, 16]" in res["message"]


def test_gloo_rank_past_the_timeout_is_named_and_both_fail() -> None:
    results = run_on_ranks(_schedule_fns.mismatched, 2, "late", 4.0, timeout=180)
    assert results[0]["error"] == "ScheduleMismatchError"
    assert "ranks [1] of group [0, 1] did not reach" in results[0]["message"]
    assert results[0]["elapsed"] < 4.0 + 30  # the bound: timeout + compile time
    assert results[1]["error"] == "ScheduleMismatchError"  # the late rank fails too, no hang
    # it reads rank 0's verdict, or finds rank 0 (the store host) already gone
    assert "a peer gave up" in results[1]["message"] or "could not reach" in results[1]["message"]


def test_gloo_ranks_that_agree_run_normally() -> None:
    results = run_on_ranks(_schedule_fns.mismatched, 2, "same", 20.0, timeout=180)
    assert [r["error"] for r in results] == [None, None]


def test_store_exchange_counts_rounds_per_name_and_rank_and_names_missing_peers() -> None:
    """The one exchange under agree, the schedule check and verify: ``prefix/name/round/rank``
    keys, the n-th round of a name on every rank under the same key, missing peers named."""
    from datetime import timedelta

    from torch_tensorrt_dist.runtime.store_exchange import PeersMissing, StoreExchange

    store = _DictStore()
    first = StoreExchange.next_round(store, "test/x", (2, 3), rank=2)
    again = StoreExchange.next_round(store, "test/x", (2, 3), rank=2)
    peer = StoreExchange.next_round(store, "test/x", (2, 3), rank=3)
    assert (first.base, again.base, peer.base) == ("test/x/2-3/0", "test/x/2-3/1", "test/x/2-3/0")
    first.publish({"v": 1})
    peer.publish([3])
    assert store.data["test/x/2-3/0/2"] == b'{"v": 1}'
    assert first.gather([2, 3], timedelta(seconds=1)) == {2: {"v": 1}, 3: [3]}
    with pytest.raises(PeersMissing) as missing:
        again.gather([2, 3], timedelta(seconds=1))
    assert missing.value.missing == [2, 3] and isinstance(missing.value.__cause__, RuntimeError)
