"""The core's side of speculative decoding: proposals, the verify call and its acceptance.

    spec = Speculator(SpeculativeConfig(num_tokens=4), verify_fn)    # GenerationCore does it
    k = spec.draft_size(seq, longest_row)      # the scheduler sizes the row's blocks by it
    drafts = spec.drafts(core, plan.drafts)    # every rank proposes the same tokens
    for seq, draft, logits in spec.verify(core, rows, drafts, hook):
        emitted += spec.accept(core, seq, draft, logits)

A decode row the plan gives a draft of k tokens runs as k + 1 tokens in the step's verify
call, with every other one-token row of the step (``verify_fn``: the step with the logits of
every token, ``Transformer.paged_step(..., every=True)``). :meth:`Speculator.accept` walks
a row's positions (``verify.verify_picks``): it emits each accepted draft token and the
target's own token through the core's ``apply_pick``, as plain decoding would, then rewinds the
blocks that hold only refused tokens' K/V. The counts (``proposed``, ``accepted``, ``rows``)
are the server's ``/metrics``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

from torch_tensorrt_dist.generation.kv_blocks import blocks_for
from torch_tensorrt_dist.generation.sampler import Pick
from torch_tensorrt_dist.generation.sequence import CoreError, Emitted, Sequence
from torch_tensorrt_dist.generation.speculative.config import SpeculativeConfig
from torch_tensorrt_dist.generation.speculative.draft import DraftProposer
from torch_tensorrt_dist.generation.speculative.proposer import NgramProposer
from torch_tensorrt_dist.generation.speculative.verify import verify_picks
from torch_tensorrt_dist.generation.step_inputs import step_inputs

if TYPE_CHECKING:
    from torch_tensorrt_dist.generation.grammar import Grammars
    from torch_tensorrt_dist.generation.kv_blocks import BlockPool
    from torch_tensorrt_dist.generation.sampler import Failure
    from torch_tensorrt_dist.generation.step_inputs import StepLimits


class GenerationCore(Protocol):
    """What the speculator uses of ``generation.core.GenerationCore`` (named by its shape:
    the core holds a speculator)."""

    sequences: dict[int, Sequence]
    running: list[Sequence]
    pool: BlockPool
    limits: StepLimits
    block_size: int
    device: torch.device
    grammars: Grammars | None
    mark_dynamic: bool
    pack: bool

    def apply_pick(self, seq: Sequence, pick: Pick | Failure) -> Emitted: ...

    def commit_blocks(self, seq: Sequence) -> None: ...


__all__ = ["Speculator"]


class Speculator:
    """Speculative decoding in one :class:`~..core.GenerationCore` (the same on every rank)."""

    def __init__(
        self,
        config: SpeculativeConfig,
        verify_fn: Callable[..., Tensor],
        draft: DraftProposer | None = None,
    ) -> None:
        self.config, self.verify_fn = config, verify_fn
        self.proposer = NgramProposer(min_n=config.min_n, max_n=config.max_n)
        #: the draft model's proposer (``--speculative draft``): its proposals are made once
        #: a step, for the plan's rows together, on every rank (:meth:`drafts`)
        self.draft = draft
        #: tokens proposed and accepted, rows verified with a draft
        self.proposed = self.accepted = self.rows = 0

    def draft_size(self, seq: Sequence, longest: int) -> int:
        """The tokens the proposer offers ``seq`` at this step (0: it decodes one token):
        at most its adaptive k, the tokens it may still produce less one, and the step's
        longest row (``longest`` tokens) less one."""
        if seq.spec is None or not seq.decoding:
            return 0
        left = seq.req.max_new_tokens - len(seq.out) - 1
        k = min(seq.spec.k(), left, longest - 1)
        if self.draft is not None:  # a draft model proposes k tokens, always
            return max(k, 0)
        return len(self._propose(seq, k))

    def _propose(self, seq: Sequence, k: int) -> list[int]:
        if k < 1:
            return []
        key = (len(seq.tokens), k)
        if seq.proposal is None or seq.proposal[:2] != key:
            seq.proposal = (*key, self.proposer.propose(seq.tokens, k))
        return seq.proposal[2]

    def drafts(self, core: GenerationCore, planned: list[tuple[int, int]]) -> dict[int, list[int]]:
        """Each planned row's proposal (every rank proposes the same tokens)."""
        out = {}
        for rid, k in planned:
            seq = core.sequences.get(rid)
            if seq is None or seq not in core.running or not seq.decoding or seq.spec is None:
                raise CoreError(f"a draft of {k} tokens for request {rid}, which is not decoding")
        if self.draft is not None:
            rows = [(rid, core.sequences[rid].tokens, k) for rid, k in planned]
            proposals = self.draft.propose_rows(rows, live=core.sequences)
            return {rid: p for (rid, _), p in zip(planned, proposals)}
        for rid, k in planned:
            seq = core.sequences[rid]
            draft = self._propose(seq, k)
            if len(draft) != k:
                raise CoreError(
                    f"request {rid}: rank 0 planned a draft of {k} tokens, this rank proposes "
                    f"{len(draft)}: the ranks' sequences differ"
                )
            out[rid] = draft
        return out

    def verify(
        self,
        core: GenerationCore,
        rows: list[tuple[Sequence, int]],
        drafts: dict[int, list[int]],
        before: Callable[[], None] | None,
    ) -> list[tuple[Sequence, list[int], Tensor]]:
        """One verify call over the one-token rows, each with its draft (maybe none): the
        rows that sample, with their draft and the logits of each position [1 + k, V]."""
        spans = [
            (
                seq.tokens[seq.computed : seq.computed + n] + drafts.get(seq.rid, []),
                seq.computed,
                seq.blocks,
            )
            for seq, n in rows
        ]
        inputs = step_inputs(
            spans, core.limits, core.device, mark_dynamic=core.mark_dynamic, pack=core.pack
        )
        if before is not None:
            before()
        logits = self.verify_fn(*inputs)  # [R, S, V], or packed [N, V]
        out, at = [], 0
        for i, ((seq, n), (ids, _, _)) in enumerate(zip(rows, spans)):
            row = logits[i, : len(ids)] if logits.dim() == 3 else logits[at : at + len(ids)]
            at += len(ids)
            seq.computed += n  # the drafts' K/V count once accepted (accept)
            if seq.computed == len(seq.tokens):
                out.append((seq, drafts.get(seq.rid, []), row))
            else:  # a prompt's chunk of one token, not its last
                core.commit_blocks(seq)
        return out

    def accept(
        self, core: GenerationCore, seq: Sequence, draft: list[int], logits: Tensor
    ) -> list[Emitted]:
        """Walk the row's positions: each accepted draft token, then the target's own token
        (where a draft token is refused, or after the last); then rewind the blocks that hold
        only refused tokens' K/V."""
        out, accepted, base = [], 0, seq.computed
        picks = verify_picks(logits, seq.sampling, core.grammars, draft)
        for pick, held in picks:  # lazy: each position after the picks before it applied
            e = core.apply_pick(seq, pick)
            out.append(e)
            if e.finish is not None or not held:
                break
            accepted += 1
        if draft:
            self.rows += 1
            self.proposed += len(draft)
            self.accepted += accepted
            if seq.spec is not None:
                seq.spec.update(len(draft), accepted)
        if core.sequences.get(seq.rid) is seq and seq in core.running:
            seq.computed = base + accepted  # the last token's and the accepted drafts' K/V
            keep = blocks_for(seq.computed + 1, core.block_size)
            if len(seq.blocks) > keep:  # what is beyond holds refused tokens only: never read
                core.pool.release(seq.blocks[keep:])
                del seq.blocks[keep:]
            core.commit_blocks(seq)
        return out
