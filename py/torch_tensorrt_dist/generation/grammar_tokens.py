"""The grammar engine's tokenizer with its tokenization memoized (forced text costs less).

In a state where the grammar forces text (a tool call's function name, a JSON key, the
punctuation), llguidance's mask is the first token of the canonical tokenization of that text
(``compute_ff_tokens``); it tokenizes the rest of the forced text again at each such step
(the ``tokenizers`` encoder: 5-7 us of a 7.4 us mask at 1,024 tokens), the same few strings
step after step and row after row. :func:`memoized` gives the engine a tokenizer with the same
vocabulary whose tokenization is the original's (llguidance's own ``tokenize_str``, with its
changes to the ``tokenizers`` pipeline) looked up in a dictionary first: the same tokens, so the
same masks (``tests/test_grammar_tokens.py`` walks the serve grammars with both), for about
2 us a forced mask instead of 7.4.

The engine calls the tokenization back in Python, taking the interpreter lock for it (a
mask is otherwise computed without the lock)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

__all__ = ["MEMO_SIZE", "MemoTokenizer", "memoized"]

MEMO_SIZE = 4096
"""Texts whose tokens a :class:`MemoTokenizer` keeps; past that it starts afresh (forced text
comes from the grammars of the requests: a bounded set in practice, unbounded in principle)."""


class MemoTokenizer:
    """llguidance's ``TokenizerWrapper`` protocol over an ``LLTokenizer`` (``base``): its token
    bytes, special ids and end-of-text ids, and its tokenization memoized."""

    is_tokenizer_wrapper = True

    def __init__(self, base: Any, vocab_size: int, eos_ids: Sequence[int]) -> None:
        self._base, self._memo = base, dict[str, list[int]]()
        self.eos_token_id, self.bos_token_id = eos_ids[0], None
        self.tokens: list[bytes] = []
        self.special_token_ids: list[int] = []
        for i in range(vocab_size):
            text = base.decode_bytes([i])  # a special token's bytes without their marker
            if base.is_special_token(i):
                self.special_token_ids.append(i)  # the marker put back by llguidance
            elif text == f"<[{i}]>".encode():  # how the engine decodes a token of no bytes
                text = b""
            self.tokens.append(text)

    def __call__(self, text: str) -> list[int]:
        found = self._memo.get(text)
        if found is None:
            if len(self._memo) >= MEMO_SIZE:
                self._memo.clear()
            found = self._memo[text] = self._base.tokenize_str(text)
        return found


def memoized(base: Any, vocab_size: int, eos_ids: Sequence[int]) -> Any:
    """An ``LLTokenizer`` of ``base``'s vocabulary whose tokenization is ``base``'s, memoized."""
    import llguidance

    wrapper = cast(Any, MemoTokenizer(base, vocab_size, eos_ids))  # the protocol, not the class
    return llguidance.LLTokenizer(wrapper, n_vocab=vocab_size, eos_token=list(eos_ids))
