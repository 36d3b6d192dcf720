"""Shared pieces of the benchmarks: figures with their goals, the small Llama configs, and
the ranks they measure, built as the commands build theirs."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch_tensorrt_dist.models.llama_args import ModelArgs

if TYPE_CHECKING:
    from torch_tensorrt_dist.families import Rank

__all__ = ["Figure", "bench_args", "bench_rank"]


@dataclass
class Figure:
    """One measured figure, its goal, and whether the goal is met (None: no goal / skipped)."""

    section: str
    name: str
    value: Any
    unit: str = ""
    goal: str = ""
    met: bool | None = None
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def bench_args(n_layers: int = 4, *, dim: int = 256, vocab: int = 512, **fields: Any) -> ModelArgs:
    """A small Llama-shaped config (8 heads, so TP 2, 4 and 8 divide them; an MLP of 4 x
    ``dim``; 256 positions), ``fields`` replacing any of these."""
    base: dict[str, Any] = dict(
        dim=dim,
        n_layers=n_layers,
        n_heads=8,
        n_kv_heads=8,
        vocab_size=vocab,
        intermediate_size=4 * dim,
        max_seq_len=256,
    )
    return ModelArgs(**{**base, **fields})


def bench_rank(
    model: str | Path,
    *,
    engine: str = "eager",
    rank: int = 0,
    world: int = 1,
    ep: int = 1,
    kv_cache_memory: int | None = None,
) -> Rank:
    """This process's rank of ``model`` (a checkpoint or a preset) over ``world`` ranks (TP,
    or EP x TP with ``ep``), built by the rank builder the commands use
    (``families.rank_for``): ``.model()`` its shard, ``.generator(rows=, cache_len=)`` its
    generator."""
    import torch.distributed as dist

    from torch_tensorrt_dist.config import (
        CacheOptions,
        GenerateJob,
        ModelOptions,
        Parallel,
        RunConfig,
    )
    from torch_tensorrt_dist.families import rank_for

    config = RunConfig(
        "generate",
        ModelOptions(model=str(model)),
        Parallel(tp=world // ep, ep=ep),
        GenerateJob(),
        engine=engine,
        cache=CacheOptions(kv_cache_memory=kv_cache_memory),
    )
    group = dist.group.WORLD if world > 1 else None
    return rank_for(config, index=rank, world=world, group=group)
