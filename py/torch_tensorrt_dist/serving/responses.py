"""Error responses in OpenAI's body, with the headers each status calls for.

    return error_response(RequestError(429, "busy"))      # + Retry-After: 1
    app.add_middleware(UnhandledErrors, metrics=metrics)   # a bug: a 500 in the same body

401 carries ``WWW-Authenticate: Bearer``; 429 and 503 ``Retry-After``; 408 and 413 close the
connection (the rest of the body is not read). Error bodies are ASCII JSON: a message may quote
what the client sent, lone surrogates included.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from torch_tensorrt_dist.serving.metrics import Metrics
from torch_tensorrt_dist.serving.protocol import RequestError

if TYPE_CHECKING:
    from torch_tensorrt_dist.serving.frontend import ChildInbox

__all__ = ["RETRY_AFTER", "UnhandledErrors", "error_response"]

#: one record per unhandled error (``connections.quiet_logs`` bounds them)
logger = logging.getLogger(__name__)

#: seconds a client should wait before it retries, by status
RETRY_AFTER = {429: "1", 503: "5"}


class _ErrorJSON(JSONResponse):
    """An error body in ASCII JSON: a message may quote what the client sent."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode()


def error_response(err: RequestError) -> Response:
    """OpenAI's error body with the headers its status calls for."""
    headers = {}
    if err.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    if err.status in RETRY_AFTER:
        headers["Retry-After"] = RETRY_AFTER[err.status]
    if err.status in (408, 413):  # the rest of the body is not read: the connection ends
        headers["Connection"] = "close"
    return _ErrorJSON(err.body(), status_code=err.status, headers=headers)


class UnhandledErrors:
    """Outside the routes: an exception no handler turned into a status is logged once (one
    line with its traceback) and answered with a 500 in OpenAI's body. Starlette's own handler
    would answer in text and raise it again, for uvicorn to log a second time."""

    def __init__(self, app: ASGIApp, metrics: Metrics | ChildInbox) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            logger.error("%s %s failed", scope["method"], scope["path"], exc_info=exc)
            self.metrics.requests.labels("500").inc()
            if not started:  # else the response is cut short: the client sees the end
                err = RequestError(500, f"internal error: {type(exc).__name__}: {exc}")
                await error_response(err)(scope, receive, send)
