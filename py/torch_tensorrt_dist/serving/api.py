"""The HTTP API (rank 0): OpenAI's ``/v1/completions`` and ``/v1/chat/completions``, plus
``/v1/models``, ``/health`` and ``/metrics``.

    app = create_app(model, inbox, state, metrics, api_key=None)

A handler checks the request (``protocol.py``), tokenizes it, checks it fits the KV cache and
hands it to the step loop through the :class:`Inbox`; then it reads the request's pieces from its
own asyncio queue, as one JSON body or as server-sent events ending with ``data: [DONE]``. It
never touches a tensor and never waits on the step loop. A client that goes away cancels its
request (the slot is freed at the next step).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.sampling import SamplingConfig
from torch_tensorrt_dist.models.tokenizer import Tokenizer
from torch_tensorrt_dist.serving import protocol
from torch_tensorrt_dist.serving.bridge import (
    Failed,
    Inbox,
    Piece,
    QueueFull,
    ServerState,
    Sink,
    Submission,
)
from torch_tensorrt_dist.serving.chat import ChatTemplate
from torch_tensorrt_dist.serving.metrics import CONTENT_TYPE, Metrics
from torch_tensorrt_dist.serving.protocol import Params, RequestError

__all__ = ["ServedModel", "create_app"]

logger = logging.getLogger(__name__)


@dataclass
class ServedModel:
    """What the HTTP layer knows of the model: names, tokenizer, template and limits."""

    name: str
    tokenizer: Tokenizer
    chat: ChatTemplate | None
    cache_len: int
    vocab_size: int
    check: Callable[[int, int], None]
    """``check(prompt_len, max_new_tokens)``: ConfigError when the graphs cannot run it."""


def _error(err: RequestError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status)


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


class _Handler:
    def __init__(
        self,
        model: ServedModel,
        inbox: Inbox,
        state: ServerState,
        metrics: Metrics,
        api_key: str | None,
    ) -> None:
        self.model, self.inbox, self.state, self.metrics = model, inbox, state, metrics
        self.api_key = api_key

    def authorize(self, request: Request) -> None:
        if self.api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
            raise RequestError(
                401,
                "missing or wrong API key: send 'Authorization: Bearer KEY'",
                code="invalid_api_key",
            )

    def available(self) -> None:
        state = self.state.state
        if state == "warming":
            raise RequestError(503, "the server is warming up (compiling); retry in a moment")
        if state == "draining":
            raise RequestError(503, "the server is shutting down; retry elsewhere")
        if state == "failed":
            raise RequestError(503, f"the server has failed: {self.state.reason}")

    def prompt_ids(self, params: Params) -> list[int]:
        tok = self.model.tokenizer
        if params.messages is not None:  # a chat request
            if self.model.chat is None:
                raise RequestError(
                    400,
                    f"model {self.model.name!r} has no chat template (no "
                    "chat_template in its tokenizer_config.json); use "
                    "/v1/completions",
                    param="messages",
                )
            text = self.model.chat.render(params.messages)
            return tok.encode(text, add_special_tokens=False)
        if isinstance(params.prompt, list):
            bad = [i for i in params.prompt if not 0 <= i < self.model.vocab_size]
            if bad:
                raise RequestError(
                    400,
                    f"prompt holds token ids {bad[:4]} outside [0, {self.model.vocab_size})",
                    param="prompt",
                )
            return params.prompt
        return tok.encode(params.prompt or "")

    async def submit(self, request: Request, *, chat: bool) -> Response:
        self.authorize(request)
        self.available()
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RequestError(400, f"the request body is not JSON: {exc}") from exc
        params = protocol.parse_request(body, chat=chat)
        if params.model is not None and params.model != self.model.name:
            raise RequestError(
                404,
                f"model {params.model!r} is not served here; this server "
                f"serves {self.model.name!r}",
                param="model",
                code="model_not_found",
            )
        try:
            ids = self.prompt_ids(params)
            limit = self.model.cache_len - len(ids)
            max_new = params.max_tokens if params.max_tokens is not None else max(limit, 1)
            self.model.check(len(ids), max_new)
            top_p = params.top_p if params.top_p < 1.0 else None
            sampling = SamplingConfig(temperature=params.temperature, top_p=top_p)
        except ConfigError as exc:  # the prompt, max_tokens, or both: the message says which
            raise RequestError(400, str(exc)) from exc
        sink = Sink(asyncio.get_running_loop())
        sub = Submission(tuple(ids), max_new, sampling, params.seed, params.stop, sink)
        try:
            self.inbox.submit(sub)
        except QueueFull as exc:
            raise RequestError(429, f"the server is busy: {exc}; retry later") from exc
        self.metrics.prompt_tokens.inc(len(ids))
        head = {
            "rid": f"{'chatcmpl' if chat else 'cmpl'}-{sub.rid}",
            "created": int(time.time()),
            "model": self.model.name,
        }
        if params.stream:
            return StreamingResponse(
                self.stream(params, sub, len(ids), head), media_type="text/event-stream"
            )
        return await self.collect(request, params, sub, len(ids), head)

    async def collect(
        self, request: Request, params: Params, sub: Submission, n: int, head: dict[str, Any]
    ) -> Response:
        text, tokens, cached = [], 0, 0
        while True:
            try:
                item = await asyncio.wait_for(sub.sink.queue.get(), timeout=1.0)
            except TimeoutError:
                if await request.is_disconnected():
                    self.inbox.cancel(sub.rid)
                    self.metrics.requests.labels("cancelled").inc()
                    return Response(status_code=499)
                continue
            if isinstance(item, Failed):
                raise RequestError(item.status, item.message)
            text.append(item.text)
            tokens += item.tokens
            cached += item.cached
            if item.finish is not None:
                body = protocol.response(
                    params,
                    text="".join(text),
                    finish=item.finish,
                    usage=protocol.usage(n, tokens, cached),
                    **head,
                )
                self.metrics.requests.labels("200").inc()
                return JSONResponse(body)

    async def stream(
        self, params: Params, sub: Submission, n: int, head: dict[str, Any]
    ) -> AsyncIterator[str]:
        status, tokens, cached = "cancelled", 0, 0
        try:
            if params.chat:
                yield _sse(protocol.chunk(params, text="", first=True, **head))
            while True:
                item: Piece | Failed = await sub.sink.queue.get()
                if isinstance(item, Failed):
                    status = str(item.status)
                    yield _sse(protocol.error_body(item.status, item.message))
                    break
                tokens += item.tokens
                cached += item.cached
                if item.text:
                    yield _sse(protocol.chunk(params, text=item.text, **head))
                if item.finish is not None:
                    status = "200"
                    yield _sse(protocol.chunk(params, text=None, finish=item.finish, **head))
                    if params.include_usage:
                        usage = protocol.usage(n, tokens, cached)
                        yield _sse(protocol.chunk(params, text=None, usage=usage, **head))
                    break
            yield "data: [DONE]\n\n"
        finally:  # also when the client went away (the stream is cancelled)
            if status == "cancelled":
                self.inbox.cancel(sub.rid)
            self.metrics.requests.labels(status).inc()


def create_app(
    model: ServedModel,
    inbox: Inbox,
    state: ServerState,
    metrics: Metrics,
    *,
    api_key: str | None = None,
) -> FastAPI:
    """The FastAPI application of one server (rank 0)."""
    app = FastAPI(title="torch_tensorrt_dist", docs_url=None, redoc_url=None, openapi_url=None)
    h = _Handler(model, inbox, state, metrics, api_key)

    @app.exception_handler(RequestError)
    async def request_error(_: Request, err: RequestError) -> JSONResponse:
        metrics.requests.labels(str(err.status)).inc()
        return _error(err)

    @app.exception_handler(Exception)
    async def server_error(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("request failed")
        metrics.requests.labels("500").inc()
        return _error(RequestError(500, f"internal error: {type(exc).__name__}: {exc}"))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await h.submit(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await h.submit(request, chat=True)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        h.authorize(request)
        entry = {
            "id": model.name,
            "object": "model",
            "created": 0,
            "owned_by": "torch_tensorrt_dist",
            "max_model_len": model.cache_len,
        }
        return JSONResponse({"object": "list", "data": [entry]})

    @app.get("/health")
    async def health() -> Response:
        ready = state.state == "ready"
        body: dict[str, Any] = {"status": state.state, "pids": state.pids}
        if state.reason:
            body["reason"] = state.reason
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        metrics.queue_depth.set(inbox.waiting)
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    return app
