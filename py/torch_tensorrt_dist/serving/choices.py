"""The sequences of one HTTP request as their pieces arrive, the choices returned, and their
logprobs in OpenAI's two shapes (pure; rank 0's HTTP process).

    seqs = Sequences(prompts=2, n=1, per_prompt=3)     # best_of 3: the best 1 of 3 per prompt
    seqs.add(piece)                                    # Piece.index: prompt * per_prompt + j
    for index, seq in seqs.returned(): ...             # when seqs.done

A request of ``p`` prompts with ``n`` choices each (``best_of`` sequences generated per prompt,
at least ``n``) returns ``p x n`` choices, prompt-major (choice ``i * n + j``: prompt ``i``).
With ``best_of`` > ``n``, a prompt's choices are its ``n`` sequences of the highest cumulative
logprob (the sum of each token's logprob, as OpenAI and vLLM rank them), best first.

Logprobs (``completion_logprobs``, ``chat_logprobs``): each token's text is the token decoded
alone (``Tokenizer.token_text``); the logprob is the model's, after the grammar's mask and
before the penalties, temperature, top-k and top-p (``generation/logits_process.py``).
Completions: ``top_logprobs`` maps the ``logprobs`` most likely tokens and the sampled one (so
up to ``logprobs + 1`` entries, as OpenAI documents); ``text_offset`` is each token's position
in the choice's text. Chat: each token with its UTF-8 bytes and its ``top_logprobs`` most
likely alternatives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch_tensorrt_dist.generation.logits_process import TokenLogprobs
from torch_tensorrt_dist.serving.bridge import Piece

__all__ = ["Generated", "Sequences", "chat_logprobs", "completion_logprobs"]

TokenText = Callable[[int], str]


@dataclass
class Generated:
    """One sequence's text, token count and logprobs so far, and how it ended."""

    text: list[str] = field(default_factory=list)
    tokens: int = 0
    cached: int = 0
    finish: str | None = None
    logprobs: list[TokenLogprobs] = field(default_factory=list)

    @property
    def cumulative_logprob(self) -> float:
        return sum(t.logprob for t in self.logprobs)


class Sequences:
    """The sequences of one request (see the module docstring)."""

    def __init__(self, *, prompts: int, n: int, per_prompt: int) -> None:
        self.prompts, self.n, self.per_prompt = prompts, n, per_prompt
        self.seqs = [Generated() for _ in range(prompts * per_prompt)]
        self._open = len(self.seqs)

    def add(self, piece: Piece) -> Generated:
        seq = self.seqs[piece.index]
        seq.text.append(piece.text)
        seq.tokens += piece.tokens
        seq.cached += piece.cached
        seq.logprobs += piece.logprobs
        if piece.finish is not None and seq.finish is None:
            seq.finish = piece.finish
            self._open -= 1
        return seq

    @property
    def done(self) -> bool:
        return self._open == 0

    @property
    def tokens(self) -> int:
        """Tokens generated, every sequence's (``best_of``'s too: they were computed)."""
        return sum(s.tokens for s in self.seqs)

    @property
    def cached(self) -> int:
        return sum(s.cached for s in self.seqs)

    def returned(self) -> list[tuple[int, int, Generated]]:
        """(choice index, prompt, sequence) of each choice returned, in index order."""
        out = []
        for i in range(self.prompts):
            mine = self.seqs[i * self.per_prompt : (i + 1) * self.per_prompt]
            if self.per_prompt > self.n:  # best_of: the highest cumulative logprob first
                mine = sorted(mine, key=lambda s: s.cumulative_logprob, reverse=True)
            out += [(i * self.n + j, i, seq) for j, seq in enumerate(mine[: self.n])]
        return out


def completion_logprobs(
    entries: Sequence[TokenLogprobs], text_of: TokenText, offset: int = 0
) -> tuple[dict[str, Any], int]:
    """The completions ``logprobs`` object of ``entries``, each token's ``text_offset`` counted
    from ``offset``; and the offset after them (a stream continues from it)."""
    tokens, values, tops, offsets = [], [], [], []
    for e in entries:
        text = text_of(e.token)
        top = {text_of(t): v for t, v in e.top}
        top.setdefault(text, e.logprob)  # the sampled token is always there
        tokens.append(text)
        values.append(e.logprob)
        tops.append(top)
        offsets.append(offset)
        offset += len(text)
    body = {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops}
    return {**body, "text_offset": offsets}, offset


def _chat_token(text: str, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(entries: Sequence[TokenLogprobs], text_of: TokenText) -> dict[str, Any]:
    """The chat ``logprobs`` object of ``entries``."""
    content = []
    for e in entries:
        token = _chat_token(text_of(e.token), e.logprob)
        token["top_logprobs"] = [_chat_token(text_of(t), v) for t, v in e.top]
        content.append(token)
    return {"content": content}
