"""A chat choice's text as its message: reasoning (``reasoning_content``), content and tool
calls, whole or as stream deltas (pure; rank 0's HTTP layer).

    out = ChatOutput(calls=HERMES, reasoning=Reasoning(inside=True))   # prepare.py builds it
    message, called = out.message(text)       # {"role", "content", "tool_calls"?, ...}
    stream = out.stream()
    deltas = stream.feed(piece)               # [{"reasoning_content": ...} | {"content": ...}
                                              #  | {"tool_calls": [...]}]
    deltas += stream.finish()

The reasoning is split first (``reasoning.py``); the content after it is read for calls by the
format ``tool_choice`` asks for (``tools/``): the model's own format for "auto", the forced
shape for "required" or a named function. A choice that called a tool ends with
``finish_reason`` "tool_calls" (unless ``max_tokens`` cut it: "length"), except a call of the
function ``tool_choice`` named, which ends with "stop" (as OpenAI and vLLM end it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from torch_tensorrt_dist.serving.reasoning import Reasoning, ReasoningStream
from torch_tensorrt_dist.serving.tools.calls import Delta, Parsed
from torch_tensorrt_dist.serving.tools.forced import Named

__all__ = ["ChatOutput", "ChatStream"]


class _Stream(Protocol):
    def feed(self, piece: str) -> list[Delta]: ...
    def finish(self) -> list[Delta]: ...

    @property
    def called(self) -> bool: ...


class _Format(Protocol):
    def parse(self, text: str) -> Parsed: ...
    def stream(self) -> Any: ...


@dataclass(frozen=True)
class ChatOutput:
    calls: _Format | None = None
    """How calls are read (None: the text is content)."""
    reasoning: Reasoning | None = None
    """How reasoning is split (None: no ``--reasoning-parser``)."""
    parallel: bool = True
    """``parallel_tool_calls``: False keeps the first call the model wrote ("auto"; a forced
    call's grammar allows one only)."""

    def finish_reason(self, finish: str, called: bool) -> str:
        """The choice's ``finish_reason``, given the core's and whether it called a tool."""
        named = isinstance(self.calls, Named)
        return "tool_calls" if called and finish == "stop" and not named else finish

    def message(self, text: str) -> tuple[dict[str, Any], bool]:
        """The choice's message, and whether it called a tool."""
        reasoning, content = self.reasoning.parse(text) if self.reasoning else (None, text)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if self.reasoning is not None:
            message["reasoning_content"] = reasoning
        if self.calls is None:
            return message, False
        parsed = self.calls.parse(content)
        if not parsed.calls:
            return message, False
        message["content"] = parsed.content
        calls = parsed.calls if self.parallel else parsed.calls[:1]
        message["tool_calls"] = [c.to_openai() for c in calls]
        return message, True

    def stream(self) -> ChatStream:
        return ChatStream(self)


class ChatStream:
    """One choice's deltas as its text streams."""

    def __init__(self, out: ChatOutput) -> None:
        self.reasoning: ReasoningStream | None = out.reasoning.stream() if out.reasoning else None
        self.calls: _Stream | None = out.calls.stream() if out.calls else None
        self.parallel = out.parallel

    @property
    def called(self) -> bool:
        return self.calls is not None and self.calls.called

    def _content(self, text: str) -> list[Delta]:
        if self.calls is None:
            return [{"content": text}]
        return self._one(self.calls.feed(text))

    def _one(self, deltas: list[Delta]) -> list[Delta]:
        """Without ``parallel_tool_calls``: the first call's deltas only."""
        if self.parallel:
            return deltas
        return [d for d in deltas if "tool_calls" not in d or d["tool_calls"][0]["index"] == 0]

    def _split(self, pieces: list[tuple[str, str]]) -> list[Delta]:
        out: list[Delta] = []
        for kind, text in pieces:
            out += [{"reasoning_content": text}] if kind == "reasoning" else self._content(text)
        return out

    def feed(self, piece: str) -> list[Delta]:
        if self.reasoning is None:
            return self._content(piece)
        return self._split(self.reasoning.feed(piece))

    def finish(self) -> list[Delta]:
        out = self._split(self.reasoning.finish()) if self.reasoning is not None else []
        return out + (self._one(self.calls.finish()) if self.calls is not None else [])
