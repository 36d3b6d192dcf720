"""Reasoning text ``<think>...</think>`` split from the answer (pure; ``--reasoning-parser
think``): Qwen3, QwQ, DeepSeek-R1 and their templates.

    split = Reasoning(inside=prompt_opens_thinking(prompt_text))
    reasoning, content = split.parse(text)     # whole
    stream = split.stream()
    for piece in pieces: stream.feed(piece)     # [("reasoning", text) | ("content", text)]
    stream.finish()

The reasoning is what precedes ``</think>``: from the answer's start where the prompt already
opened the block (DeepSeek-R1's and Qwen3's templates end the prompt with ``<think>``), else
from a ``<think>`` the answer starts with (after white space). An answer that never closes
the block is all reasoning (it was cut by ``max_tokens``); one that does not open it is all
content. Nothing is stripped: a stream's pieces join into exactly the whole split.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_tensorrt_dist.serving.tools.calls import held_prefix

__all__ = ["END", "PARSERS", "START", "Reasoning", "ReasoningStream", "prompt_opens_thinking"]

START, END = "<think>", "</think>"
#: ``--reasoning-parser`` names: every one of them is the ``<think>`` split (vLLM's names)
PARSERS = ("think", "qwen3", "deepseek_r1")


def prompt_opens_thinking(prompt: str) -> bool:
    """Whether the prompt ends inside a ``<think>`` block (its answer starts in reasoning)."""
    return prompt.rfind(START) > prompt.rfind(END)


@dataclass(frozen=True)
class Reasoning:
    inside: bool = False
    """The prompt opened the block: the answer starts in reasoning."""

    def parse(self, text: str) -> tuple[str | None, str]:
        """(reasoning or None, content) of a whole answer."""
        body = text
        if not self.inside:
            head = text.lstrip()
            if not head.startswith(START):
                return None, text
            body = head[len(START) :]
        at = body.find(END)
        if at < 0:
            return body, ""
        return body[:at], body[at + len(END) :]

    def stream(self) -> ReasoningStream:
        return ReasoningStream(self.inside)


class ReasoningStream:
    """An answer as it streams, split into reasoning and content pieces."""

    def __init__(self, inside: bool) -> None:
        self.mode = "reasoning" if inside else "undecided"
        self.buf = ""

    def feed(self, piece: str) -> list[tuple[str, str]]:
        self.buf += piece
        out: list[tuple[str, str]] = []
        while True:
            if self.mode == "undecided":
                head = self.buf.lstrip()
                if not head or (START.startswith(head) and head != START):
                    return out  # may still open the block
                if head.startswith(START):
                    self.mode, self.buf = "reasoning", head[len(START) :]
                else:
                    self.mode = "content"
            if self.mode == "content":
                if self.buf:
                    out.append(("content", self.buf))
                self.buf = ""
                return out
            at = self.buf.find(END)
            if at >= 0:
                if at:
                    out.append(("reasoning", self.buf[:at]))
                self.mode, self.buf = "content", self.buf[at + len(END) :]
                continue
            keep = held_prefix(self.buf, END)
            if len(self.buf) > keep:
                out.append(("reasoning", self.buf[: len(self.buf) - keep]))
                self.buf = self.buf[len(self.buf) - keep :]
            return out

    def finish(self) -> list[tuple[str, str]]:
        """What was held back, once the answer is complete."""
        rest, self.buf = self.buf, ""
        if not rest:
            return []
        return [("reasoning" if self.mode == "reasoning" else "content", rest)]
