"""Stage-to-stage messages of pipeline generation: the plan (pure) and the point-to-point calls.

Per step, rank ``r`` of stage ``s`` (TP rank ``t``):

* ``header``  int64 [1] from ``r - tp`` (s > 0) / to ``r + tp`` (s < pp - 1), one per
  microbatch and step: 1 = run it, 2 = skip it (its rows are finished), 0 = generation is over
  (the first stage decides; middle stages cannot see the tokens).
* ``hidden``  [b, S, dim] in the model dtype, after a run header (b = the microbatch's rows,
  S = the prefill bucket for the prefill step, 1 for a decode step).
* ``token``   int64 [B] from the last stage's TP rank t to the first stage's TP rank t: every TP
  rank of the last stage samples the same token (the same logits, the same seeded generator),
  so each first-stage rank gets it from its partner; no rank broadcasts to the world.
  ``token`` int64 [b] per microbatch.

Every message is an explicit ``dist.send`` / ``dist.recv`` between the compiled graphs, so no
graph holds a point-to-point op and each stays one engine per rank.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import Tensor

from torch_tensorrt_dist.parallel.pipeline import PipelineLayout

__all__ = ["HEADER_RUN", "HEADER_SKIP", "HEADER_STOP", "Links", "Transfer", "step_transfers"]

HEADER_STOP = 0
HEADER_RUN = 1
HEADER_SKIP = 2

Kind = Literal["header", "hidden", "token"]


@dataclass(frozen=True)
class Transfer:
    """One point-to-point message a rank sends or receives in a step."""

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
    layout: PipelineLayout, *, batch: int, seq: int, dim: int, dtype: torch.dtype
) -> list[Transfer]:
    """The messages of one step (``seq`` = 1 for decode) of this rank, in issue order.

    The first stage's token receive belongs to the step that produced the token; it is listed
    last, after the rank's own sends.
    """
    out: list[Transfer] = []
    hidden = (batch, seq, dim)
    if layout.prev is not None:
        out.append(Transfer("recv", layout.prev, "header", (1,), torch.int64))
        out.append(Transfer("recv", layout.prev, "hidden", hidden, dtype))
    if layout.next is not None:
        out.append(Transfer("send", layout.next, "header", (1,), torch.int64))
        out.append(Transfer("send", layout.next, "hidden", hidden, dtype))
    peer = layout.token_peer
    if peer is not None and layout.is_last:
        out.append(Transfer("send", peer, "token", (batch,), torch.int64))
    if peer is not None and layout.is_first:
        out.append(Transfer("recv", peer, "token", (batch,), torch.int64))
    return out


class Links:
    """This rank's point-to-point traffic: blocking receives, non-blocking sends.

    Sends are ``isend``: a stage goes on with its next microbatch while its output travels, and
    two stages never wait on each other's sends. The oldest sends are waited for once more than
    ``window`` are in flight (and all of them by :meth:`drain`).
    """

    def __init__(self, layout: PipelineLayout, device: torch.device, window: int = 64) -> None:
        self.layout, self.device, self.window = layout, device, window
        self._works: deque[tuple[Any, Tensor]] = deque()

    def send(self, tensor: Tensor, peer: int) -> None:
        tensor = tensor.contiguous()
        self._works.append((dist.isend(tensor, dst=peer), tensor))
        while len(self._works) > self.window:
            self._works.popleft()[0].wait()

    def recv(self, shape: tuple[int, ...], dtype: torch.dtype, peer: int | None) -> Tensor:
        if peer is None:
            raise ValueError("no peer to receive from")  # a bug: callers check the layout
        buf = torch.empty(shape, dtype=dtype, device=self.device)
        dist.recv(buf, src=peer)
        return buf

    def header(self, value: int) -> None:
        """Send a step header to the next stage (nothing on the last stage)."""
        if self.layout.next is not None:
            self.send(torch.tensor([value], dtype=torch.long, device=self.device), self.layout.next)

    def recv_header(self) -> int:
        return int(self.recv((1,), torch.long, self.layout.prev).item())

    def drain(self) -> None:
        while self._works:
            self._works.popleft()[0].wait()
