"""Incremental detokenization: the text of a growing id list, at a bounded cost per token (pure).

    detok = Detokenizer(tokenizer)
    delta = detok.push(token_id)   # new text ('' while inside a multi-byte character)
    rest = detok.flush()           # at the end: what never completed, as ``decode`` shows it
    held = detok.peek()            # the text held back now, where it is whole characters

Decoding every id again at each token costs O(n) per token, O(n^2) per request. Here each step
decodes only a short window, ``ids[prefix:]``, where ``read`` is where the text released so far
ends and ``prefix`` is where the window before it starts. The new text is what
``decode(ids[prefix:])`` adds to ``decode(ids[prefix:read])``. Starting both decodes on the
same tokens makes what a tokenizer does to the first token of a sequence (SentencePiece strips
its leading space) happen on both sides, so the difference is the text the full decode adds.
Nothing is released while the text ends inside a character (U+FFFD, which ``decode`` gives for
incomplete UTF-8), while a token adds no text (a special token), or while the last id is one
whose text the next id can still change (a tokenizer's ``unstable_ids``: byte-fallback pieces,
whose run ``decode`` replaces byte by byte when it is not valid UTF-8; the run ends at the
next id that adds text, so a skipped special token does not end it): then the window grows.

The released pieces concatenate to ``tokenizer.decode(ids)`` for tokenizers whose decoding of
a sequence that starts on a character boundary does not depend on the ids before it (byte-level
BPE, byte fallback, SentencePiece, the byte tokenizer); the tests compare the two. A tokenizer
whose window does not extend its prefix's text gets a whole decode for that token (correct,
and counted in ``full_decodes``).
"""

from __future__ import annotations

from torch_tensorrt_dist.models.tokenizer import Tokenizer

__all__ = ["INCOMPLETE", "Detokenizer"]

#: what ``decode`` gives for bytes that do not (yet) form a character
INCOMPLETE = "\ufffd"


class Detokenizer:
    """The text of one sequence of generated ids, released as it completes."""

    __slots__ = (
        "_ids",
        "_prefix",
        "_prefix_text",
        "_read",
        "_released",
        "_run",
        "_text",
        "_tok",
        "_unstable",
        "full_decodes",
    )

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self._unstable: frozenset[int] = getattr(tokenizer, "unstable_ids", frozenset())
        self._run = False  # the text ends in a run of unstable ids
        self._text = ""  # decode(ids[prefix:]) at the last push
        self._ids: list[int] = []
        self._prefix = 0  # the window starts here
        self._read = 0  # the text released so far ends here
        self._prefix_text = ""  # decode(ids[prefix:read])
        self._released = 0  # characters released so far
        #: tokens whose text needed a decode of every id (a tokenizer the window cannot serve)
        self.full_decodes = 0

    @property
    def ids(self) -> list[int]:
        """Every id pushed so far."""
        return self._ids

    def push(self, token: int) -> str:
        """Add one id; return the text it completes ('' while a character is incomplete)."""
        self._ids.append(token)
        return self._release(final=False)

    def flush(self) -> str:
        """The text of the ids not released yet, at the end of the sequence (bytes that never
        completed a character show as U+FFFD, as ``decode`` gives them)."""
        return self._release(final=True) if self._read < len(self._ids) else ""

    def peek(self) -> str:
        """The text of the ids not released yet, without releasing it, up to where a character
        is incomplete ('' where the window changed its prefix's text). A byte-fallback run is
        held until the next id that adds text, and a token's text that ends inside a character
        until the character completes, yet the text before is what ``decode`` of the ids so
        far gives: a stop string can be found in it at the id that completes it."""
        if self._read == len(self._ids) or not self._text.startswith(self._prefix_text):
            return ""
        return self._text[len(self._prefix_text) :].rstrip(INCOMPLETE)

    def _release(self, *, final: bool) -> str:
        ids = self._ids
        text = self._tok.decode(ids[self._prefix :])
        if ids[-1] in self._unstable:
            self._run = True
        elif text != self._text:
            self._run = False  # an id that adds text ends a byte-fallback run
        self._text = text
        if not final and (
            self._run or len(text) <= len(self._prefix_text) or text.endswith(INCOMPLETE)
        ):
            return ""  # no new text yet, inside a character or a byte-fallback run: wait
        if text.startswith(self._prefix_text):
            delta = text[len(self._prefix_text) :]
        else:  # the window changed its prefix's text: fall back to the whole sequence
            self.full_decodes += 1
            delta = self._tok.decode(ids)[self._released :]
        self._released += len(delta)
        # the window moves on: it now starts where the released text ended before
        self._prefix, self._read = self._read, len(ids)
        self._prefix_text = self._text = self._tok.decode(ids[self._prefix : self._read])
        return delta

    def __repr__(self) -> str:
        return f"Detokenizer({len(self._ids)} ids, read {self._read})"
