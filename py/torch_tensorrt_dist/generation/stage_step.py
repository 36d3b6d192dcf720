"""A pipeline stage's step function: its part of ``paged_step``, and what crosses its boundaries.

    step = StageStep(compiled, StageLinks(layout, pp_group, dim=..., vocab=..., dtype=...), limits)
    logits = step(tokens, start, last, past, dest)     # [R, V] on every rank of every stage

Every rank builds the same step inputs from the same plan (``generation/core.py``), so the
shapes of what crosses a boundary are known on both sides. Per call, rank ``i`` of stage ``s``:

* ``hidden``  [R, S, dim] (model dtype): received from rank ``i`` of stage ``s - 1`` (unless
  first), sent to rank ``i`` of stage ``s + 1`` (unless last): point-to-point.
* ``logits``  [R, V] (model dtype): the last stage's, broadcast over the pipeline group (rank
  ``i`` of every stage), so that every rank samples the same tokens from the same logits, as
  the core needs (tokens never travel; nor do block tables: every rank allocates alike).

The transfers run between compiled graphs, never inside one: ``dist.send``/``recv`` have no
traceable functional form, and a collective on the pipeline group inside the last stage's graph
would have no counterpart inside the other stages' graphs. So each stage stays one graph per
shape class, with only its own TP (and EP) collectives inside.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import Tensor

from torch_tensorrt_dist.generation.step_inputs import StepLimits
from torch_tensorrt_dist.parallel.pipeline import PipelineLayout

__all__ = ["StageLinks", "StageStep", "Transfer", "mark_hidden_dims", "step_transfers"]

Kind = Literal["hidden", "logits"]


@dataclass(frozen=True)
class Transfer:
    """One message a rank sends or receives in a step (``logits``: its part of the pipeline
    group's broadcast)."""

    direction: Literal["send", "recv"]
    peer: int
    kind: Kind
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def bytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * torch.empty((), dtype=self.dtype).element_size()

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["dtype"] = str(self.dtype).removeprefix("torch.")
        out["bytes"] = self.bytes
        return out


def step_transfers(
    layout: PipelineLayout, *, rows: int, tokens: int, dim: int, vocab: int, dtype: torch.dtype
) -> list[Transfer]:
    """The messages of one call of ``rows`` x ``tokens`` (1 for decode) on this rank, in order
    (pure)."""
    out: list[Transfer] = []
    hidden = (rows, tokens, dim)
    if layout.prev is not None:
        out.append(Transfer("recv", layout.prev, "hidden", hidden, dtype))
    if layout.next is not None:
        out.append(Transfer("send", layout.next, "hidden", hidden, dtype))
    if layout.is_last:
        out += [Transfer("send", r, "logits", (rows, vocab), dtype) for r in layout.pp_ranks[:-1]]
    else:
        out.append(Transfer("recv", layout.logits_source, "logits", (rows, vocab), dtype))
    return out


def mark_hidden_dims(limits: StepLimits, hidden: Tensor) -> None:
    """Mark a received hidden state's rows and tokens dynamic as ``step_inputs`` marks the
    tokens' (so a later stage's graphs have the first stage's shape classes)."""
    r, s = hidden.shape[:2]
    if r >= 2:
        torch._dynamo.mark_dynamic(hidden, 0, min=2, max=max(limits.rows, 2))
    if s >= 2:
        torch._dynamo.mark_dynamic(hidden, 1, min=2, max=max(limits.tokens, 2))


class StageLinks:
    """This rank's traffic: hidden states over its stage boundaries (point-to-point) and the
    logits over its pipeline group (a broadcast from the last stage)."""

    def __init__(
        self,
        layout: PipelineLayout,
        pp_group: dist.ProcessGroup | None,
        *,
        dim: int,
        vocab: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.layout, self.pp_group = layout, pp_group
        self.dim, self.vocab, self.dtype, self.device = dim, vocab, dtype, device

    def recv_hidden(self, rows: int, tokens: int) -> Tensor:
        if self.layout.prev is None:
            raise ValueError("the first stage receives no hidden states")  # a bug: see callers
        buf = torch.empty(rows, tokens, self.dim, dtype=self.dtype, device=self.device)
        dist.recv(buf, src=self.layout.prev)
        return buf

    def send_hidden(self, hidden: Tensor) -> None:
        if self.layout.next is None:
            raise ValueError("the last stage sends no hidden states")
        dist.send(hidden.contiguous(), dst=self.layout.next)

    def share_logits(self, logits: Tensor | None, rows: int) -> Tensor:
        """The last stage's logits [R, V] on every rank of the pipeline group (``logits``: the
        last stage's own, None elsewhere)."""
        if self.pp_group is None:  # pp == 1
            if logits is None:
                raise ValueError("a single stage must give its logits")
            return logits
        if logits is None:
            logits = torch.empty(rows, self.vocab, dtype=self.dtype, device=self.device)
        else:
            logits = logits.contiguous()
        dist.broadcast(logits, self.layout.logits_source, group=self.pp_group)
        return logits


class StageStep:
    """The core's step function on one rank of a pipeline: ``(tokens [R, S], start [R],
    last [R], past [R, NBp], dest [R, S], [live [N]]) -> logits [R, V]``, the same on every
    rank (a packed step's hidden states cross the boundaries padded, [R, S, dim]).
    ``mark_dynamic``: mark a received hidden state's dynamic dimensions (when Dynamo traces
    ``compiled``, as ``step_inputs`` marks the tokens')."""

    def __init__(
        self,
        compiled: Callable[..., Tensor],
        links: StageLinks,
        limits: StepLimits,
        *,
        mark_dynamic: bool = True,
    ) -> None:
        self.compiled, self.links, self.limits = compiled, links, limits
        self.mark_dynamic = mark_dynamic

    def __call__(
        self, tokens: Tensor, start: Tensor, last: Tensor, past: Tensor, dest: Tensor, *live: Tensor
    ) -> Tensor:
        lay = self.links.layout
        r, s = tokens.shape
        x = tokens
        if not lay.is_first:
            x = self.links.recv_hidden(r, s)  # [R, S, dim]
            if self.mark_dynamic:
                mark_hidden_dims(self.limits, x)
        y = self.compiled(x, start, last, past, dest, *live)  # hidden [R, S, dim] or logits
        if lay.is_last:
            return self.links.share_logits(y, r)
        self.links.send_hidden(y)
        return self.links.share_logits(None, r)
