"""``explain_moe``: what one rank of an ``ep x tp`` MoE job compiles for decode and prefill.

    report = explain_moe(args, moe, ep=2, tp=4, rank=5)   # a fake world of 8 ranks
    print(report)   # the rank's experts, its graphs' collectives, their groups

It joins a fake process group as ``rank`` of ``ep * tp``, builds that rank's shard of the model
(on the meta device, then empty storage: only shapes matter), and compiles the decode step and
a ``prefill``-token prefill step with ``explain``. Attention's collectives must be on the rank's
TP group and each MoE layer's one all-reduce on the EP x TP group; ``groups_ok`` says whether
they are (decode). The prefill graph holds the grouped experts op (``ops/experts.py``) once per
MoE layer; where TensorRT cannot take it, the report says so and why (the engine splits).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from torch_tensorrt_dist.backend.explain import ExplainReport, explain
from torch_tensorrt_dist.backend.fake_world import fake_world
from torch_tensorrt_dist.generation.runner import (
    decode_example,
    paged_step,
    prefill_example,
    setup_example,
)
from torch_tensorrt_dist.models.llama_args import ModelArgs
from torch_tensorrt_dist.models.moe import MoETransformer
from torch_tensorrt_dist.models.moe_args import MoEArgs
from torch_tensorrt_dist.parallel.llama import Embedding, LMHead
from torch_tensorrt_dist.parallel.moe import (
    MoELayout,
    apply_moe_parallel,
    make_moe_mesh,
    moe_groups,
    moe_layout,
)

__all__ = ["MoEExplainReport", "explain_moe"]


@dataclass
class MoEExplainReport:
    """One rank of an expert x tensor parallel job: its experts and its decode graph."""

    rank: int
    layout: MoELayout
    tp_ranks: list[int]
    moe_ranks: list[int]
    sparse_layers: list[int]
    decode: ExplainReport
    prefill: ExplainReport | None = None
    prefill_tokens: int = 0

    def moe_collectives(self) -> list[Any]:
        return [c for c in self.decode.collectives if list(c.group_ranks) == self.moe_ranks]

    @property
    def groups_ok(self) -> bool:
        """One MoE all-reduce per sparse layer on the EP x TP group, issued by that layer's
        MLP; every other collective on the TP group."""
        want = [f"layers.{i}.feed_forward" for i in self.sparse_layers]
        moe = [(c.op, c.module) for c in self.moe_collectives()]
        if self.layout.ep * self.layout.tp > 1 and moe != [("all_reduce", m) for m in want]:
            return False
        others = [c for c in self.decode.collectives if list(c.group_ranks) != self.moe_ranks]
        return all(list(c.group_ranks) == self.tp_ranks for c in others)

    @property
    def groups(self) -> list[list[int]]:
        """The distinct groups the decode graph communicates on."""
        seen: list[list[int]] = []
        for c in self.decode.collectives:
            if list(c.group_ranks) not in seen:
                seen.append(list(c.group_ranks))
        return seen

    def as_dict(self) -> dict[str, Any]:
        lay = self.layout
        return {
            "rank": self.rank,
            "ep": lay.ep,
            "tp": lay.tp,
            "ep_rank": lay.ep_rank,
            "tp_rank": lay.tp_rank,
            "experts": [lay.expert_start, lay.expert_start + lay.local_experts],
            "tp_group": self.tp_ranks,
            "moe_group": self.moe_ranks,
            "groups": self.groups,
            "groups_ok": self.groups_ok,
            "decode": self.decode.as_dict(),
            "prefill_tokens": self.prefill_tokens,
            "prefill": self.prefill.as_dict() if self.prefill is not None else None,
        }

    def __str__(self) -> str:
        lay = self.layout
        first, last = lay.expert_start, lay.expert_start + lay.local_experts - 1
        return "\n".join(
            [
                f"MoE rank {self.rank} of ep={lay.ep} x tp={lay.tp}: ep rank {lay.ep_rank} "
                f"(experts {first}..{last} of {lay.n_experts}), tp rank {lay.tp_rank}",
                f"  TP group {self.tp_ranks} (attention, embedding, LM head); EP x TP group "
                f"{self.moe_ranks} (one all-reduce per MoE layer)",
                "decode step:",
                *("  " + ln for ln in str(self.decode).splitlines()),
                f"  graphs: {self.decode.graph_count}, groups: {len(self.groups)}, "
                f"each collective on its expected group: {'yes' if self.groups_ok else 'NO'}",
                *self._prefill_lines(),
            ]
        )

    def _prefill_lines(self) -> list[str]:
        if self.prefill is None:
            return []
        head = f"prefill step ({self.prefill_tokens} tokens):"
        return [head, *("  " + ln for ln in str(self.prefill).splitlines())]


def explain_moe(
    args: ModelArgs,
    moe: MoEArgs,
    *,
    ep: int,
    tp: int,
    rank: int,
    batch: int = 1,
    cache_len: int = 64,
    prefill: int = 16,
    dtype: torch.dtype = torch.float32,
    lm_head: LMHead = "vocab_parallel",
    embedding: Embedding = "vocab_parallel",
) -> MoEExplainReport:
    """Explain rank ``rank`` of an ``ep x tp`` MoE job on a fake process group (in a process
    where torch.distributed is not initialised): its decode step, and a prefill of ``prefill``
    tokens (0: none)."""
    moe_layout(args, moe, ep=ep, tp=tp, lm_head=lm_head, embedding=embedding)  # sizes divide
    with fake_world(rank, ep * tp):
        groups = moe_groups(make_moe_mesh(ep, tp, "cpu"))
        with torch.device("meta"):
            model = MoETransformer(args, moe)
        apply_moe_parallel(model, groups, lm_head=lm_head, embedding=embedding)
        model = model.to(dtype).to_empty(device="cpu").requires_grad_(False).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
        setup_example(model, batch, cache_len)
        report = explain(paged_step(model), *decode_example(batch, cache_len))
        first = None
        if prefill:
            # one prompt of ``prefill`` tokens into row 0 (the serving prefill)
            first = explain(paged_step(model), *prefill_example(prefill))
        layout = moe_layout(
            args,
            moe,
            ep=ep,
            tp=tp,
            ep_rank=groups.ep_rank,
            tp_rank=groups.tp_rank,
            lm_head=lm_head,
            embedding=embedding,
        )
        tp_ranks = [rank // tp * tp + t for t in range(tp)]
        moe_ranks = list(range(ep * tp))
    return MoEExplainReport(
        rank, layout, tp_ranks, moe_ranks, list(moe.sparse_layers), report, first, prefill
    )
