"""Incremental detokenisation: the new text of each row after every generated token."""

from __future__ import annotations

from torch_tensorrt_dist.models.tokenizer import Tokenizer

__all__ = ["TextStream"]


class TextStream:
    """Feeds token ids, returns only the text not yet returned (whole characters only)."""

    def __init__(self, tokenizer: Tokenizer, rows: int) -> None:
        self._tok = tokenizer
        self._ids: list[list[int]] = [[] for _ in range(rows)]
        self._sent = [0] * rows
        self._done = [False] * rows

    def push(self, step_ids: list[int], stop_ids: tuple[int, ...] = ()) -> list[str]:
        """Add one token per row; return each row's new text ('' for finished rows)."""
        pieces = []
        for row, tok in enumerate(step_ids):
            if self._done[row]:
                pieces.append("")
                continue
            if tok in stop_ids:  # a stop token ends the row and is not shown
                self._done[row] = True
                pieces.append("")
                continue
            self._ids[row].append(tok)
            text = self._tok.decode(self._ids[row])
            if text.endswith("\ufffd"):
                pieces.append("")  # an incomplete UTF-8 sequence: wait for the next token
                continue
            pieces.append(text[self._sent[row] :])
            self._sent[row] = len(text)
        return pieces
