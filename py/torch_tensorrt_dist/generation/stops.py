"""A request's text as it grows: stop strings, held-back prefixes, whole characters only (pure).

    tail = StopText(tokenizer, stop=("\\n\\n",))
    piece, hit = tail.push(token_id)   # the new text that is safe to show; hit: a stop string
    rest, hit = tail.flush()           # at the end (stop token, length): what was held back

Text that could still become a stop string is held back until it cannot; text that ends inside
a multi-byte character (the tokenizer decodes it to U+FFFD) waits for the next token. The text
comes from an incremental :class:`~torch_tensorrt_dist.generation.detok.Detokenizer`, so a
token costs the same at the end of a long request as at its start. When a
stop string appears, the text before it is the last piece and the stop string is never shown:
a stop string is found at the token that completes it, also inside a byte-fallback run the
detokenizer still holds (``Detokenizer.peek``), and ``flush`` searches what it releases too.
The function of the ids alone: every rank that runs it gets the same answer.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.detok import Detokenizer
from torch_tensorrt_dist.models.tokenizer import Tokenizer

__all__ = ["MAX_STOP_STRINGS", "StopText", "check_stop_strings", "held_back"]

#: OpenAI's limit on ``stop`` strings per request.
MAX_STOP_STRINGS = 4


def check_stop_strings(stop: Sequence[str]) -> tuple[str, ...]:
    """Validate stop strings (at most 4, none empty); return them as a tuple."""
    if len(stop) > MAX_STOP_STRINGS:
        raise ConfigError(f"{len(stop)} stop strings given; at most {MAX_STOP_STRINGS} are allowed")
    if any(not isinstance(s, str) or not s for s in stop):
        raise ConfigError("a stop string is empty or not a string; give non-empty strings")
    return tuple(stop)


def held_back(text: str, stop: Sequence[str]) -> int:
    """How many trailing characters of ``text`` are a proper prefix of some stop string."""
    best = 0
    for s in stop:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


class StopText:
    """The text of one request's generated ids, released piece by piece.

    Each token costs one incremental decode (:class:`Detokenizer`: a window of a few ids) and
    a stop-string search over the text not released yet plus the last ``len(stop) - 1``
    characters released, so a request's text costs time linear in its length."""

    def __init__(self, tokenizer: Tokenizer, stop: Sequence[str] = ()) -> None:
        self._detok = Detokenizer(tokenizer)
        self._stop = check_stop_strings(stop)
        self._keep = max((len(s) for s in self._stop), default=1) - 1
        self._pieces: list[str] = []  # released
        self._tail = ""  # the last ``_keep`` characters released
        self._pending = ""  # decoded, held back: it could still become a stop string

    @property
    def text(self) -> str:
        """Everything released so far."""
        return "".join(self._pieces)

    def push(self, token: int) -> tuple[str, bool]:
        """Add one generated id; return (new text to show, a stop string was reached)."""
        delta = self._detok.push(token)
        if not self._stop:
            if delta:
                self._pieces.append(delta)
            return delta, False
        if not delta:
            # inside a character (or no text): wait, unless the text the detokenizer holds (a
            # byte-fallback run) completes a stop string already
            held = self._detok.peek()
            hit = self._cut(self._pending + held) if held else None
            return hit if hit is not None else ("", False)
        hit = self._cut(self._pending + delta)
        if hit is not None:
            return hit
        # a stop string can only start in the unreleased part (or overlap its start)
        text, sent = self._tail + self._pending + delta, len(self._tail)
        end = len(text) - held_back(text, self._stop)
        if end <= sent:
            self._pending = text[sent:]
            return "", False
        return self._release(text[sent:end], text[end:]), False

    def flush(self) -> tuple[str, bool]:
        """At the end of a request (a stop id, the length): the held-back text (bytes that never
        completed a character show as U+FFFD, as ``decode`` gives them) and whether a stop
        string is in it; then only the text before the stop string."""
        rest = self._pending + self._detok.flush()
        hit = self._cut(rest) if self._stop else None
        return hit if hit is not None else (self._release(rest, ""), False)

    def _cut(self, unreleased: str) -> tuple[str, bool] | None:
        """(the text before the first stop string, True) when ``unreleased`` (after what was
        released) holds one, else None; a stop string can start in the released tail."""
        text, sent = self._tail + unreleased, len(self._tail)
        hits = [i for i in (text.find(s) for s in self._stop) if i >= 0]
        if not hits:
            return None
        return self._release(text[sent : max(min(hits), sent)], ""), True

    def _release(self, piece: str, pending: str) -> str:
        self._pending = pending
        if piece:
            self._pieces.append(piece)
            if self._keep:
                self._tail = (self._tail + piece)[-self._keep :]
        return piece
