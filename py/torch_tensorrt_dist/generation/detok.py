"""Incremental detokenization: the text of a growing id list, released as soon as it is final,
at a bounded cost per token (pure).

    detok = Detokenizer(tokenizer)
    delta = detok.push(token_id)   # the new final text ('' while it can still change)
    rest = detok.flush()           # at the end: what was held, as ``decode`` shows it
    held = detok.peek()            # the text held back now, where it is whole characters

The rule: only text that can still change is held. A UTF-8 character is at most 4 bytes, so
only the last 1-3 bytes of the sequence can still complete one; ``decode`` shows them as one
trailing U+FFFD, and that one character is all that is held. Bytes that can no longer complete
a character (a stray continuation byte, a lead byte followed by something else) are final and
released as the U+FFFD ``decode`` shows for them. A byte-fallback run (``<0xE4>`` pieces, Llama
2 and Mistral style) is the one exception, because ``decode`` turns such a run into text only
when the whole run is valid UTF-8 and otherwise into one U+FFFD per byte, characters that were
complete included: a valid run is held until it ends (the next id that adds text) or turns
invalid; from the byte that makes it invalid on, which no later byte can repair, every byte of
the run is released at once as one U+FFFD.

Work per token: each step decodes a short window ``ids[start:]`` and releases what it adds after
the characters of that window already released. After each step the window moves on to start at
the third-last id that added text (the last one when nothing is held): the held bytes are in
those ids, and any stray continuation bytes at the new start decode to U+FFFD that were already
released, after which the decoding of the window and of the whole sequence agree again (UTF-8
resynchronizes within a character). A byte-fallback run is tracked byte by byte (an incremental
UTF-8 check, no decode) and decoded once when it ends. Starting every decode of a window on the
same ids makes what a tokenizer does to the first token of a sequence (SentencePiece strips its
leading space) happen in all of them alike, so the text it adds is what the full decode adds.

The released pieces concatenate to ``tokenizer.decode(ids)`` for tokenizers whose decoding of a
sequence does not depend on ids more than a character before (byte-level BPE, byte fallback,
SentencePiece, the byte tokenizer); the tests compare the two over random ids. A window whose
text does not extend the text it had (a tokenizer this rule does not fit) gets a whole decode
for that token (correct, and counted in ``full_decodes``).
"""

from __future__ import annotations

import codecs
from collections.abc import Mapping

from torch_tensorrt_dist.models.tokenizer import Tokenizer

__all__ = ["INCOMPLETE", "Detokenizer"]

#: what ``decode`` gives for bytes that do not (yet) form a character
INCOMPLETE = "\ufffd"

#: ids that added text which the window keeps when a character is incomplete: its 1-3 bytes
#: are in the last three ids that added text (each added at least one byte)
_KEEP_HOLDING = 3


class _Run:
    """A byte-fallback run so far: its bytes checked as UTF-8 one by one."""

    __slots__ = ("chars", "check", "last", "n", "valid")

    def __init__(self) -> None:
        self.check = codecs.getincrementaldecoder("utf-8")("strict")
        self.chars: list[str] = []  # the run's characters so far (while valid)
        self.n = 0  # bytes in the run
        self.last = 0  # index of its last byte piece
        self.valid = True  # no byte so far made it invalid (an incomplete end is still valid)

    def add(self, byte: int) -> None:
        self.n += 1
        if self.valid:
            try:
                self.chars.append(self.check.decode(bytes((byte,))))
            except UnicodeDecodeError:
                self.valid, self.chars = False, []

    @property
    def complete(self) -> bool:
        """Valid and not inside a character."""
        return self.valid and not self.check.getstate()[0]


class Detokenizer:
    """The text of one sequence of generated ids, released as it becomes final."""

    __slots__ = (
        "_added",
        "_bytes",
        "_head",
        "_ids",
        "_released",
        "_run",
        "_skips",
        "_start",
        "_text",
        "_tok",
        "full_decodes",
    )

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self._bytes: Mapping[int, int] = getattr(tokenizer, "byte_pieces", {})
        self._skips: dict[int, bool] = {}  # id -> decode skips it (a special, an unknown id)
        self._ids: list[int] = []
        self._start = 0  # the window is ids[start:]
        self._text = ""  # decode(ids[start:]) at the last decode
        self._head = ""  # the part of it released already (a prefix)
        self._added: list[int] = []  # indices in the window of ids that added text
        self._run: _Run | None = None  # the byte-fallback run the ids end in
        self._released = 0  # characters released so far
        #: tokens whose text needed a decode of every id (a tokenizer the window cannot serve)
        self.full_decodes = 0

    @property
    def ids(self) -> list[int]:
        """Every id pushed so far."""
        return self._ids

    def push(self, token: int) -> str:
        """Add one id; return the text that became final ('' while it can still change)."""
        self._ids.append(token)
        byte = self._bytes.get(token)
        run = self._run
        if byte is not None:
            if run is None:
                run = self._run = _Run()
            was_valid = run.valid
            run.add(byte)
            run.last = len(self._ids) - 1
            if run.valid:
                return ""  # held: the run may still turn invalid, or end
            # invalid now and for good: every byte of it is U+FFFD (text before it is final)
            before = self._text[len(self._head) :] if was_valid else ""
            return self._emit(before + INCOMPLETE * (run.n if was_valid else 1))
        if run is not None and self._skipped(token):
            return ""  # ``decode`` skips it: the run goes on
        if run is not None:
            self._run = None
            if not run.valid:  # all of it released: the window restarts on its last byte
                self._start, self._added = run.last, []
                self._text = self._head = self._decode(run.last, run.last + 1)
        return self._window(final=False)

    def flush(self) -> str:
        """The text not released yet, at the end of the sequence (bytes that never completed a
        character show as U+FFFD, as ``decode`` gives them)."""
        if self._run is not None and not self._run.valid:
            return ""  # released byte by byte already
        return self._window(final=True)

    def peek(self) -> str:
        """The text held back now up to where a character is incomplete, without releasing it:
        a valid byte-fallback run's characters so far ('' while it is inside a character),
        else ''. A stop string can be found in it at the id that completes it."""
        run = self._run
        if run is None or not run.complete:
            return ""
        if self._released == 0:  # a run that starts the text: the decode may strip a space
            return self._decode(0, len(self._ids))
        return self._text[len(self._head) :] + "".join(run.chars)

    def _window(self, *, final: bool) -> str:
        text = self._decode(self._start, len(self._ids))
        if not text.startswith(self._head):
            return self._full(final=final)
        if len(text) > len(self._text):
            self._added.append(len(self._ids) - 1)
        held = 1 if not final and text.endswith(INCOMPLETE) else 0
        end = max(len(text) - held, len(self._head))
        piece = text[len(self._head) : end]
        self._text, self._head = text, text[:end]
        self._slide(held)
        return self._emit(piece)

    def _full(self, *, final: bool) -> str:
        """The window changed text it had released: decode everything (counted)."""
        self.full_decodes += 1
        text = self._decode(0, len(self._ids))
        held = 1 if not final and text.endswith(INCOMPLETE) else 0
        end = max(len(text) - held, self._released)
        piece = text[self._released : end]
        self._start, self._added = 0, [len(self._ids) - 1]
        self._text, self._head = text, text[:end]
        return self._emit(piece)

    def _slide(self, held: int) -> None:
        """Start the window later where the text held (``held`` characters) stays the same."""
        keep = _KEEP_HOLDING if held else 1
        if len(self._added) < keep or self._added[-keep] <= self._start:
            return
        start = self._added[-keep]
        text = self._decode(start, len(self._ids))
        released = len(text) - (len(self._text) - len(self._head))
        if released < 0 or text[released:] != self._text[len(self._head) :]:
            return  # the held text decodes otherwise from there: keep the window
        self._start, self._added = start, self._added[-keep:]
        self._text, self._head = text, text[:released]

    def _skipped(self, token: int) -> bool:
        """Whether ``decode`` skips ``token`` (a special or unknown id): it adds nothing after
        a byte piece (asked once per id)."""
        skipped = self._skips.get(token)
        if skipped is None:
            piece = next(iter(self._bytes))
            before = self._tok.decode([piece])
            skipped = self._skips[token] = self._tok.decode([piece, token]) == before
        return skipped

    def _decode(self, start: int, end: int) -> str:
        return self._tok.decode(self._ids[start:end])

    def _emit(self, piece: str) -> str:
        self._released += len(piece)
        return piece

    def __repr__(self) -> str:
        return f"Detokenizer({len(self._ids)} ids, window from {self._start})"
