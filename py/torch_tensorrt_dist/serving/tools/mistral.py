"""Mistral tool calls: ``[TOOL_CALLS]`` then a JSON list of ``{"name", "arguments"}`` objects
(Mistral 7B v0.3, Mixtral 8x22B, Mistral Nemo and their templates), or, from the v11
tokenizers on (Mistral Small 3.x, Magistral, Devstral), ``[TOOL_CALLS]name[ARGS]{...}`` per
call; a call id is 9 letters and digits, as those templates require of the history."""

from __future__ import annotations

import json

from torch_tensorrt_dist.serving.tools.calls import CallFormat, alnum_id, held_prefix
from torch_tensorrt_dist.serving.tools.scan import ValueEnd, value_end

__all__ = ["ARGS", "MISTRAL", "START"]

START, ARGS = "[TOOL_CALLS]", "[ARGS]"


def split(text: str) -> tuple[int, int | None]:
    at = text.find(START)
    if at >= 0:
        return at, at + len(START)
    return len(text) - held_prefix(text, START), None


def _one(call: str) -> str:
    """``name[ARGS]{...}`` (maybe cut short) as ``{"name": ..., "arguments": {...}}``."""
    name, sep, args = call.partition(ARGS)
    if not sep:  # the name still growing; what may begin [ARGS] is held back
        name = name[: len(name) - held_prefix(name, ARGS)]
        return '{"name": "' + name.strip()
    head = '{"name": ' + json.dumps(name.strip()) + ', "arguments": '
    args = args.lstrip()
    end = value_end(args, 0) if args else None
    if end is None:
        return head + args
    return head + args[:end] + "}"  # what follows the arguments (a next [TOOL_CALLS]) is not them


def normalize(region: str) -> str:
    """The v11 form as the JSON list of the older one (the list form as it is)."""
    if region.lstrip().startswith("[") or not region.strip():
        return region
    return "[" + ", ".join(_one(c) for c in region.split(START))  # the list left open


_UNDECIDED, _LIST, _NAME, _ARGS, _AFTER = range(5)


class Normalizer:
    """:func:`normalize` as the calls' text streams, each character handled once: the JSON it
    adds to what it gave before. A v11 call's name is given once its ``[ARGS]`` comes (whole,
    as JSON), and what may begin a ``[TOOL_CALLS]`` is held until it does or does not (or
    ``flush``); the text given, flushed, is ``normalize`` of the whole text."""

    def __init__(self) -> None:
        self._phase = _UNDECIDED
        self._held = ""  # text not handled yet: blanks before the form shows, a tag's start
        self._name = ""  # the v11 call's name so far
        self._value: ValueEnd | None = None  # the v11 call's arguments, read as they come

    def feed(self, text: str) -> str:
        if self._phase == _LIST:
            return text
        text, self._held = self._held + text, ""
        if self._phase == _UNDECIDED:
            head = text.lstrip()
            if not head:
                self._held = text
                return ""
            if head.startswith("["):
                self._phase = _LIST
                return text
            self._phase = _NAME
            return "[" + self._v11(text, final=False)
        return self._v11(text, final=False)

    def flush(self) -> str:
        text, self._held = self._held, ""
        if self._phase in (_UNDECIDED, _LIST):
            return text
        return self._v11(text, final=True)

    def _v11(self, text: str, *, final: bool) -> str:
        out: list[str] = []
        while True:
            at = text.find(START)
            if at < 0:
                keep = 0 if final else held_prefix(text, START)
                out.append(self._segment(text[: len(text) - keep], final=final))
                self._held = text[len(text) - keep :]
                return "".join(out)
            out.append(self._segment(text[:at], final=True))  # this call's text is complete
            out.append(", ")
            self._phase, self._name, self._value = _NAME, "", None
            text = text[at + len(START) :]

    def _segment(self, text: str, *, final: bool) -> str:
        """The JSON of ``text``, more of the call's text; ``final``: its last."""
        if self._phase == _NAME:
            before = len(self._name)
            self._name += text
            at = self._name.find(ARGS, max(0, before - len(ARGS) + 1))
            if at < 0:
                if not final:
                    return ""
                name = self._name[: len(self._name) - held_prefix(self._name, ARGS)]
                return '{"name": "' + name.strip()
            name, rest = self._name[:at], self._name[at + len(ARGS) :]
            self._phase, self._value = _ARGS, ValueEnd()
            head = '{"name": ' + json.dumps(name.strip()) + ', "arguments": '
            return head + self._segment(rest, final=final)
        if self._phase == _ARGS and self._value is not None:
            value = self._value
            if not value.length:
                text = text.lstrip()
            start = value.length
            end = value.feed(text)
            if end is None:
                return text
            self._phase = _AFTER
            return text[: end - start] + "}"
        return ""  # after the arguments: not them


MISTRAL = CallFormat(
    "mistral",
    split,
    depth=1,
    new_id=alnum_id,
    normalize=normalize,
    normalizer=Normalizer,
    anywhere=True,
)
