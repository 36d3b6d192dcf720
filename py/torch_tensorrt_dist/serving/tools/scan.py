"""Reading JSON text that may still be growing (pure): where each call object starts and ends,
and where each of its members' values does, without waiting for the text to be complete.

    spans = objects('[{"a": 1}, {"b"', depth=1)      # [(1, 9), (11, None)]: the 2nd not closed
    members, closed = members_of('{"name": "f", "arguments": {"x"')
    # {"name": (9, 12), "arguments": (27, None)}, False: the value of arguments not closed yet

A span is ``(start, end)`` with ``end`` one past the last character, or None while the text
has not closed it. Text that cannot be JSON raises :class:`Malformed`.
"""

from __future__ import annotations

import json

__all__ = ["Malformed", "members_of", "objects", "value_end"]

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
