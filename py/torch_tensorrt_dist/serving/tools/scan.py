"""Reading JSON text that may still be growing (pure): where each call object starts and ends,
and where each of its members' values does, without waiting for the text to be complete.

    spans = objects('[{"a": 1}, {"b"', depth=1)      # [(1, 9), (11, None)]: the 2nd not closed
    members, closed = members_of('{"name": "f", "arguments": {"x"')
    # {"name": (9, 12), "arguments": (27, None)}, False: the value of arguments not closed yet

A span is ``(start, end)`` with ``end`` one past the last character, or None while the text
has not closed it. Text that cannot be JSON raises :class:`Malformed`.

A stream reads the same as its text grows, each character once (:class:`Reader`: the objects
and their members as the functions above give them on the text so far; :class:`ValueEnd`:
:func:`value_end`); ``parse`` of a whole text uses the functions.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["Malformed", "Member", "Reader", "ValueEnd", "members_of", "objects", "value_end"]

_WS = " \t\r\n"
_SCALAR_END = set(_WS) | {",", "}", "]"}


class Malformed(ValueError):
    """Text that no continuation can make valid JSON."""


def _string_end(text: str, i: int) -> int | None:
    """One past the closing quote of the string opening at ``text[i]`` (None: not closed)."""
    j, n = i + 1, len(text)
    while j < n:
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == '"':
            return j + 1
        j += 1
    return None


def value_end(text: str, i: int) -> int | None:
    """One past the JSON value starting at ``text[i]`` (None: the text stops inside it)."""
    c, n = text[i], len(text)
    if c == '"':
        return _string_end(text, i)
    if c not in "{[":
        j = i
        while j < n and text[j] not in _SCALAR_END:
            j += 1
        return j if j < n else None  # a number may still grow
    depth, j = 0, i
    while j < n:
        c = text[j]
        if c == '"':
            end = _string_end(text, j)
            if end is None:
                return None
            j = end
            continue
        if c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return None


def objects(text: str, depth: int) -> list[tuple[int, int | None]]:
    """The spans of the JSON objects opening at nesting ``depth`` of ``text`` (brackets and
    braces counted, strings skipped; text outside any bracket, such as tags, is ignored)."""
    out: list[tuple[int, int | None]] = []
    level, j, n = 0, 0, len(text)
    while j < n:
        c = text[j]
        if c == '"' and level > 0:
            end = _string_end(text, j)
            if end is None:
                break
            j = end
            continue
        if c in "{[":
            if c == "{" and level == depth:
                out.append((j, None))
            level += 1
        elif c in "}]":
            level -= 1
            if level < 0:
                raise Malformed(f"{c!r} at character {j} closes nothing")
            if c == "}" and level == depth and out and out[-1][1] is None:
                out[-1] = (out[-1][0], j + 1)
        j += 1
    return out


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def members_of(obj: str) -> tuple[dict[str, tuple[int, int | None]], bool]:
    """The members of the JSON object ``obj`` (its text from its ``{``, maybe cut short): key ->
    the span of its value in ``obj``; and whether the object is closed."""
    if not obj.startswith("{"):
        raise Malformed(f"a call must be a JSON object, got {obj[:20]!r}")
    out: dict[str, tuple[int, int | None]] = {}
    i, n = 1, len(obj)
    while True:
        i = _skip(obj, i)
        if i >= n:
            return out, False
        if obj[i] == "}":
            return out, True
        if obj[i] == "," and out:
            i = _skip(obj, i + 1)
            if i >= n:
                return out, False
        if obj[i] != '"':
            raise Malformed(f"expected a member name at {obj[i : i + 20]!r}")
        end = _string_end(obj, i)
        if end is None:
            return out, False
        key = json.loads(obj[i:end])
        i = _skip(obj, end)
        if i >= n:
            return out, False
        if obj[i] != ":":
            raise Malformed(f"expected ':' after {key!r}, got {obj[i : i + 20]!r}")
        i = _skip(obj, i + 1)
        if i >= n:
            return out, False
        stop = value_end(obj, i)
        out[key] = (i, stop)
        if stop is None:
            return out, False
        i = stop


class _Quoted:
    """Inside a JSON string, one character at a time: :meth:`closes` says whether a character
    is the closing quote (one after a backslash never is)."""

    __slots__ = ("esc",)

    def __init__(self) -> None:
        self.esc = False

    def closes(self, c: str) -> bool:
        if self.esc:
            self.esc = False
        elif c == "\\":
            self.esc = True
        elif c == '"':
            return True
        return False


class _Nest:
    """Inside a list or object, one character at a time after its opening bracket: :meth:`ends`
    says whether a character closes it (brackets counted, strings skipped)."""

    __slots__ = ("depth", "in_string", "quoted")

    def __init__(self) -> None:
        self.depth, self.in_string, self.quoted = 1, False, _Quoted()

    def ends(self, c: str) -> bool:
        if self.in_string:
            self.in_string = not self.quoted.closes(c)
        elif c == '"':
            self.in_string = True
        elif c in "{[":
            self.depth += 1
        elif c in "}]":
            self.depth -= 1
            return self.depth == 0
        return False


# member phases of the object being read (``members_of`` step by step)
_KEY, _AFTER_COMMA, _IN_KEY, _COLON, _VALUE, _IN_STRING, _IN_NEST, _IN_SCALAR, _DONE = range(9)


def _after_value(text: str, j: int) -> None:
    """Malformed where ``text[j]``, which ends a scalar, cannot follow a member (checked
    before the member changes: a Malformed character changes nothing)."""
    if text[j] == "]":
        raise Malformed(f"expected a member name at {text[j : j + 20]!r}")


class Member:
    """One call object read as its text grows: what :func:`members_of` gives on its text so
    far (``members``: key -> [start, end or None], positions in the whole text; ``closed``)."""

    __slots__ = (
        "_at",
        "_key",
        "_nest",
        "_phase",
        "_quoted",
        "closed",
        "end",
        "members",
        "start",
    )

    def __init__(self, start: int) -> None:
        self.start: int = start
        self.end: int | None = None
        self.members: dict[str, list[Any]] = {}
        self.closed = False
        self._phase, self._at, self._key = _KEY, 0, ""
        self._quoted, self._nest = _Quoted(), _Nest()

    def step(self, text: str, j: int) -> None:
        """Read ``text[j]``, the object's next character (Malformed: it cannot be one)."""
        c, phase = text[j], self._phase
        if phase in (_IN_STRING, _IN_KEY):
            if self._quoted.closes(c):
                if phase == _IN_KEY:
                    self._key = json.loads(text[self._at : j + 1])
                    self._phase = _COLON
                else:
                    self.members[self._key][1] = j + 1
                    self._phase = _KEY
            return
        if phase == _IN_NEST:
            if self._nest.ends(c):
                self.members[self._key][1] = j + 1
                self._phase = _KEY
            return
        if phase == _IN_SCALAR:
            if c not in _SCALAR_END:
                return
            _after_value(text, j)
            self.members[self._key][1] = j
            phase = self._phase = _KEY  # and this character is read as what follows it
        if phase == _DONE or c in _WS:
            return
        if phase == _KEY:
            if c == "}":
                self.closed, self._phase = True, _DONE
                return
            if c == "," and self.members:
                self._phase = _AFTER_COMMA
                return
            phase = _AFTER_COMMA
        if phase == _AFTER_COMMA:
            if c != '"':
                raise Malformed(f"expected a member name at {text[j : j + 20]!r}")
            self._phase, self._at = _IN_KEY, j
        elif phase == _COLON:
            if c != ":":
                raise Malformed(f"expected ':' after {self._key!r}, got {text[j : j + 20]!r}")
            self._phase = _VALUE
        elif phase == _VALUE:
            if c in _SCALAR_END:
                _after_value(text, j)
            self.members[self._key] = [j, None]
            if c == '"':
                self._phase = _IN_STRING
            elif c in "{[":
                self._phase, self._nest = _IN_NEST, _Nest()
            elif c in _SCALAR_END:  # an empty value, as value_end reads it
                self.members[self._key][1] = j
                self._phase = _KEY
                self.step(text, j)
            else:
                self._phase = _IN_SCALAR


class Reader:
    """:func:`objects` and :func:`members_of` of a text that grows (``feed``), reading each
    character once: the objects opening at ``depth`` (:class:`Member` each; ``end`` set once
    closed), as the whole functions give them on the text so far. A Malformed character
    raises, leaving ``pos`` at it and what came before it read."""

    def __init__(self, depth: int) -> None:
        self.depth, self.text, self.pos = depth, "", 0
        self.objects: list[Member] = []
        self._level, self._in_string, self._quoted = 0, False, _Quoted()
        self._open: Member | None = None

    def feed(self, new: str) -> None:
        self.text += new
        text, n, depth = self.text, len(self.text), self.depth
        j = self.pos
        try:
            while j < n:
                c = text[j]
                if self._open is not None:
                    self._open.step(text, j)
                if self._in_string:
                    self._in_string = not self._quoted.closes(c)
                elif c == '"':
                    if self._level > 0:
                        self._in_string = True
                elif c in "{[":
                    if c == "{" and self._level == depth:
                        self._open = Member(j)
                        self.objects.append(self._open)
                    self._level += 1
                elif c in "}]":
                    if self._level == 0:
                        raise Malformed(f"{c!r} at character {j} closes nothing")
                    self._level -= 1
                    if c == "}" and self._level == depth and self._open is not None:
                        self._open.end, self._open = j + 1, None
                j += 1
        finally:
            self.pos = j


class ValueEnd:
    """:func:`value_end` of a value (its text from its first character) that grows: ``feed``
    more of it, get one past its end in all of it once it has ended (None: not yet)."""

    def __init__(self) -> None:
        self.length = 0
        self.end: int | None = None
        self._kind = ""  # '"', "{" (a list or object) or "s" (a scalar); "": nothing yet
        self._quoted, self._nest = _Quoted(), _Nest()

    def feed(self, text: str) -> int | None:
        j0, self.length = self.length, self.length + len(text)
        for k, c in enumerate(text):
            if self.end is not None:
                break
            j = j0 + k
            if not self._kind:
                if c == '"' or c in "{[":
                    self._kind = '"' if c == '"' else "{"
                    continue
                self._kind = "s"
            if self._kind == "s":
                if c in _SCALAR_END:
                    self.end = j
            elif self._kind == '"':
                if self._quoted.closes(c):
                    self.end = j + 1
            elif self._nest.ends(c):
                self.end = j + 1
        return self.end
