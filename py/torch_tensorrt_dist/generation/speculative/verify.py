"""One position of a verified row: the target's token there, and whether the draft holds.

The core walks a speculating row's positions in order (its last token, then each proposed
token): at position j the row's sampling state (grammar, penalty counts, ``min_tokens``) has
advanced over the tokens accepted before j, so the logits are processed exactly as plain
decoding would process them at that point (grammar mask, raw logprobs, the request's logits
settings: ``sampler.py``'s processed path, one row). Then

- greedy: the target's token is the argmax; the draft holds where they are equal (a row
  whose logits are not processed: every position's argmax in one call, :func:`verify_picks`);
- sampling: :func:`~.rejection.accept_point_mass` over the probabilities plain sampling draws
  from (``sampling.sample_probs``), with the request's generator; the last position (no draft
  left) draws as plain sampling does.

A row's exception comes back as a :class:`~..sampler.Failure` naming the stage, as in
``sample_step``.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from torch_tensorrt_dist.generation.draw import draw
from torch_tensorrt_dist.generation.grammar import (
    GrammarError,
    Grammars,
    apply_bitmask_,
    new_bitmask,
)
from torch_tensorrt_dist.generation.logits_process import (
    TokenLogprobs,
    gather_logprobs,
    log_probs,
)
from torch_tensorrt_dist.generation.sampler import (
    LOGPROB_FLOOR,
    Failure,
    NoTokenLeft,
    Pick,
    RowSampling,
    _no_token,
)
from torch_tensorrt_dist.generation.sampling import sample_probs
from torch_tensorrt_dist.generation.speculative.rejection import accept_point_mass

__all__ = ["verify_pick", "verify_picks"]


def verify_picks(
    logits: Tensor, state: RowSampling, grammars: Grammars | None, draft: list[int]
) -> Iterator[tuple[Pick | Failure, bool]]:
    """``logits`` [len(draft) + 1, V] of a row: each position's (token, whether it is the
    draft's token there), in order; the caller stops where a draft token is refused (or the
    row finishes) and the state advances over each pick before the next position's.

    Greedy over raw logits (no grammar, penalties or logprobs): every position's argmax in
    one call, ties to the lowest id as :func:`verify_pick`'s. Otherwise each position is
    processed when it is reached (:func:`verify_pick`: the state has advanced over the
    tokens accepted before it)."""
    n = len(draft) + 1
    if state.cfg.greedy and not state.processed:
        for j, token in enumerate(logits[:n].argmax(-1).tolist()):
            yield Pick(token), j < len(draft) and token == draft[j]
        return
    for j in range(n):
        yield verify_pick(logits[j], state, grammars, draft[j] if j < len(draft) else None)


def verify_pick(
    logits: Tensor, state: RowSampling, grammars: Grammars | None, draft: int | None
) -> tuple[Pick | Failure, bool]:
    """``logits`` [V] (the model's dtype) at one position of a row: (its token, whether it is
    ``draft``, the proposed token at that position; None: the last position, no draft)."""
    if not state.processed:
        if state.cfg.greedy:
            token = int(logits.argmax())
            return Pick(token), token == draft
        try:
            return _draw(sample_probs(logits[None], state.cfg)[0], state, draft)
        except MemoryError:
            raise
        except Exception as exc:
            return Failure("sampling", exc), False
    x = logits[None].to(torch.float32, copy=True)  # [1, V]
    mask_row = None
    if state.matcher is not None:
        if grammars is None:  # a row with a grammar joined only where there are grammars
            raise AssertionError("a grammar row without the grammar engine")
        bitmask = new_bitmask(1, grammars.vocab_size)
        try:
            grammars.fill_bitmask([(state.matcher, 0)], bitmask)
        except MemoryError:
            raise
        except Exception as exc:
            return Failure("grammar", exc), False
        reason = state.matcher.error
        if reason is not None:
            error = GrammarError(f"the grammar engine failed: {reason}", reason=reason)
            return Failure("grammar", error), False
        apply_bitmask_(x, bitmask, [0])
        mask_row = bitmask[0]
    lp = log_probs(x, [0]) if state.cfg.logprobs is not None else None
    try:
        rows = state.processing(x.shape[-1])
        if rows is not None and rows.active:
            rows.apply_(x[0], hold=state.holds(mask_row))
    except MemoryError:
        raise
    except Exception as exc:
        return Failure("processing", exc), False
    if not bool(torch.isfinite(x).any()):
        return Failure("masked", NoTokenLeft(_no_token(state))), False
    try:
        if state.cfg.greedy:
            token = int(x.argmax())
            pick, held = Pick(token), token == draft
        else:
            pick, held = _draw(sample_probs(x, state.cfg)[0], state, draft)
    except MemoryError:
        raise
    except Exception as exc:
        return Failure("sampling", exc), False
    if lp is None:
        return pick, held
    got = gather_logprobs(lp, [pick.token], [state.cfg.logprobs or 0])[0]
    floor = max(got.logprob, LOGPROB_FLOOR)
    return Pick(got.token, TokenLogprobs(got.token, floor, got.top)), held


def _draw(probs: Tensor, state: RowSampling, draft: int | None) -> tuple[Pick, bool]:
    if draft is None:
        return Pick(draw(probs.unsqueeze(0), [state.gen])[0]), False
    held, token = accept_point_mass(probs, draft, state.gen)
    return Pick(token), held
