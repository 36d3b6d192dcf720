"""The KV cache's block pool (pure): allocation order, references, the prefix cache and its
least-recently-used eviction, and prefix keys that are the same in every process."""

from __future__ import annotations

import subprocess
import sys

import pytest

from torch_tensorrt_dist.generation.kv_blocks import (
    BlockPool,
    NoBlocks,
    blocks_for,
    next_key,
    prefix_keys,
)


def test_allocation_takes_the_lowest_free_blocks_and_never_the_null_block() -> None:
    pool = BlockPool(6, 4)
    assert pool.allocate(2) == [1, 2] and pool.allocate(3) == [3, 4, 5]
    with pytest.raises(NoBlocks, match="1 blocks asked for, 0 available"):
        pool.allocate(1)
    pool.release([2, 4])
    assert pool.stats().free == 2 and pool.allocate(2) == [4, 2]  # released tail first
    with pytest.raises(ValueError, match="released more often than allocated"):
        pool.release([1, 1])


def test_committed_blocks_are_cached_shared_and_evicted_least_recent_first() -> None:
    pool = BlockPool(6, 2)
    keys = prefix_keys([1, 2, 3, 4, 5, 6], 2)
    a = pool.allocate(3)
    for block, key in zip(a, keys, strict=True):
        pool.commit(block, key)
    assert pool.cached_prefix(keys) == 3 and pool.cached_blocks(keys) == a
    assert [pool.references(b) for b in a] == [1, 1, 1]
    shared = pool.lookup(keys[:2])  # a second owner of the first two blocks
    assert shared == a[:2] and pool.stats().used == 3
    pool.release(a)  # the first owner leaves: the third block is cached, unreferenced
    assert pool.stats() == pool.stats().__class__(blocks=5, used=2, cached=1, free=2)
    assert [pool.references(b) for b in pool.cached_blocks(keys)] == [1, 1, 0]
    pool.release(shared)  # now all three are cached (released tail first: block a[1] last)
    assert pool.stats().cached == 3 and pool.available == 5
    fresh = pool.allocate(3)  # 2 free ones, then the least recently released cached block
    assert fresh[:2] == [4, 5] and fresh[2] == a[2]
    assert pool.cached_prefix(keys) == 2  # the evicted block's key is gone with it
    assert pool.lookup(keys) == a[:2] and pool.hits == 4 and pool.queries == 5


def test_a_key_stays_with_its_first_block_and_caching_can_be_off() -> None:
    pool = BlockPool(4, 2)
    key = next_key(None, [1, 2])
    b1, b2 = pool.allocate(2)
    pool.commit(b1, key)
    pool.commit(b2, key)  # the same prefix computed twice: the first block keeps the key
    pool.release([b1, b2])
    assert pool.stats().cached == 1 and pool.lookup([key]) == [b1]
    off = BlockPool(4, 2, prefix_caching=False)
    (b,) = off.allocate(1)
    off.commit(b, key)
    off.release([b])
    assert off.lookup([key]) == [] and off.stats().cached == 0


def test_prefix_keys_chain_over_blocks_and_salt() -> None:
    a = prefix_keys([1, 2, 3, 4, 5], 2)
    assert len(a) == 2 and blocks_for(5, 2) == 3
    assert prefix_keys([1, 2, 3, 4, 9, 9], 2)[:2] == a  # only full blocks, in order
    assert prefix_keys([9, 2, 3, 4], 2)[1] != a[1]  # a change in block 0 changes every later key
    assert prefix_keys([1, 2, 3, 4], 2, salt=b"other model") != a
    assert prefix_keys([3, 4], 2)[0] != a[1]  # a block's key depends on what precedes it


def test_prefix_keys_are_the_same_in_another_process() -> None:
    """Ranks are processes: their keys must agree (Python's ``hash`` of bytes would not)."""
    code = (
        "from torch_tensorrt_dist.generation.kv_blocks import prefix_keys;"
        "print(prefix_keys(list(range(40)), 16, salt=b'm')[1].hex())"
    )
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert other == prefix_keys(list(range(40)), 16, salt=b"m")[1].hex()
