"""A fake process group in this process: any rank of any world size, no communication.

Used by ``explain`` and its CLI to show what each rank of a large job would compile.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch.distributed as dist

from torch_tensorrt_dist.errors import ConfigError

__all__ = ["fake_world"]


@contextlib.contextmanager
def fake_world(rank: int, world_size: int) -> Iterator[None]:
    """Initialise torch.distributed with the ``fake`` backend as ``rank`` of ``world_size``."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is not a rank of a world of size {world_size}")
    if dist.is_initialized():
        raise ConfigError(
            "torch.distributed is already initialised in this process; a fake world needs a "
            "process of its own"
        )
    # private: torch's fake process group (tests/test_torch_internals.py guards it)
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()
