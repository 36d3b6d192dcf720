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
from typing import Any, Protocol

from torch_tensorrt_dist.serving.tools.scan import Malformed, Member, Reader, members_of, objects

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
    """Rewrites the calls' text (maybe cut short) into JSON call objects (a format whose
    calls are not JSON objects); ``normalizer`` does it as the text streams."""
    normalizer: Callable[[], Normalizer] | None = None
    """A new :class:`Normalizer` of ``normalize``'s (for one stream)."""
    anywhere: bool = False
    """The calls may start anywhere in the text: ``split`` of the text from any point the
    content was sent to is ``split`` of the whole text, shifted (a stream splits only the
    text it has not sent)."""

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
        return self.arguments_of(obj[start:end])

    @staticmethod
    def arguments_of(raw: str) -> str:
        """The arguments text of a call whose arguments value is the JSON text ``raw``."""
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


class Normalizer(Protocol):
    """``CallFormat.normalize`` as the calls' text streams: ``feed`` the text that came, get
    the JSON text it adds (only ever added to); ``flush`` once the text is complete."""

    def feed(self, text: str) -> str: ...

    def flush(self) -> str: ...


class CallStream:
    """One choice's text as it streams, turned into OpenAI's deltas (module docstring).

    Each character is read once (``scan.Reader``), whatever the pieces: a piece costs the
    same at the 2,000th as at the first. The deltas joined are those of the same text fed
    one character at a time (and, where the whole text parses as calls, its ``parse``)."""

    def __init__(self, fmt: CallFormat) -> None:
        self.fmt = fmt
        self.text = ""
        self.sent = 0  # content characters sent
        self.calls: list[list[Any]] = []  # per call: [id, arguments characters sent]
        self.broken = False  # the calls' text stopped being JSON: nothing more is sent
        self._start: int | None = None  # where the calls start, once known
        self._region = fmt.normalizer() if fmt.normalizer is not None else None
        self._reader = Reader(fmt.depth)
        self._next = 0  # the first call object not read to its end
        self._names: dict[tuple[int, int], str] = {}

    @property
    def called(self) -> bool:
        return bool(self.calls)

    def _split(self) -> tuple[int, int | None]:
        if not self.fmt.anywhere:
            return self.fmt.split(self.text)
        at = self.sent  # nothing sent can begin the calls: split what was not
        end, start = self.fmt.split(self.text[at:])
        return at + end, (at + start if start is not None else None)

    def feed(self, piece: str) -> list[Delta]:
        fed = len(self.text)
        self.text += piece
        out: list[Delta] = []
        if self._start is None:
            content_end, start = self._split()
            if content_end > self.sent:
                out.append({"content": self.text[self.sent : content_end]})
                self.sent = content_end
            if start is None:
                return out
            self._start = fed = start
        if not self.broken:
            new = self.text[fed:]
            out += self._calls(self._region.feed(new) if self._region is not None else new)
        return out

    def finish(self) -> list[Delta]:
        """Once the text is complete: what was held back, and, where no call was sent, the
        text that looked like calls and was not (content, as the whole text's parse has it)."""
        out: list[Delta] = []
        if self._region is not None and not self.broken:
            out += self._calls(self._region.flush())  # what it held, for a next call's tag
        if self.calls or len(self.text) <= self.sent:
            return out
        rest = self.text[self.sent :]
        self.sent = len(self.text)
        return [*out, {"content": rest}]

    def _calls(self, new: str) -> list[Delta]:
        """The deltas of the calls' text ``new`` adds. Where the text stops being a call
        (``Malformed``), the deltas of the text before that point still go out and nothing
        more is sent: a piece merged for a slow reader gives the client what the same text
        fed token by token gives."""
        out: list[Delta] = []
        try:
            try:
                self._reader.feed(new)
            finally:
                self._scan(out)
        except (Malformed, json.JSONDecodeError):
            self.broken = True
        return out

    def _name(self, obj: Member) -> str | None:
        span = obj.members.get("name")
        if span is None or span[1] is None:
            return None
        key = (span[0], span[1])
        name = self._names.get(key)
        if name is None:
            value = json.loads(self._reader.text[key[0] : key[1]])
            if not isinstance(value, str):
                raise Malformed(f"a call's name must be a string, got {value!r}")
            name = self._names[key] = value
        return name

    def _scan(self, out: list[Delta]) -> None:
        objs, text, limit = self._reader.objects, self._reader.text, self._reader.pos
        for k in range(self._next, len(objs)):
            obj = objs[k]
            name = self._name(obj)
            args = next((obj.members[a] for a in self.fmt.args_keys if a in obj.members), None)
            if name is None or args is None:
                if not (obj.closed and name is not None):
                    break
                args = None  # no arguments at all: "{}"
            if k == len(self.calls):
                self.calls.append([self.fmt.new_id(), 0])
                function = {"name": name, "arguments": ""}
                head = {"index": k, "id": self.calls[k][0], "type": "function"}
                out.append({"tool_calls": [{**head, "function": function}]})
            end = obj.end if obj.end is not None else limit
            piece = self._args(text, args, self.calls[k][1], end)
            if piece:
                self.calls[k][1] += len(piece)
                out.append({"tool_calls": [{"index": k, "function": {"arguments": piece}}]})
            if obj.end is None:
                break
            self._next = k + 1  # read to its end: nothing more comes of it

    def _args(self, text: str, args: list[Any] | None, sent: int, obj_end: int) -> str:
        """The arguments text not yet sent (all of it once known, where it is not an object);
        ``args`` its span in ``text``, the call object's text ending at ``obj_end``."""
        if args is None:
            return "" if sent else "{}"
        start, end = args
        if text[start] == "{":
            return text[start + sent : min(end, obj_end) if end is not None else obj_end]
        if end is None or end > obj_end or sent:
            return ""
        return self.fmt.arguments_of(text[start:end])
