"""Shared pieces of the benchmarks: figures with their goals, and the small Llama configs."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from torch_tensorrt_dist.models.llama_args import ModelArgs

__all__ = ["Figure", "bench_args"]


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


def bench_args(n_layers: int = 4, *, dim: int = 256, vocab: int = 512) -> ModelArgs:
    """A small Llama-shaped config (GQA 8/4 heads so TP 2, 4 and 8 divide the heads)."""
    return ModelArgs(
        dim=dim,
        n_layers=n_layers,
        n_heads=8,
        n_kv_heads=8,
        vocab_size=vocab,
        intermediate_size=4 * dim,
        max_seq_len=256,
    )
