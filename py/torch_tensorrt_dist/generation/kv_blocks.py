"""The KV cache's blocks: allocation, reference counts, and the prefix cache (pure Python).

    pool = BlockPool(num_blocks=257, block_size=16)
    blocks = pool.allocate(3)                  # ids, lowest free first; NoBlocks when short
    keys = prefix_keys(prompt, 16, salt=b"m")   # one key per full block, chained
    hit = pool.lookup(keys)                    # the cached blocks of the longest common prefix
    pool.commit(blocks[0], keys[0])            # a full, computed block: reusable by others
    pool.release(blocks)                       # unreferenced: free, or cached if committed

Block 0 is the null block (``models/paged.NULL_BLOCK``): never allocated. A block is owned
by the sequences that reference it; a committed block whose last owner leaves stays in the
cache, holding its tokens' K/V, until an allocation needs it (least recently released first).

Every decision here is a function of the calls made, in order: ranks that make the same calls
hold the same blocks with the same ids, so block tables never travel between ranks. Keys are
BLAKE2 digests (the same in every process, unlike Python's ``hash`` of strings).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

from torch_tensorrt_dist.errors import ConfigError, TensorRTDistError

__all__ = [
    "BlockPool",
    "NoBlocks",
    "PoolStats",
    "blocks_for",
    "check_fits",
    "next_key",
    "prefix_keys",
]


class NoBlocks(TensorRTDistError):
    """An allocation asked for more blocks than are free (the scheduler checks first)."""


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks that hold ``tokens`` tokens."""
    return -(-tokens // block_size)


def check_fits(tokens: int, max_new_tokens: int, block_size: int, num_blocks: int) -> None:
    """ConfigError where one sequence of a ``tokens``-token prompt and ``max_new_tokens`` new
    ones needs more KV blocks than the whole pool has (``num_blocks`` less the null block): it
    could never finish, whatever else runs. Its last token's K/V is never computed."""
    need, have = blocks_for(tokens + max_new_tokens - 1, block_size), num_blocks - 1
    if need > have:
        fits = max(have * block_size - tokens + 1, 0)
        raise ConfigError(
            f"prompt ({tokens} tokens) + max_new_tokens ({max_new_tokens}) needs {need} KV "
            f"blocks of {block_size} tokens, and the KV cache holds {have} "
            f"({have * block_size} tokens; --kv-cache-memory): use max_new_tokens <= {fits}, "
            "or serve with a larger --kv-cache-memory"
        )


def next_key(prev: bytes | None, block: Sequence[int], *, salt: bytes = b"") -> bytes:
    """The key of a full block whose predecessors' key is ``prev`` (None: the first block)."""
    if prev is None:
        prev = hashlib.blake2b(salt, digest_size=16).digest()
    h = hashlib.blake2b(prev, digest_size=16)
    h.update(b"".join(int(t).to_bytes(4, "little", signed=True) for t in block))
    return h.digest()


def prefix_keys(tokens: Sequence[int], block_size: int, *, salt: bytes = b"") -> list[bytes]:
    """One key per full block of ``tokens``: a digest of the block's ids chained over every
    block before it (and ``salt``: the model's identity), so equal keys mean equal prefixes."""
    keys: list[bytes] = []
    for i in range(len(tokens) // block_size):
        block = tokens[i * block_size : (i + 1) * block_size]
        keys.append(next_key(keys[-1] if keys else None, block, salt=salt))
    return keys


@dataclass(frozen=True)
class PoolStats:
    blocks: int
    """Allocatable blocks (the null block excluded)."""
    used: int
    """Blocks some sequence references."""
    cached: int
    """Unreferenced blocks kept for their prefix (allocatable: evicted when needed)."""
    free: int
    """Unreferenced, uncached blocks."""


class BlockPool:
    """``num_blocks`` blocks of ``block_size`` tokens (block 0 reserved), with a prefix cache."""

    def __init__(self, num_blocks: int, block_size: int, *, prefix_caching: bool = True) -> None:
        if num_blocks < 2 or block_size < 1:
            raise ValueError(
                f"a pool needs >= 2 blocks of >= 1 token, got {num_blocks} x {block_size}"
            )
        self.num_blocks, self.block_size = num_blocks, block_size
        self.prefix_caching = prefix_caching
        self._free: deque[int] = deque(range(1, num_blocks))
        self._refs = [0] * num_blocks
        self._key_of: dict[int, bytes] = {}
        self._block_of: dict[bytes, int] = {}
        #: unreferenced committed blocks, least recently released first (evicted in that order)
        self._cached: OrderedDict[int, None] = OrderedDict()
        self.hits = 0
        """Blocks found by :meth:`lookup` so far."""
        self.queries = 0
        """Blocks asked for by :meth:`lookup` so far."""

    @property
    def available(self) -> int:
        """Blocks an allocation can take now (free, then cached ones evicted)."""
        return len(self._free) + len(self._cached)

    def stats(self) -> PoolStats:
        cached, free = len(self._cached), len(self._free)
        total = self.num_blocks - 1
        return PoolStats(total, total - cached - free, cached, free)

    def allocate(self, n: int) -> list[int]:
        """``n`` blocks, each referenced once: free ones first (lowest id first), then cached
        ones, least recently released first (their prefix is forgotten)."""
        if n > self.available:
            raise NoBlocks(f"{n} blocks asked for, {self.available} available")
        out = []
        for _ in range(n):
            if self._free:
                block = self._free.popleft()
            else:
                block, _ = self._cached.popitem(last=False)
                del self._block_of[self._key_of.pop(block)]
            self._refs[block] = 1
            out.append(block)
        return out

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference to each block. A block nobody references is free again, or
        cached (when committed); the tail of a sequence is released first, so the blocks of
        a shared prefix are the last to be evicted."""
        for block in reversed(blocks):
            refs = self._refs[block] - 1
            if refs < 0:
                raise ValueError(f"block {block} released more often than allocated")
            self._refs[block] = refs
            if refs == 0:
                if block in self._key_of:
                    self._cached[block] = None
                else:
                    self._free.append(block)

    def commit(self, block: int, key: bytes) -> None:
        """``block`` is full and holds the K/V of the prefix ``key`` names: later sequences
        with that prefix may share it. A key already held by another block is left there."""
        if not self.prefix_caching or key in self._block_of or block in self._key_of:
            return
        self._block_of[key] = block
        self._key_of[block] = key

    def lookup(self, keys: Sequence[bytes]) -> list[int]:
        """The cached blocks of the longest prefix of ``keys``, each referenced once more (the
        caller owns them like allocated ones)."""
        out: list[int] = []
        if self.prefix_caching:
            for key in keys:
                block = self._block_of.get(key)
                if block is None:
                    break
                out.append(block)
            for block in out:
                if self._refs[block] == 0:
                    del self._cached[block]
                self._refs[block] += 1
        self.queries += len(keys)
        self.hits += len(out)
        return out

    def references(self, block: int) -> int:
        """How many sequences hold ``block``."""
        return self._refs[block]

    def cached_blocks(self, keys: Sequence[bytes]) -> list[int]:
        """The blocks :meth:`lookup` would find for ``keys`` now (no reference taken)."""
        return [self._block_of[k] for k in keys[: self.cached_prefix(keys)]]

    def cached_prefix(self, keys: Sequence[bytes]) -> int:
        """How many leading ``keys`` :meth:`lookup` would find now (no reference taken)."""
        if not self.prefix_caching:
            return 0
        n = 0
        for key in keys:
            if key not in self._block_of:
                break
            n += 1
        return n
