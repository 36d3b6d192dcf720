"""``explain_pipeline``: what one rank of a ``(pp, tp)`` job compiles and sends, in one process.

    report = explain_pipeline(ModelArgs.from_name("llama-3.1-8b", n_layers=4), pp=2, tp=4, rank=5)
    print(report)   # the stage's layers, its decode graph's TP collectives, its p2p messages

It joins a fake process group as ``rank`` of ``pp * tp``, builds only that rank's stage (weights
left uninitialised: only shapes matter), compiles the stage's decode step with ``explain`` and
lists the stage-to-stage transfers of one decode step from the same plan the generation loop
follows. Every collective must stay on the stage's TP group; ``groups_ok`` says whether it does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from torch_tensorrt_dist.backend.explain import ExplainReport, explain
from torch_tensorrt_dist.backend.fake_world import fake_world
from torch_tensorrt_dist.backend.report import format_table
from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.pipeline import stage_steps
from torch_tensorrt_dist.generation.pipeline_transfers import Transfer, step_transfers
from torch_tensorrt_dist.models.llama_args import ModelArgs
from torch_tensorrt_dist.parallel.llama import Embedding, LMHead
from torch_tensorrt_dist.parallel.pipeline import (
    PipelineLayout,
    PipelineStage,
    check_mesh,
    make_pipeline_mesh,
    shard_stage,
    split_layers,
    stage_groups,
)

__all__ = ["PipelineExplainReport", "explain_pipeline", "explain_stages"]


@dataclass
class PipelineExplainReport:
    """One rank of a pipeline x tensor parallel job: its stage, graph and messages."""

    layout: PipelineLayout
    layers: list[int]
    decode: ExplainReport
    transfers: list[Transfer] = field(default_factory=list)

    @property
    def groups_ok(self) -> bool:
        """True when every collective of the decode graph is on this stage's TP group."""
        want = tuple(self.layout.tp_ranks)
        return all(tuple(c.group_ranks) == want for c in self.decode.collectives)

    def as_dict(self) -> dict[str, Any]:
        lay = self.layout
        return {
            "rank": lay.rank,
            "pp": lay.pp,
            "tp": lay.tp,
            "stage": lay.stage,
            "tp_rank": lay.tp_rank,
            "tp_group": lay.tp_ranks,
            "layers": self.layers,
            "groups_ok": self.groups_ok,
            "decode": self.decode.as_dict(),
            "transfers": [t.as_dict() for t in self.transfers],
        }

    def __str__(self) -> str:
        lay = self.layout
        parts = []
        if lay.is_first:
            parts.append("embedding")
        parts.append(f"layers {self.layers[0]}..{self.layers[-1]}")
        if lay.is_last:
            parts.append("norm + LM head")
        lines = [
            f"pipeline stage {lay.stage} of {lay.pp} (rank {lay.rank}, tp rank {lay.tp_rank} of "
            f"group {lay.tp_ranks}): {', '.join(parts)}",
            "decode step:",
            *("  " + ln for ln in str(self.decode).splitlines()),
            f"  collectives on the stage's TP group: {'yes' if self.groups_ok else 'NO'}",
            "stage-to-stage transfers per decode step:",
        ]
        rows = [
            [
                t.direction,
                t.peer,
                t.kind,
                list(t.shape),
                str(t.dtype).removeprefix("torch."),
                f"{t.bytes:,}",
            ]
            for t in self.transfers
        ]
        if rows:
            table = format_table(["dir", "peer", "what", "shape", "dtype", "bytes"], rows)
            lines += ["  " + row for row in table.splitlines()]
        else:
            lines.append("  none (pp = 1)")
        return "\n".join(lines)


def _empty_stage(
    args: ModelArgs, layout: PipelineLayout, split: Sequence[int] | None, dtype: torch.dtype
) -> PipelineStage:
    layers = split_layers(args.n_layers, layout.pp, split)[layout.stage]
    with torch.device("meta"):
        return PipelineStage(args, stage=layout.stage, pp=layout.pp, layers=layers)


def explain_pipeline(
    args: ModelArgs,
    *,
    pp: int,
    tp: int,
    rank: int,
    batch: int = 1,
    cache_len: int = 64,
    split: Sequence[int] | None = None,
    dtype: torch.dtype = torch.float32,
    lm_head: LMHead = "vocab_parallel",
    embedding: Embedding = "vocab_parallel",
) -> PipelineExplainReport:
    """Explain rank ``rank`` of a ``pp x tp`` job on a fake process group (needs a process where
    torch.distributed is not initialised)."""
    check_mesh(pp, tp, pp * tp, args)
    layout = PipelineLayout.of(rank, pp, tp)
    with fake_world(rank, pp * tp):
        mesh = make_pipeline_mesh(pp, tp, "cpu")
        layout, group = stage_groups(mesh)
        stage = _empty_stage(args, layout, split, dtype)
        shard_stage(stage, group, lm_head=lm_head, embedding=embedding)
        stage = stage.to(dtype).to_empty(device="cpu").requires_grad_(False).eval()
        with torch.no_grad():
            for p in stage.parameters():
                p.zero_()
        stage.setup_caches(batch, cache_len)
        _, decode = stage_steps(stage)
        if layout.is_first:
            x = torch.zeros(batch, 1, dtype=torch.long)
        else:
            x = torch.zeros(batch, 1, args.dim, dtype=dtype)
        pos = torch.tensor([cache_len // 2], dtype=torch.long)
        pad = torch.zeros(batch, dtype=torch.long)
        report = explain(decode, x, pos, pad)
    transfers = step_transfers(layout, batch=batch, seq=1, dim=args.dim, dtype=dtype)
    return PipelineExplainReport(layout, list(stage.layer_ids), report, transfers)


def explain_stages(
    args: ModelArgs, *, pp: int, tp: int, tp_rank: int = 0, **kwargs: Any
) -> list[PipelineExplainReport]:
    """:func:`explain_pipeline` for TP rank ``tp_rank`` of every stage, first to last."""
    if not 0 <= tp_rank < tp:
        raise ConfigError(f"tp_rank={tp_rank} is not a TP rank of tp={tp}")
    return [
        explain_pipeline(args, pp=pp, tp=tp, rank=s * tp + tp_rank, **kwargs) for s in range(pp)
    ]
