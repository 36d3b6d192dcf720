"""The draft-model proposer: a second, smaller model's greedy tokens, over its own paged cache.

    draft = DraftProposer(ModelRunner(small_model, engine="inductor", max_batch_size=8))
    proposals = draft.propose_rows([(rid, tokens, k), ...], live=core.sequences)

The draft model runs on every rank as the target does (sharded with the same TP, its own step
compiled by the same engine, its own block pool sized for the target's rows): every rank feeds
it the same rows in the same order (the step plan's drafts, ``Speculator.drafts``) and takes
its argmax, so the ranks propose the same tokens and the draft's collectives pair up.

Per row the proposer keeps the tokens whose K/V its cache holds. A proposal truncates them to
the common prefix with the row's tokens now (what the target accepted; a refused draft token
differs there), feeds the rest in one call with every other row's (chunked by the runner's
prefill limit), then decodes one token a call, the rows that want more in each call, until
each row has its k. A row's cache is a cache: rows the core no longer holds are dropped at the
next proposal, and where blocks run short the rows not in this call are dropped (recomputed
from their first token when they propose again).
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from typing import TYPE_CHECKING

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.kv_blocks import BlockPool, blocks_for
from torch_tensorrt_dist.generation.step_inputs import step_inputs

if TYPE_CHECKING:
    from torch_tensorrt_dist.generation.runner import StepRunner
    from torch_tensorrt_dist.models.llama_args import ModelArgs

__all__ = ["DraftProposer", "check_draft"]


def check_draft(
    target: ModelArgs, draft: ModelArgs, target_params: int | None, draft_params: int | None
) -> None:
    """Refuse a draft model with another vocabulary than the target's, or a larger one
    (``target_params`` / ``draft_params``: the parameters, where known)."""
    if draft.vocab_size != target.vocab_size:
        raise ConfigError(
            f"--draft-model has a vocabulary of {draft.vocab_size} tokens, the target "
            f"{target.vocab_size}: a draft model needs the target's tokenizer"
        )
    if target_params is not None and draft_params is not None and draft_params > target_params:
        raise ConfigError(
            f"--draft-model is larger than the target ({draft_params:,} parameters, the "
            f"target {target_params:,}): a draft model is a smaller one"
        )


class _Row:
    """A row's place in the draft's cache: the tokens whose K/V it holds, their blocks."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.blocks: list[int] = []


class DraftProposer:
    """Greedy proposals of a draft model's runner (its step over its own paged pools)."""

    def __init__(self, runner: StepRunner) -> None:
        self.runner = runner
        self.pool = BlockPool(runner.num_blocks, runner.block_size, prefix_caching=False)
        self.rows: dict[int, _Row] = {}
        #: the draft's step calls so far
        self.calls = 0

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """One row's proposal, uncached (the :class:`~.proposer.Proposer` protocol)."""
        out = self.propose_rows([(-1, tokens, k)], live=set(self.rows) | {-1})
        self._drop(-1)
        return out[0]

    def propose_rows(
        self, rows: Sequence[tuple[int, Sequence[int], int]], *, live: Container[int]
    ) -> list[list[int]]:
        """Each row's ``k`` greedy draft tokens after its ``tokens``; ``live``: the ids the
        core still holds (the others' cache is dropped first)."""
        for rid in [r for r in self.rows if r not in live]:
            self._drop(rid)
        if not rows:
            return []
        bs, need = self.pool.block_size, []
        for rid, tokens, k in rows:
            if k < 1 or len(tokens) < 1:
                raise ConfigError(f"a draft of {k} tokens after {len(tokens)} tokens")
            row = self.rows.setdefault(rid, _Row())
            common = 0
            for a, b in zip(row.tokens, tokens):
                if a != b:
                    break
                common += 1
            common = min(common, len(tokens) - 1)  # the last token's logits are needed
            del row.tokens[common:]
            keep = blocks_for(common, bs)
            self.pool.release(row.blocks[keep:])
            del row.blocks[keep:]
            need.append(blocks_for(len(tokens) + k - 1, bs) - keep)
        self._make_room(sum(need), {rid for rid, _, _ in rows})
        for (rid, _, _), n in zip(rows, need):
            self.rows[rid].blocks += self.pool.allocate(n)
        feeds = [list(tokens[len(self.rows[rid].tokens) :]) for rid, tokens, _ in rows]
        out: list[list[int]] = [[] for _ in rows]
        while True:  # the rows' new tokens, the runner's prefill limit a call
            now = [i for i, f in enumerate(feeds) if f]
            limit = self.runner.limits.tokens
            picks = self._call([(rows[i][0], feeds[i][:limit]) for i in now])
            for i, pick in zip(now, picks):
                feeds[i] = feeds[i][limit:]
                if not feeds[i]:
                    out[i].append(pick)
            if not any(feeds):
                break
        while True:  # one token a call, the rows that want more
            now = [i for i, (_, _, k) in enumerate(rows) if len(out[i]) < k]
            if not now:
                return out
            picks = self._call([(rows[i][0], [out[i][-1]]) for i in now])
            for i, pick in zip(now, picks):
                out[i].append(pick)

    def _call(self, feeds: list[tuple[int, list[int]]]) -> list[int]:
        """One step of the draft over rows' next tokens: each row's greedy next token."""
        run = self.runner
        spans = []
        for rid, ids in feeds:
            row = self.rows[rid]
            spans.append((ids, len(row.tokens), row.blocks))
            row.tokens += ids
        inputs = step_inputs(
            spans, run.limits, run.device, mark_dynamic=run.mark_dynamic, pack=run.pack
        )
        self.calls += 1
        logits = run.step(*inputs)  # [R, V]
        return [int(i) for i in logits.argmax(dim=-1).tolist()]

    def _make_room(self, blocks: int, keep: set[int]) -> None:
        """Drop other rows' caches, the oldest first, until ``blocks`` blocks are free."""
        for rid in list(self.rows):
            if self.pool.available >= blocks:
                return
            if rid not in keep:
                self._drop(rid)
        if self.pool.available < blocks:
            raise ConfigError(
                f"the draft model's cache holds {self.pool.num_blocks - 1} blocks; this step's "
                f"proposals need {blocks} more"
            )

    def _drop(self, rid: int) -> None:
        row = self.rows.pop(rid)
        self.pool.release(row.blocks)
