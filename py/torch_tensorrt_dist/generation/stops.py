"""A request's text as it grows: stop strings, held-back prefixes, whole characters only (pure).

    tail = StopText(tokenizer, stop=("\\n\\n",))
    piece, hit = tail.push(token_id)   # the new text that is safe to show; hit: a stop string
    rest = tail.flush()                # at the end (stop token, length): what was held back

Text that could still become a stop string is held back until it cannot; text that ends inside
a multi-byte character (the tokenizer decodes it to U+FFFD) waits for the next token. When a
stop string appears, the text before it is the last piece and the stop string is never shown.
The function of the ids alone: every rank that runs it gets the same answer.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.models.tokenizer import Tokenizer

__all__ = ["MAX_STOP_STRINGS", "StopText", "check_stop_strings", "held_back"]

#: OpenAI's limit on ``stop`` strings per request.
MAX_STOP_STRINGS = 4
_INCOMPLETE = "\ufffd"


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
    """The text of one request's generated ids, released piece by piece."""

    def __init__(self, tokenizer: Tokenizer, stop: Sequence[str] = ()) -> None:
        self._tok = tokenizer
        self._stop = check_stop_strings(stop)
        self._ids: list[int] = []
        self._text = ""
        self._sent = 0  # characters of _text already released

    @property
    def text(self) -> str:
        """Everything released so far."""
        return self._text[: self._sent]

    def push(self, token: int) -> tuple[str, bool]:
        """Add one generated id; return (new text to show, a stop string was reached)."""
        self._ids.append(token)
        text = self._tok.decode(self._ids)
        if text.endswith(_INCOMPLETE):
            return "", False  # inside a multi-byte character: wait for the next token
        self._text = text
        if self._stop:
            # a stop string can only start in the unreleased part (or overlap its start)
            start = max(0, self._sent - max(len(s) for s in self._stop) + 1)
            hits = [i for i in (text.find(s, start) for s in self._stop) if i >= 0]
            if hits:
                end = max(min(hits), self._sent)
                piece, self._sent = text[self._sent : end], end
                self._text = text[:end]
                return piece, True
        end = len(text) - held_back(text, self._stop)
        if end <= self._sent:
            return "", False
        piece, self._sent = text[self._sent : end], end
        return piece, False

    def flush(self) -> str:
        """The held-back text, at the end of a request that did not stop on a stop string
        (bytes that never completed a character show as U+FFFD, as ``decode`` gives them)."""
        self._text = self._tok.decode(self._ids) if self._ids else self._text
        piece, self._sent = self._text[self._sent :], len(self._text)
        return piece
