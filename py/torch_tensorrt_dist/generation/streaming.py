"""Incremental detokenisation: the new text of each row after every generated token
(one :class:`~torch_tensorrt_dist.generation.detok.Detokenizer` per row)."""

from __future__ import annotations

from collections.abc import Sequence

from torch_tensorrt_dist.generation.detok import Detokenizer
from torch_tensorrt_dist.models.tokenizer import Tokenizer

__all__ = ["TextStream"]


class TextStream:
    """Feeds token ids, returns only the text not yet returned (whole characters only)."""

    def __init__(self, tokenizer: Tokenizer, rows: int) -> None:
        self._rows = [Detokenizer(tokenizer) for _ in range(rows)]
        self._done = [False] * rows

    def push(
        self, step_ids: Sequence[int | Sequence[int]], stop_ids: tuple[int, ...] = ()
    ) -> list[str]:
        """Add each row's new tokens (one id, or a list of ids: none, one or several, as
        ``Generator.generate`` hands them to ``on_step``); return each row's new text ('' for
        finished rows)."""
        pieces = []
        for row, new in enumerate(step_ids):
            text = []
            for tok in [new] if isinstance(new, int) else new:
                if self._done[row]:
                    break
                if tok in stop_ids:  # a stop token ends the row and is not shown
                    self._done[row] = True
                    break
                # '' while a UTF-8 sequence is incomplete: it waits for the next token
                text.append(self._rows[row].push(tok))
            pieces.append("".join(text))
        return pieces
