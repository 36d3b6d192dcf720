"""The HTTP API (rank 0): OpenAI's ``/v1/completions`` and ``/v1/chat/completions``, plus
``/v1/models``, ``/health`` and ``/metrics``.

    app = create_app(model, inbox, state, metrics, api_key=None)

A handler reads the body within a size and a time limit (``request_body.py``), checks the
request (``protocol.py``) and its size (``limits.py``) before any work, renders the chat
template and tokenizes in a worker thread (the event loop never waits on a large prompt: the
tokenizer releases the interpreter lock), checks it fits the KV cache and hands it to the step
loop through the :class:`Inbox`; then it reads the request's pieces from its own asyncio queue,
as one JSON body or as server-sent events ending with ``data: [DONE]``. It never touches a
tensor and never waits on the step loop. A client that goes away cancels its request, streamed
or not (its row is freed at the next step). Every status, 404 / 405 / 413 / 500 included, has
OpenAI's error body naming the field (``param``), with the headers its status calls for
(``responses.py``).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

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
from torch_tensorrt_dist.serving.limits import RequestLimits, check_fit, check_prompt_size
from torch_tensorrt_dist.serving.metrics import CONTENT_TYPE, Metrics
from torch_tensorrt_dist.serving.protocol import Params, RequestError
from torch_tensorrt_dist.serving.request_body import ClientGone, read_json
from torch_tensorrt_dist.serving.responses import RETRY_AFTER, UnhandledErrors, error_response

__all__ = ["CLIENT_GONE", "ServedModel", "create_app"]


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
    limits: RequestLimits


#: the status of a request whose client went away (nginx's "client closed request")
CLIENT_GONE = 499
#: how long a client may take to send its whole body
BODY_TIMEOUT_S = 30.0


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def _header(request: Request, name: bytes) -> bytes:
    """A request header's raw bytes ('' when absent): compared as sent, not as latin-1."""
    for key, value in request.scope["headers"]:
        if key == name:
            return bytes(value)
    return b""


async def _on_disconnect(request: Request, sub: Submission) -> None:
    """Wait for the client to go away (its body was read); then wake its handler."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    sub.sink.queue.put_nowait(Failed(CLIENT_GONE, "the client went away"))


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
        self.key = None if api_key is None else api_key.encode()
        #: chat templates and the tokenizer run here, never on the event loop
        self.pool = ThreadPoolExecutor(2, thread_name_prefix="tokenize")

    def authorize(self, request: Request) -> None:
        if self.key is None:
            return
        scheme, _, token = _header(request, b"authorization").strip().partition(b" ")
        # the scheme is case-insensitive (RFC 9110); the key is compared in constant time
        if not (hmac.compare_digest(token.strip(), self.key) and scheme.lower() == b"bearer"):
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
        """The prompt's token ids (in a worker thread: templates and tokenizers take time)."""
        if params.messages is not None:  # a chat request
            if self.model.chat is None:
                raise RequestError(
                    400,
                    f"model {self.model.name!r} has no chat template (no "
                    "chat_template in its tokenizer_config.json); use "
                    "/v1/completions",
                    param="messages",
                )
            try:
                text = self.model.chat.render(params.messages)
            except ConfigError as exc:
                raise RequestError(400, str(exc), param="messages") from exc
            except Exception as exc:  # the template's own error on these messages
                raise RequestError(
                    400,
                    f"the chat template failed on these messages ({type(exc).__name__}: {exc})",
                    param="messages",
                ) from exc
            return self._encode(text, special=False, param="messages")
        if isinstance(params.prompt, list):
            bad = [i for i in params.prompt if not 0 <= i < self.model.vocab_size]
            if bad:
                raise RequestError(
                    400,
                    f"prompt holds token ids {bad[:4]} outside [0, {self.model.vocab_size})",
                    param="prompt",
                )
            return params.prompt
        return self._encode(params.prompt or "", special=True, param="prompt")

    def _encode(self, text: str, *, special: bool, param: str) -> list[int]:
        try:
            return self.model.tokenizer.encode(text, add_special_tokens=special)
        except ConfigError as exc:  # the byte tokenizer: a byte beyond the vocabulary
            raise RequestError(400, str(exc), param=param) from exc

    async def submit(self, request: Request, *, chat: bool) -> Response:
        self.authorize(request)
        self.available()
        limits = self.model.limits
        try:
            body = await read_json(request, limit_bytes=limits.body_bytes, timeout_s=BODY_TIMEOUT_S)
        except ClientGone:
            self.metrics.requests.labels("cancelled").inc()
            return Response(status_code=CLIENT_GONE)
        params = protocol.parse_request(body, chat=chat)
        if params.model is not None and params.model != self.model.name:
            raise RequestError(
                404,
                f"model {params.model!r} is not served here; this server "
                f"serves {self.model.name!r}",
                param="model",
                code="model_not_found",
            )
        check_prompt_size(params, limits)  # before any work on the prompt
        ids = await asyncio.get_running_loop().run_in_executor(self.pool, self.prompt_ids, params)
        max_new = check_fit(len(ids), params, cache_len=self.model.cache_len)
        try:
            self.model.check(len(ids), max_new)  # the compiled buckets (artifacts)
        except ConfigError as exc:
            raise RequestError(400, str(exc), param="messages" if chat else "prompt") from exc
        top_p = params.top_p if params.top_p < 1.0 else None
        sampling = SamplingConfig(temperature=params.temperature, top_p=top_p)
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
        watch = asyncio.ensure_future(_on_disconnect(request, sub))
        text, tokens, cached = [], 0, 0
        try:
            while True:
                item = await sub.sink.queue.get()
                if isinstance(item, Failed):
                    if item.status == CLIENT_GONE:  # its row is freed at the next step
                        self.inbox.cancel(sub.rid)
                        self.metrics.requests.labels("cancelled").inc()
                        return Response(status_code=CLIENT_GONE)
                    raise RequestError(item.status, item.message, param=item.param)
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
        finally:
            watch.cancel()
            self.inbox.finished(sub.rid)

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
                    yield _sse(protocol.error_body(item.status, item.message, param=item.param))
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
            self.inbox.finished(sub.rid)
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
    app = FastAPI(
        title="torch_tensorrt_dist",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        redirect_slashes=False,  # a 404 in OpenAI's body, not a 307 elsewhere
    )
    app.add_middleware(UnhandledErrors, metrics=metrics)
    h = _Handler(model, inbox, state, metrics, api_key)

    @app.exception_handler(RequestError)
    async def request_error(_: Request, err: RequestError) -> Response:
        metrics.requests.labels(str(err.status)).inc()
        return error_response(err)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        """No such route (404) or method (405), in OpenAI's body."""
        metrics.requests.labels(str(exc.status_code)).inc()
        where = f"{request.method} {request.url.path}"
        if exc.status_code == 405:
            allow = (exc.headers or {}).get("Allow", "")
            message = f"{where}: the method is not allowed; use {allow}"
        elif exc.status_code == 404:
            message = (
                f"{where}: no such route; this server serves /v1/completions, "
                "/v1/chat/completions, /v1/models, /health and /metrics"
            )
        else:
            message = f"{where}: {exc.detail}"
        response = error_response(RequestError(exc.status_code, message))
        response.headers.update(exc.headers or {})
        return response

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
        if ready:
            return JSONResponse(body)
        return JSONResponse(body, status_code=503, headers={"Retry-After": RETRY_AFTER[503]})

    @app.get("/metrics")
    async def prometheus() -> Response:
        metrics.queue_depth.set(inbox.waiting)
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    return app
