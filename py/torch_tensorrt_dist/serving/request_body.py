"""A request's JSON body, read within a size and a time limit.

    body = await read_json(request, limit_bytes=limits.body_bytes, timeout_s=30.0)

``Content-Length`` above the limit is refused before a byte of the body is read (413); a body
that grows past it while read is refused there (413; a chunked body has no length). A client
that has not sent its whole body within ``timeout_s`` gets 408: a slow sender cannot hold a
handler, and its connection, for ever. Whatever ``json.loads`` refuses is a 400 that says why:
invalid JSON or UTF-8, an integer longer than Python converts (4,300 digits), nesting deeper
than its recursion limit.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.requests import ClientDisconnect, Request

from torch_tensorrt_dist.serving.protocol import RequestError

__all__ = ["ClientGone", "parse_json", "read_json"]


class ClientGone(Exception):
    """The client closed its connection before its body arrived (nobody to answer)."""


def parse_json(raw: bytes) -> Any:
    """The JSON value of ``raw``; RequestError(400) naming what is wrong (pure)."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise RequestError(
            400,
            "the request body is not JSON this server reads: it nests arrays or objects too deeply",
        ) from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, a too long integer
        raise RequestError(400, f"the request body is not JSON: {exc}") from None


def _too_large(size: int | str, limit: int) -> RequestError:
    return RequestError(
        413,
        f"the request body has {size} bytes; this server takes at most {limit} (the largest "
        "prompt its KV cache holds, escaped, plus 1 MiB)",
        code="request_too_large",
    )


async def _read(request: Request, limit: int) -> bytes:
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(f"more than {limit}", limit)
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientGone() from None
    return b"".join(chunks)


async def read_json(request: Request, *, limit_bytes: int, timeout_s: float) -> Any:
    """The request's body as JSON (see the module docstring)."""
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise RequestError(400, f"Content-Length {length!r} is not a number of bytes")
        if int(length) > limit_bytes:
            raise _too_large(int(length), limit_bytes)
    try:
        raw = await asyncio.wait_for(_read(request, limit_bytes), timeout_s)
    except TimeoutError:
        raise RequestError(
            408,
            f"the request body did not arrive within {timeout_s:g} s; send it at once",
            code="request_timeout",
        ) from None
    return parse_json(raw)
