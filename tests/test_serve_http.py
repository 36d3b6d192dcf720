"""The HTTP layer's answers before a request reaches the step loop, in process (Starlette's test
client, no server): every status in OpenAI's body with the field it is about, the headers
each status calls for, the API key as HTTP compares it, and one log record per failure."""

from __future__ import annotations

import logging
from typing import Any

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient

from torch_tensorrt_dist.models.tokenizer import ByteTokenizer
from torch_tensorrt_dist.serving.api import ServedModel, create_app
from torch_tensorrt_dist.serving.bridge import Inbox, ServerState
from torch_tensorrt_dist.serving.chat import ChatTemplate
from torch_tensorrt_dist.serving.limits import request_limits
from torch_tensorrt_dist.serving.metrics import Metrics

KEY = "k3y-!~"
CACHE = 64


class _Tok(ByteTokenizer):
    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        if text.startswith("boom"):
            raise RuntimeError("the tokenizer broke")
        return super().encode(text, add_special_tokens=add_special_tokens)


def _client(state: str = "ready", max_waiting: int = 8, key: str | None = KEY) -> TestClient:
    tok = _Tok(256)
    chat = ChatTemplate("{% for m in messages %}{{ m['content'] + m['n'] }}{% endfor %}")
    model = ServedModel(
        "demo", tok, chat, CACHE, 256, lambda n, m: None, request_limits(tok, cache_len=CACHE)
    )
    st = ServerState()
    if state != "warming":
        st.set("ready")
    if state == "draining":
        st.set("draining")
    app = create_app(model, Inbox(max_waiting), st, Metrics(), api_key=key)
    return TestClient(app, raise_server_exceptions=False)


def _auth(scheme: str = "Bearer") -> dict[str, str]:
    return {"Authorization": f"{scheme} {KEY}"}


def _error(res: Any, status: int, param: str | None = None) -> dict[str, Any]:
    assert res.status_code == status, res.text
    error: dict[str, Any] = res.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param
    return error


def test_routes_methods_and_sizes_get_openai_bodies() -> None:
    c = _client()
    error = _error(c.get("/v1/nothing"), 404)
    assert "no such route" in error["message"] and error["type"] == "not_found_error"
    res = c.get("/v1/completions", headers=_auth())
    assert "use POST" in _error(res, 405)["message"] and res.headers["allow"] == "POST"
    _error(c.post("/v1/completions/", headers=_auth(), json={"prompt": "x"}), 404)  # no 307
    res = c.post("/v1/completions", headers=_auth(), content=b"x" * (2_000_000))
    assert _error(res, 413)["code"] == "request_too_large"
    assert res.headers["connection"] == "close"
    res = c.post("/v1/completions", headers=_auth(), json={"prompt": "x" * 600})
    assert "600 characters" in _error(res, 400, "prompt")["message"]
    res = c.post("/v1/completions", headers=_auth(), json={"prompt": "hi", "max_tokens": 63})
    assert "use max_tokens <= 62" in _error(res, 400, "max_tokens")["message"]


def test_the_key_retry_after_and_authenticate_headers() -> None:
    c = _client()
    res = c.post("/v1/completions", json={"prompt": "x"})
    assert _error(res, 401)["code"] == "invalid_api_key"
    assert res.headers["www-authenticate"] == "Bearer"
    for scheme in ("bearer", "BEARER"):  # the scheme is case-insensitive
        res = c.post("/v1/completions", headers=_auth(scheme), json={"prompt": "x" * 600})
        assert res.status_code == 400
    _error(c.post("/v1/completions", headers=_auth("Basic"), json={"prompt": "x"}), 401)
    res = _client("warming").post("/v1/completions", headers=_auth(), json={"prompt": "x"})
    assert _error(res, 503)["type"] == "service_unavailable" and res.headers["retry-after"]
    res = _client("draining").get("/health")
    assert res.status_code == 503 and res.headers["retry-after"]
    res = _client(max_waiting=0).post(
        "/v1/completions", headers=_auth(), json={"prompt": "x", "max_tokens": 2}
    )
    assert "busy" in _error(res, 429)["message"] and res.headers["retry-after"] == "1"


def test_failures_of_the_template_or_the_tokenizer_never_reach_uvicorn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    c = _client(key=None)
    body = {"messages": [{"role": "user", "content": "hi", "n": 1}]}  # str + int in the template
    res = c.post("/v1/chat/completions", json=body)
    assert (
        "the chat template failed on these messages (TypeError"
        in _error(res, 400, "messages")["message"]
    )
    with caplog.at_level(logging.ERROR):
        res = c.post("/v1/completions", json={"prompt": "boom"})
    error = _error(res, 500)
    assert (
        error["type"] == "server_error" and "RuntimeError: the tokenizer broke" in error["message"]
    )
    failed = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(failed) == 1 and failed[0].exc_info is not None  # one record, its traceback
