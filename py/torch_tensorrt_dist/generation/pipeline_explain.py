"""``explain_pipeline``: what one rank of a ``(pp, tp)`` job compiles and sends, in one process.

    report = explain_pipeline(ModelArgs.from_name("llama-3.1-8b", n_layers=4), pp=2, tp=4, rank=5)
    print(report)   # the stage's layers, its decode graph's TP collectives, its transfers

It joins a fake process group as ``rank`` of ``pp * tp``, builds only that rank's stage (weights
left uninitialised: only shapes matter), compiles the stage's part of the paged decode step
(``--batch`` rows, each over its own KV blocks; ``generation/stage_step.py``) with ``explain``
and lists the transfers of one decode step from the same plan the step function follows. Every
collective in the graph must stay on the stage's TP group; ``groups_ok`` says whether it does.
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
from torch_tensorrt_dist.generation.runner import decode_example, paged_step, setup_example
from torch_tensorrt_dist.generation.stage_step import (
    Transfer,
    mark_hidden_dims,
    step_transfers,
)
from torch_tensorrt_dist.generation.step_inputs import StepLimits
from torch_tensorrt_dist.models.llama import Transformer
from torch_tensorrt_dist.models.llama_args import ModelArgs
from torch_tensorrt_dist.models.stage import cut_stage
from torch_tensorrt_dist.parallel.llama import Embedding, LMHead, apply_tp
from torch_tensorrt_dist.parallel.pipeline import (
    PipelineLayout,
    check_mesh,
    make_pipeline_mesh,
    stage_place,
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
    torch.distributed is not initialised): its stage's decode step of ``batch`` rows, each at
    half of ``cache_len`` over its own blocks."""
    check_mesh(pp, tp, pp * tp, args)
    PipelineLayout.of(rank, pp, tp)
    with fake_world(rank, pp * tp):
        place = stage_place(make_pipeline_mesh(pp, tp, "cpu"), args.n_layers, split)
        layout = place.layout
        with torch.device("meta"):
            model = Transformer(args)
        apply_tp(model, place.tp_group, lm_head=lm_head, embedding=embedding)
        cut_stage(model, place.role)
        model = model.to(dtype).to_empty(device="cpu").requires_grad_(False).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
        setup_example(model, batch, cache_len)
        tokens, *rest = decode_example(batch, cache_len)
        x = tokens
        if not layout.is_first:  # the previous stage's hidden states
            x = torch.zeros(batch, 1, args.dim, dtype=dtype)
            mark_hidden_dims(StepLimits(batch, 1, 1, 1), x)
        report = explain(paged_step(model), x, *rest)
    transfers = step_transfers(
        layout, rows=batch, tokens=1, dim=args.dim, vocab=args.vocab_size, dtype=dtype
    )
    return PipelineExplainReport(layout, list(place.role.layers), report, transfers)


def explain_stages(
    args: ModelArgs, *, pp: int, tp: int, tp_rank: int = 0, **kwargs: Any
) -> list[PipelineExplainReport]:
    """:func:`explain_pipeline` for TP rank ``tp_rank`` of every stage, first to last."""
    if not 0 <= tp_rank < tp:
        raise ConfigError(f"tp_rank={tp_rank} is not a TP rank of tp={tp}")
    return [
        explain_pipeline(args, pp=pp, tp=tp, rank=s * tp + tp_rank, **kwargs) for s in range(pp)
    ]
