"""Tool calls read from a model's text, whole or as it streams (pure): the part every format
shares. A format (``hermes.py``, ``llama3_json.py``, ``mistral.py``, ``forced.py``) says only
where its calls begin and how deep its call objects sit; the rest is here.

    fmt = HERMES
    parsed = fmt.parse(text)              # Parsed(content, [ToolCall(id, name, arguments)])
    stream = fmt.stream()
    for piece in pieces:
        for delta in stream.feed(piece): ...    # {"content": ...} or {"tool_calls": [...]}
    for delta in stream.finish(): ...

A call is a JSON object with a ``name`` and its arguments (under one of the format's
``args_keys``). Its ``arguments`` are the text of that value as the model wrote it (JSON; a
string value is the text it holds), and a stream sends exactly that text in pieces, as OpenAI
streams them: a first delta per call with its ``index``, ``id``, ``type`` and ``function.name``
(arguments ""), then deltas of ``function.arguments`` only; joined, they are the whole
call's arguments. Text that does not parse as calls is content, whole (as vLLM returns it),
except that a last call cut short (``max_tokens``) after whole ones is left out; a stream that
has already sent a call's first delta cannot take it back.
"""

from __future__ import annotations

import json
import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch_tensorrt_dist.serving.tools.scan import Malformed, members_of, objects

__all__ = ["CallFormat", "CallStream", "Parsed", "ToolCall", "held_prefix", "openai_id"]

Delta = dict[str, Any]


def openai_id() -> str:
    """A call id as OpenAI spells them (``call_`` and 24 characters)."""
    return "call_" + secrets.token_hex(12)


def alnum_id(k: int = 9) -> str:
    """A call id of ``k`` letters and digits (Mistral's templates refuse any other)."""
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(k))


def held_prefix(text: str, marker: str) -> int:
    """How many characters at the end of ``text`` may begin ``marker`` (held back from a
    stream until the next piece says whether they do)."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str
    """JSON text, as OpenAI sends it."""

    def to_openai(self) -> dict[str, Any]:
        function = {"name": self.name, "arguments": self.arguments}
        return {"id": self.id, "type": "function", "function": function}


@dataclass(frozen=True)
class Parsed:
    """A whole text read: its content (None: none) and its calls."""

    content: str | None
    calls: list[ToolCall] = field(default_factory=list)


@dataclass(frozen=True)
class _Call:
    """One call object read so far: its name (once whole) and its arguments' span."""

    name: str | None
    args: tuple[int, int | None] | None
    closed: bool


@dataclass(frozen=True)
class CallFormat:
    """Where a format's calls are in a text, and what a call object holds."""

    name: str
    split: Callable[[str], tuple[int, int | None]]
    """``split(text) -> (content_end, calls_start)``: the content is ``text[:content_end]``,
    the calls start at ``calls_start`` (None: none yet; the characters past ``content_end``
    are held back, as they may begin the calls)."""
    depth: int
    """The nesting depth (brackets and braces) of each call object in the calls' text."""
    args_keys: tuple[str, ...] = ("arguments",)
    new_id: Callable[[], str] = openai_id
    normalize: Callable[[str], str] | None = None
    """Rewrites the calls' text (maybe cut short) into JSON call objects, keeping a prefix's
    rewrite a prefix of the whole one's (a format whose calls are not JSON objects)."""

    def region(self, text: str, start: int) -> str:
        """The calls' text from ``start``, as JSON call objects."""
        return self.normalize(text[start:]) if self.normalize else text[start:]

    def read(self, obj: str) -> _Call:
        """A call object's text (maybe cut short); Malformed when it is not one."""
        members, closed = members_of(obj)
        name: str | None = None
        if "name" in members:
            start, end = members["name"]
            if end is not None:
                value = json.loads(obj[start:end])
                if not isinstance(value, str):
                    raise Malformed(f"a call's name must be a string, got {value!r}")
                name = value
        args = next((members[k] for k in self.args_keys if k in members), None)
        return _Call(name, args, closed)

    def arguments(self, obj: str, call: _Call) -> str:
        """A closed call's arguments text."""
        if call.args is None:
            return "{}"
        start, end = call.args
        raw = obj[start:end]
        value = json.loads(raw)
        if isinstance(value, str):  # arguments sent as a JSON string
            json.loads(value)
            return value
        if not isinstance(value, dict):
            raise Malformed(f"a call's arguments must be an object, got {raw[:40]!r}")
        return raw

    def parse(self, text: str) -> Parsed:
        """The content and calls of a whole text (all content where the calls do not parse)."""
        content_end, start = self.split(text)
        if start is None:
            return Parsed(text or None)
        region = self.region(text, start)
        calls = []
        try:
            spans = objects(region, self.depth)
            for k, (s, e) in enumerate(spans):
                if e is None and k > 0:  # cut by max_tokens after whole calls: those
                    break
                if e is None:
                    raise Malformed("a call is not closed")
                obj = region[s:e]
                call = self.read(obj)
                if call.name is None:
                    raise Malformed("a call has no name")
                calls.append(ToolCall(self.new_id(), call.name, self.arguments(obj, call)))
        except (Malformed, json.JSONDecodeError):
            return Parsed(text or None)
        if not calls:
            return Parsed(text or None)
        content = text[:content_end]
        return Parsed(content if content.strip() else None, calls)

    def stream(self) -> CallStream:
        return CallStream(self)


class CallStream:
    """One choice's text as it streams, turned into OpenAI's deltas (module docstring)."""

    def __init__(self, fmt: CallFormat) -> None:
        self.fmt = fmt
        self.text = ""
        self.sent = 0  # content characters sent
        self.calls: list[list[Any]] = []  # per call: [id, arguments characters sent]
        self.broken = False  # the calls' text stopped being JSON: nothing more is sent

    @property
    def called(self) -> bool:
        return bool(self.calls)

    def feed(self, piece: str) -> list[Delta]:
        self.text += piece
        out: list[Delta] = []
        content_end, start = self.fmt.split(self.text)
        if content_end > self.sent:
            out.append({"content": self.text[self.sent : content_end]})
            self.sent = content_end
        if start is not None and not self.broken:
            out += self._calls(self.fmt.region(self.text, start))
        return out

    def finish(self) -> list[Delta]:
        """Once the text is complete: what was held back, and, where no call was sent, the
        text that looked like calls and was not (content, as the whole text's parse has it)."""
        if self.calls or len(self.text) <= self.sent:
            return []
        rest = self.text[self.sent :]
        self.sent = len(self.text)
        return [{"content": rest}]

    def _calls(self, region: str) -> list[Delta]:
        """The deltas of the calls' text since the last feed. Where the text stops being a
        call (``Malformed``), the deltas built before that point still go out (the counters
        already count them) and nothing more is sent: a piece merged for a slow reader gives
        the client what the same text fed token by token gives."""
        out: list[Delta] = []
        try:
            self._scan(region, out)
        except (Malformed, json.JSONDecodeError):
            self.broken = True
        return out

    def _scan(self, region: str, out: list[Delta]) -> None:
        for k, (s, e) in enumerate(objects(region, self.fmt.depth)):
            obj = region[s:e]
            call = self.fmt.read(obj)
            if call.name is None or call.args is None:
                if call.closed and call.name is not None:  # no arguments at all: "{}"
                    call = _Call(call.name, None, True)
                else:
                    break
            if k == len(self.calls):
                self.calls.append([self.fmt.new_id(), 0])
                function = {"name": call.name, "arguments": ""}
                head = {"index": k, "id": self.calls[k][0], "type": "function"}
                out.append({"tool_calls": [{**head, "function": function}]})
            args = self._args(obj, call, self.calls[k][1])
            if args:
                self.calls[k][1] += len(args)
                out.append({"tool_calls": [{"index": k, "function": {"arguments": args}}]})
            if e is None:
                break

    def _args(self, obj: str, call: _Call, sent: int) -> str:
        """The arguments text not yet sent (all of it once known, where it is not an object)."""
        if call.args is None:
            return "" if sent else "{}"
        start, end = call.args
        if obj[start] == "{":
            return obj[start + sent : end if end is not None else len(obj)]
        if end is None or sent:
            return ""
        return self.fmt.arguments(obj, call)
