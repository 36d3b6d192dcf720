"""The HTTP API (rank 0): OpenAI's ``/v1/completions`` and ``/v1/chat/completions``, plus
``/v1/models``, vLLM's ``/tokenize`` and ``/detokenize`` (``tokenize.py``), ``/health`` and
``/metrics``.

    app = create_app(model, inbox, state, metrics, api_key=None, stream=StreamLimits())

A handler reads the body within a size and a time limit (``request_body.py``), checks the
request (``schema.py``), its size (``limits.py``) and its counts (``n``, ``best_of``, prompts)
before any work, renders the chat template, tokenizes and compiles its grammar in a worker
thread (``prepare.py``: the event loop never waits on a large prompt, the tokenizer releases the
interpreter lock; a short prompt without a grammar is prepared on the loop), checks it fits the
KV cache and hands it to the step loop through the :class:`Inbox`, one submission per prompt;
then it reads the pieces of its sequences from its own asyncio queue, as one JSON body or as
server-sent events ending with ``data: [DONE]`` (``answer.py``). It never touches a
tensor and never waits on the step loop. A client that goes away cancels its request, streamed
or not (its row is freed at the next step). A stream's pieces merge while its client reads
slowly; a client that stops reading for the write timeout is cut (``stream_out.py``). Every
status, 404 / 405 / 413 / 500 included, has OpenAI's error body naming the field (``param``),
with the headers its status calls for (``responses.py``).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from torch_tensorrt_dist.serving import protocol
from torch_tensorrt_dist.serving.answer import Answer, sse
from torch_tensorrt_dist.serving.bridge import (
    Failed,
    Inbox,
    QueueFull,
    ServerState,
    Sink,
    Submission,
)
from torch_tensorrt_dist.serving.limits import check_prompt_size
from torch_tensorrt_dist.serving.metrics import CONTENT_TYPE, Metrics
from torch_tensorrt_dist.serving.prepare import ServedModel, check_counts, inline, prepare
from torch_tensorrt_dist.serving.protocol import RequestError
from torch_tensorrt_dist.serving.request_body import ClientGone, read_json
from torch_tensorrt_dist.serving.responses import RETRY_AFTER, UnhandledErrors, error_response
from torch_tensorrt_dist.serving.schema import Params, parse_request
from torch_tensorrt_dist.serving.stream_out import PacedStream, StreamLimits
from torch_tensorrt_dist.serving.tokenize import detokenize, tokenize

if TYPE_CHECKING:
    from torch_tensorrt_dist.serving.frontend import ChildInbox

__all__ = ["CLIENT_GONE", "ServedModel", "create_app"]

logger = logging.getLogger(__name__)


#: the status of a request whose client went away (nginx's "client closed request")
CLIENT_GONE = 499
#: how long a client may take to send its whole body
BODY_TIMEOUT_S = 30.0
#: the status counted for a stream cut because its client stopped reading
CUT = "slow_client"


def _header(request: Request, name: bytes) -> bytes:
    """A request header's raw bytes ('' when absent): compared as sent, not as latin-1."""
    for key, value in request.scope["headers"]:
        if key == name:
            return bytes(value)
    return b""


async def _on_disconnect(request: Request, sub: Submission, sink: Sink) -> None:
    """Wait for the client to go away (its body was read); then wake its handler."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    sink.queue.put_nowait(Failed(CLIENT_GONE, "the client went away"))


class _Handler:
    def __init__(
        self,
        model: ServedModel,
        inbox: Inbox | ChildInbox,
        state: ServerState,
        metrics: Metrics | ChildInbox,
        api_key: str | None,
        stream: StreamLimits,
    ) -> None:
        self.model, self.inbox, self.state, self.metrics = model, inbox, state, metrics
        self.stream_limits = stream
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

    def check_model(self, req: Params) -> None:
        if req.model is not None and req.model != self.model.name:
            raise RequestError(
                404,
                f"model {req.model!r} is not served here; this server serves {self.model.name!r}",
                param="model",
                code="model_not_found",
            )

    async def submit(self, request: Request, *, chat: bool) -> Response:
        self.authorize(request)
        self.available()
        limits = self.model.limits
        try:
            body = await read_json(request, limit_bytes=limits.body_bytes, timeout_s=BODY_TIMEOUT_S)
        except ClientGone:
            self.metrics.requests.labels("cancelled").inc()
            return Response(status_code=CLIENT_GONE)
        req = parse_request(body, chat=chat)
        self.check_model(req)
        check_prompt_size(req, limits)  # before any work on the prompt
        check_counts(req, self.model)
        loop = asyncio.get_running_loop()
        if inline(req):  # a short prompt: the hop to a worker would take longer
            ready = prepare(req, self.model)
        else:
            ready = await loop.run_in_executor(self.pool, prepare, req, self.model)
        sink = Sink(loop, self.stream_limits.max_pending)
        subs = ready.submissions(req, sink)
        try:
            self.inbox.submit(*subs)
        except QueueFull as exc:
            raise RequestError(429, f"the server is busy: {exc}; retry later") from exc
        self.metrics.prompt_tokens.inc(sum(len(ids) for ids in ready.prompts))
        head = {
            "rid": f"{'chatcmpl' if chat else 'cmpl'}-{subs[0].rid}",
            "created": int(time.time()),
            "model": self.model.name,
        }
        answer = Answer(req, subs, ready, head, self.model.tokenizer.token_text)
        if req.stream:

            def cut(reason: str) -> None:  # the stream's cleanup then cancels the request
                answer.status = CUT

            def written(made: float) -> None:
                self.metrics.write_delay.observe(time.monotonic() - made)

            def closed() -> None:  # however the stream ended, its response started or not
                self._leave(answer)
                self.metrics.requests.labels(answer.status).inc()

            return PacedStream(
                self.stream(answer, sink),
                sink.queue,
                self.stream_limits,
                on_cut=cut,
                on_write=written,
                on_close=closed,
            )
        return await self.collect(request, answer, sink)

    async def tokens(self, request: Request, work: Any) -> Response:
        """``/tokenize`` or ``/detokenize`` (``tokenize.py``), in the tokenizer's thread."""
        self.authorize(request)
        try:
            body = await read_json(
                request, limit_bytes=self.model.limits.body_bytes, timeout_s=BODY_TIMEOUT_S
            )
        except ClientGone:
            return Response(status_code=CLIENT_GONE)
        name = body.get("model") if isinstance(body, dict) else None
        if name is not None and name != self.model.name:
            raise RequestError(
                404,
                f"model {name!r} is not served here; this server serves {self.model.name!r}",
                param="model",
                code="model_not_found",
            )
        loop = asyncio.get_running_loop()
        return JSONResponse(await loop.run_in_executor(self.pool, work, body, self.model))

    def _leave(self, answer: Answer) -> None:
        """The request has its answer (or its client left): cancel what still runs."""
        for sub in answer.subs:
            if answer.status != "200":
                self.inbox.cancel(sub.rid)
            self.inbox.finished(sub.rid)

    async def collect(self, request: Request, answer: Answer, sink: Sink) -> Response:
        watch = asyncio.ensure_future(_on_disconnect(request, answer.subs[0], sink))
        try:
            body = await answer.collect(sink.queue)
        except RequestError as err:
            if err.status == CLIENT_GONE:  # its rows are freed at the next step
                answer.status = "cancelled"
                self.metrics.requests.labels("cancelled").inc()
                return Response(status_code=CLIENT_GONE)
            raise
        finally:
            watch.cancel()
            self._leave(answer)
        self.metrics.requests.labels("200").inc()
        return JSONResponse(body)

    async def stream(self, answer: Answer, sink: Sink) -> AsyncIterator[tuple[str, float]]:
        """The stream's events, each with its text's step time (``Piece.made``; 0: none), then
        ``[DONE]``: also after an error event, whether the step loop failed the request
        (``Failed``) or producing an event raised (a bug: its headers have gone, so the error
        is an event, not a 500 response). The request's cleanup is the ``PacedStream``'s
        ``on_close``: it runs also where this never started (a start past its deadline, a
        client gone before it)."""
        try:
            async for event in answer.events(sink.queue):
                yield event, answer.made
                answer.made = 0.0  # a piece's other events (deltas, its finish): counted once
        except Exception as exc:
            logger.exception("a stream failed")
            answer.status = "500"
            message = f"internal error: {type(exc).__name__}: {exc}"
            yield sse(protocol.error_body(500, message)), 0.0
        yield "data: [DONE]\n\n", 0.0


def create_app(
    model: ServedModel,
    inbox: Inbox | ChildInbox,
    state: ServerState,
    metrics: Metrics | ChildInbox,
    *,
    api_key: str | None = None,
    stream: StreamLimits | None = None,
) -> FastAPI:
    """The FastAPI application of one server (rank 0's HTTP thread, or its HTTP process: there
    ``inbox`` and ``metrics`` are the child's stand-ins, ``frontend.ChildInbox``)."""
    app = FastAPI(
        title="torch_tensorrt_dist",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        redirect_slashes=False,  # a 404 in OpenAI's body, not a 307 elsewhere
    )
    app.add_middleware(UnhandledErrors, metrics=metrics)
    h = _Handler(model, inbox, state, metrics, api_key, stream or StreamLimits())

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
                "/v1/chat/completions, /v1/models, /tokenize, /detokenize, /health and /metrics"
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

    @app.post("/tokenize")
    async def tokenize_route(request: Request) -> Response:
        return await h.tokens(request, tokenize)

    @app.post("/detokenize")
    async def detokenize_route(request: Request) -> Response:
        return await h.tokens(request, detokenize)

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
        return Response(await metrics.scrape(inbox.waiting), media_type=CONTENT_TYPE)

    return app
