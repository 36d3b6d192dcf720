"""A request's answer from the pieces of its sequences: one JSON body, or server-sent events
(rank 0's HTTP process; no tensors).

    answer = Answer(req, subs, ready, head, token_text)
    body = await answer.collect(queue)        # a finished request's body; RequestError on Failed
    async for event in answer.events(queue): ...   # chunks, then [DONE]

Choice ``i`` of a stream gets its events in order: (chat) a first chunk with the role, (echo)
its prompt's text, its text as it comes with the logprobs of its tokens, and a chunk with its
``finish_reason``; the usage (``stream_options.include_usage``) follows the last choice's end.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from torch_tensorrt_dist.serving import protocol
from torch_tensorrt_dist.serving.bridge import Failed, Piece, Submission
from torch_tensorrt_dist.serving.choices import (
    Generated,
    Sequences,
    chat_logprobs,
    completion_logprobs,
)
from torch_tensorrt_dist.serving.prepare import Prepared
from torch_tensorrt_dist.serving.protocol import RequestError
from torch_tensorrt_dist.serving.schema import Params

__all__ = ["Answer", "sse"]


def sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


class Answer:
    """Builds one request's answer (see the module docstring)."""

    def __init__(
        self,
        req: Params,
        subs: list[Submission],
        ready: Prepared,
        head: dict[str, Any],
        token_text: Callable[[int], str],
    ) -> None:
        self.req, self.subs, self.ready, self.head = req, subs, ready, head
        self.token_text = token_text
        self.seqs = Sequences(prompts=len(subs), n=req.n, per_prompt=req.sequences)
        self.prompt_tokens = sum(len(ids) for ids in ready.prompts)
        #: whether the client sees logprobs (best_of alone computes them, to rank)
        self.show_logprobs = req.top_logprobs_asked is not None
        self.status = "cancelled"

    def usage(self) -> dict[str, Any]:
        return protocol.usage(self.prompt_tokens, self.seqs.tokens, self.seqs.cached)

    async def collect(self, queue: asyncio.Queue[Piece | Failed]) -> dict[str, Any]:
        """The body once every sequence has finished; RequestError for a Failed."""
        while not self.seqs.done:
            item = await queue.get()
            if isinstance(item, Failed):
                self.status = str(item.status)
                raise RequestError(item.status, item.message, param=item.param)
            self.seqs.add(item)
        choices = [self._choice(index, i, seq) for index, i, seq in self.seqs.returned()]
        self.status = "200"
        return protocol.response(self.req.chat, choices=choices, usage=self.usage(), **self.head)

    def _choice(self, index: int, prompt: int, seq: Generated) -> dict[str, Any]:
        echo = self.ready.echo[prompt]
        text = echo + "".join(seq.text)
        finish = seq.finish or "stop"
        return protocol.choice(
            self.req.chat, index=index, text=text, finish=finish, logprobs=self._logprobs(seq)
        )

    def _logprobs(self, seq: Generated, offset: int = 0) -> dict[str, Any] | None:
        if not self.show_logprobs:
            return None
        if self.req.chat:
            return chat_logprobs(seq.logprobs, self.token_text)
        return completion_logprobs(seq.logprobs, self.token_text, offset)[0]

    async def events(self, queue: asyncio.Queue[Piece | Failed]) -> AsyncIterator[str]:
        """The stream's events (``best_of`` <= ``n`` here: a sequence is a choice)."""
        chat, head = self.req.chat, self.head
        offsets = [0] * len(self.seqs.seqs)
        for index in range(len(offsets)):
            if chat:
                yield sse(protocol.chunk(chat, text="", index=index, first=True, **head))
            echo = self.ready.echo[index // self.req.n]
            if echo:
                yield sse(protocol.chunk(chat, text=echo, index=index, **head))
                offsets[index] = len(echo)
        while not self.seqs.done:
            item = await queue.get()
            if isinstance(item, Failed):
                self.status = str(item.status)
                yield sse(protocol.error_body(item.status, item.message, param=item.param))
                return
            self.seqs.add(item)
            index = item.index
            logprobs = None
            if self.show_logprobs and item.logprobs:
                if chat:
                    logprobs = chat_logprobs(item.logprobs, self.token_text)
                else:
                    logprobs, offsets[index] = completion_logprobs(
                        item.logprobs, self.token_text, offsets[index]
                    )
            if item.text or logprobs is not None:
                yield sse(
                    protocol.chunk(chat, text=item.text, index=index, logprobs=logprobs, **head)
                )
            if item.finish is not None:
                yield sse(protocol.chunk(chat, text=None, index=index, finish=item.finish, **head))
        self.status = "200"
        if self.req.include_usage:
            yield sse(protocol.chunk(chat, text=None, usage=self.usage(), **head))
