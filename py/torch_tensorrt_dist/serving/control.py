"""The control channel: rank 0 tells the other ranks what a step contains that they cannot
compute themselves.

    channel = ControlChannel(dist.new_group(backend="gloo"))   # every rank, same order
    events = channel.exchange(events_on_rank0)                  # every rank, every step

Each step opens with one broadcast of a fixed 32-byte header from rank 0 over a gloo group of
its own: ``(MAGIC, step, payload bytes, flags)``. Only when a step does more than decode the
running requests (or the server stops) does a second broadcast carry the payload: the step's
plan (``generation/scheduler.StepPlan``): new requests (prompt ids, limits, every sampling
setting with the seed, stop ids and strings, the grammar's spec), resumed and preempted ones,
prefix-cache hits, prefill chunks, cancelled ids. Tokens, block tables and grammar masks never
travel: every rank samples the tokens itself from the same logits with the same seeded
generators and the same per-request state, and allocates the same blocks from the same plans.
Every rank has run the same ``exchange`` calls in the same order when it starts step ``n``, so
all ranks apply the same events at the same step boundary; the step number in
the header is checked on every rank, so a rank that fell out of step is an error, not a wrong
answer. See ``docs/serving.md`` for why a header is needed on every step.
"""

from __future__ import annotations

import json
import time
from typing import Any

import torch
import torch.distributed as dist

from torch_tensorrt_dist.errors import TensorRTDistError
from torch_tensorrt_dist.generation.core import Request
from torch_tensorrt_dist.generation.grammar import GrammarSpec
from torch_tensorrt_dist.generation.plan import StepPlan
from torch_tensorrt_dist.generation.sampling import SamplingConfig

__all__ = [
    "ControlChannel",
    "ControlError",
    "decode_plan",
    "encode_plan",
    "measure_latency",
]

MAGIC = 0x7472_7464  # "trtd"
STOP = 1  # flags bit: the last step; every rank leaves the loop after it


class ControlError(TensorRTDistError):
    """The ranks disagree on the control protocol (a bug, or ranks of different versions)."""


def _request_dict(r: Request) -> dict[str, Any]:
    """Everything a rank needs of a request: every sampling setting (``SamplingConfig.to_json``:
    a new setting travels without a change here) and the grammar's spec, never its mask."""
    return {
        "rid": r.rid,
        "prompt": list(r.prompt),
        "max_new": r.max_new_tokens,
        "sampling": r.sampling.to_json(),
        "stop_ids": list(r.stop_ids),
        "stop": list(r.stop),
        "grammar": None if r.grammar is None else r.grammar.to_json(),
        "follows": r.follows,
    }


def _request(j: dict[str, Any]) -> Request:
    grammar = j["grammar"]
    return Request(
        rid=j["rid"],
        prompt=tuple(j["prompt"]),
        max_new_tokens=j["max_new"],
        sampling=SamplingConfig.from_json(j["sampling"]),
        stop_ids=tuple(j["stop_ids"]),
        stop=tuple(j["stop"]),
        grammar=None if grammar is None else GrammarSpec.from_json(grammar),
        follows=j["follows"],
    )


def encode_plan(plan: StepPlan) -> bytes:
    """The payload of a step that does more than decode (JSON, UTF-8)."""
    data = {
        "cancels": plan.cancels,
        "preempts": plan.preempts,
        "joins": [_request_dict(r) for r in plan.joins],
        "resumes": plan.resumes,
        "cached": [[rid, n] for rid, n in plan.cached.items()],
        "chunks": [list(c) for c in plan.chunks],
        "drafts": [list(d) for d in plan.drafts],
    }
    return json.dumps(data, separators=(",", ":")).encode()


def decode_plan(payload: bytes, *, stop: bool = False) -> StepPlan:
    """Inverse of :func:`encode_plan` (an empty payload: a steady step)."""
    if not payload:
        return StepPlan(stop=stop)
    data = json.loads(payload.decode())
    return StepPlan(
        cancels=list(data["cancels"]),
        preempts=list(data["preempts"]),
        joins=[_request(j) for j in data["joins"]],
        resumes=list(data["resumes"]),
        cached={rid: n for rid, n in data["cached"]},
        chunks=[(rid, n) for rid, n in data["chunks"]],
        drafts=[(rid, k) for rid, k in data["drafts"]],
        stop=stop,
    )


class ControlChannel:
    """Rank 0's per-step header (and payload when there are events) to every other rank.

    ``group`` is a gloo group of all ranks (None: one rank, nothing to send); ``src`` is rank
    0's global rank. ``last_s`` is the time the last :meth:`exchange` took here.
    """

    def __init__(self, group: dist.ProcessGroup | None, *, src: int = 0) -> None:
        self.group, self.src = group, src
        self.is_source = group is None or dist.get_rank() == src
        self.step = 0
        self.last_s = 0.0
        self.payload_steps = 0
        self._header = torch.zeros(4, dtype=torch.int64)

    def exchange(self, plan: StepPlan | None = None) -> StepPlan:
        """Rank 0 passes its plan; every rank returns it, at the same step."""
        start = time.perf_counter()
        if self.is_source:
            out = plan if plan is not None else StepPlan()
            if self.group is not None:
                self._send(out)
        else:
            out = self._receive()
        self.step += 1
        self.last_s = time.perf_counter() - start
        return out

    def _send(self, plan: StepPlan) -> None:
        payload = b"" if plan.steady else encode_plan(plan)
        flags = STOP if plan.stop else 0
        header = torch.tensor([MAGIC, self.step, len(payload), flags], dtype=torch.int64)
        dist.broadcast(header, self.src, group=self.group)
        if payload:
            self.payload_steps += 1
            data = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
            dist.broadcast(data, self.src, group=self.group)

    def _receive(self) -> StepPlan:
        header = self._header
        dist.broadcast(header, self.src, group=self.group)
        magic, step, size, flags = (int(x) for x in header.tolist())
        if magic != MAGIC or step != self.step:
            raise ControlError(
                f"rank {dist.get_rank()} expected control header of step {self.step}, got "
                f"magic {magic:#x} step {step}: the ranks are out of step (run the same "
                "torch_tensorrt_dist version on every rank)"
            )
        payload = b""
        if size:
            self.payload_steps += 1
            data = torch.empty(size, dtype=torch.uint8)
            dist.broadcast(data, self.src, group=self.group)
            payload = data.numpy().tobytes()
        return decode_plan(payload, stop=bool(flags & STOP))


def measure_latency(group: dist.ProcessGroup | None, *, rounds: int = 50, src: int = 0) -> float:
    """One-way latency (s) of a header broadcast on ``group``: the median of ``rounds`` round
    trips (rank 0 to all, then the last rank back), halved. Call on every rank."""
    if group is None:
        return 0.0
    ranks = dist.get_process_group_ranks(group)
    back = ranks[-1]
    header = torch.zeros(4, dtype=torch.int64)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        dist.broadcast(header, src, group=group)
        dist.broadcast(header, back, group=group)
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2] / 2
