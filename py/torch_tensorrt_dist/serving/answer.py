"""A request's answer from the pieces of its sequences: one JSON body, or server-sent events
(rank 0's HTTP process; no tensors).

    answer = Answer(req, subs, ready, head, token_text)
    body = await answer.collect(queue)        # a finished request's body; RequestError on Failed
    async for event in answer.events(queue): ...   # chunks (answer.made: their step's time)

Choice ``i`` of a stream gets its events in order: (chat) a first chunk with the role, (echo)
its prompt's text, its text as it comes with the logprobs of its tokens, and a chunk with its
``finish_reason``; the usage (``stream_options.include_usage``) follows the last choice's end.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from torch_tensorrt_dist.serving import protocol
from torch_tensorrt_dist.serving.bridge import Failed, PieceQueue, Submission
from torch_tensorrt_dist.serving.chat_output import ChatStream
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
        #: a usage object on every chunk (``stream_options.continuous_usage_stats``)
        opts = req.stream_options
        self.usage_each = req.include_usage and opts is not None and opts.continuous_usage_stats
        #: ``Piece.made`` of the piece the last event came from (0 for events of no piece)
        self.made = 0.0

    def usage(self) -> dict[str, Any]:
        return protocol.usage(self.prompt_tokens, self.seqs.tokens, self.seqs.cached)

    async def collect(self, queue: PieceQueue) -> dict[str, Any]:
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
        message = None
        if self.ready.output is not None:  # tool calls, reasoning
            message, called = self.ready.output.message(text)
            finish = self.ready.output.finish_reason(finish, called)
        return protocol.choice(
            self.req.chat,
            index=index,
            text=text,
            finish=finish,
            logprobs=self._logprobs(seq),
            message=message,
        )

    def _logprobs(self, seq: Generated, offset: int = 0) -> dict[str, Any] | None:
        if not self.show_logprobs:
            return None
        if self.req.chat:
            return chat_logprobs(seq.logprobs, self.token_text)
        return completion_logprobs(seq.logprobs, self.token_text, offset)[0]

    def _sse(self, chunk: dict[str, Any]) -> str:
        if self.usage_each and "usage" not in chunk:
            chunk["usage"] = self.usage()
        return sse(chunk)

    async def events(self, queue: PieceQueue) -> AsyncIterator[str]:
        """The stream's events (``best_of`` <= ``n`` here: a sequence is a choice)."""
        chat, head = self.req.chat, self.head
        offsets = [0] * len(self.seqs.seqs)
        output = self.ready.output
        streams: list[ChatStream] = [output.stream() for _ in offsets] if output else []
        for index in range(len(offsets)):
            if chat:
                yield self._sse(protocol.chunk(chat, text="", index=index, first=True, **head))
            echo = self.ready.echo[index // self.req.n]
            if echo:
                yield self._sse(protocol.chunk(chat, text=echo, index=index, **head))
                offsets[index] = len(echo)
        while not self.seqs.done:
            item = await queue.get()
            if isinstance(item, Failed):
                self.status, self.made = str(item.status), 0.0
                yield sse(protocol.error_body(item.status, item.message, param=item.param))
                return
            self.seqs.add(item)
            index, self.made = item.index, item.made
            logprobs = None
            if self.show_logprobs and item.logprobs:
                if chat:
                    logprobs = chat_logprobs(item.logprobs, self.token_text)
                else:
                    logprobs, offsets[index] = completion_logprobs(
                        item.logprobs, self.token_text, offsets[index]
                    )
            if streams:  # tool calls, reasoning: the text's deltas
                deltas = streams[index].feed(item.text) if item.text else []
                if item.finish is not None:
                    deltas += streams[index].finish()
                if not deltas and logprobs is not None:
                    deltas = [{}]
                for k, delta in enumerate(deltas):
                    lp = logprobs if k == 0 else None
                    yield self._sse(
                        protocol.chunk(
                            chat, text=None, index=index, logprobs=lp, delta=delta, **head
                        )
                    )
            elif item.text or logprobs is not None:
                yield self._sse(
                    protocol.chunk(chat, text=item.text, index=index, logprobs=logprobs, **head)
                )
            if item.finish is not None:
                finish = item.finish
                if output is not None:
                    finish = output.finish_reason(finish, streams[index].called)
                yield self._sse(protocol.chunk(chat, text=None, index=index, finish=finish, **head))
        self.status, self.made = "200", 0.0
        if self.req.include_usage:
            yield sse(protocol.chunk(chat, text=None, usage=self.usage(), **head))
