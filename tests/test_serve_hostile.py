"""A hostile client against one real ``serve --tp 2`` (gloo, loopback): thousands of generated
requests (random JSON types, extreme numbers, unicode edge cases, sizes, broken bodies) leave
it up and answering 2xx/4xx in OpenAI's body, and a plain request then returns what it
returned on the fresh server; a request that used to kill every rank fails alone; big inputs
never stall another stream; a non-streamed client that leaves frees its row at once."""

from __future__ import annotations

import asyncio
import json
import random
import re
import socket
import threading
import time
from typing import Any

import pytest

from ._serve import Server, demo_tp2_server, demo_with_chat_template

httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.slow

KEY = "hostile-key"
CACHE = 128
ROWS = 4
PLAIN = {"prompt": "The return statement", "max_tokens": 24, "temperature": 0}
LONG = "A class definition defines a class object"  # greedy, it runs without an end token


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    ckpt = demo_with_chat_template(tmp_path_factory.mktemp("hostile") / "demo-chat")
    srv = demo_tp2_server(ckpt, rows=ROWS, max_seq_len=CACHE, max_queue=32, key=KEY)
    yield srv
    srv.kill()


@pytest.fixture(scope="module")
def fresh(server: Server) -> str:
    """The plain request's text on the fresh server (before any hostile request)."""
    return str(_post(server, PLAIN).json()["choices"][0]["text"])


def _post(
    server: Server,
    body: Any,
    path: str = "completions",
    extra: dict[str, str] | None = None,
    **kw: Any,
) -> Any:
    headers = {"Authorization": f"Bearer {KEY}", **(extra or {})}
    if body is not None:
        kw["json"] = body
    return httpx.post(f"{server.url}/v1/{path}", headers=headers, timeout=60, **kw)


def _metric(server: Server, name: str) -> float:
    return server.metrics().get(name, 0.0)


# -- the generator --------------------------------------------------------------------------

BIG_DIGITS = "__BIG_DIGITS__"
STRINGS = [
    "",
    "x",
    "Hello",
    "\u0000",
    "\ud800",  # a lone surrogate (JSON spells it \ud800)
    "a\udfffb",
    "😀" * 40,
    "e\u0301" * 60,
    "\u202eright-to-left",
    "\ufeff\u200b\u200d",
    "ﷺ" * 30,
    "<s></s>",
    "<|assistant|>\n",
    "\\\"'",
    "\x7f\x1b[31m",
    " " * 3000,
    "\n" * 400,
    "word " * 1600,  # 8,000 characters: tokenized in a worker, then too long for the cache
    "z" * 40_000,  # beyond the prompt's character limit
]
NUMBERS: list[Any] = [
    0,
    1,
    2,
    3,
    -1,
    0.5,
    1.5,
    3.0,
    -0.0,
    1e-300,
    7e-46,
    2.0**-149,
    1e-40,
    1e308,
    -1e308,
    float("nan"),
    float("inf"),
    10**20,
    2**63,
    2**64,
    10**4000,
    BIG_DIGITS,  # 5,000 digits: more than Python converts
    True,
    False,
    None,
    "3",
]
FIELDS = {
    "max_tokens": [1, 2, 3, 3.0, 0, -1, 1.5, 10**20, 2**63, "2", True, None],
    "temperature": NUMBERS,
    "top_p": NUMBERS,
    "seed": NUMBERS,
    "n": [1, 2, 0, None, 1.0],
    "stream": [True, False, "yes", None, 1],
    "stream_options": [{"include_usage": True}, [], "x", None],
    "stop": [None, "the", ["\n"], [""], ["a"] * 5, "s" * 300, ["\ud800"], 5, [[]]],
    "model": ["demo", "gpt-4", "", 7, None, "\ud800"],
    "logprobs": [None, False, 2, True],
    "echo": [False, True],
    "best_of": [1, 3],
    "suffix": ["", "x"],
    "logit_bias": [{}, {"5": 100}],
    "presence_penalty": [0, 1.5],
    "tools": [[], [{"type": "function"}]],
    "response_format": [{"type": "text"}, {"type": "json_object"}],
    "user": ["u", 5],
    "unknown_field": [{"deep": [1, 2, {"x": None}]}],
}


def _value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(7 if depth < 3 else 4)
    if kind == 0:
        return rng.choice(NUMBERS)
    if kind == 1:
        return rng.choice(STRINGS)
    if kind == 2:
        return rng.choice([True, False, None])
    if kind == 3:
        return [rng.randrange(-5, 2000) for _ in range(rng.randrange(0, 12))]
    if kind == 4:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))]
    if kind == 5:
        return {rng.choice(["role", "content", "type", "text", "x"]): _value(rng, depth + 1)}
    return [[1, 2], [3]]


def _message(rng: random.Random) -> Any:
    if rng.random() < 0.7:
        return {"role": rng.choice(["user", "system", "assistant"]), "content": "Say hi"}
    role = rng.choice(["user", "tool", "robot", None, 5])
    content = rng.choice(
        [_value(rng), [{"type": "text", "text": rng.choice(STRINGS)}], [{"type": "image"}]]
    )
    return {"role": role, "content": content}


def _dump(body: Any) -> bytes:
    text = json.dumps(body)  # NaN and Infinity as Python's json writes them (and reads them)
    return text.replace(f'"{BIG_DIGITS}"', "9" * 5000).encode()


def hostile_request(rng: random.Random) -> tuple[str, str, dict[str, str], bytes]:
    """(method, path, headers, body) of one generated request."""
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    r = rng.random()
    if r < 0.03:
        headers.pop("Authorization")
    elif r < 0.06:
        headers["Authorization"] = rng.choice([f"bearer {KEY}", "Bearer nope", KEY, "Bearer"])
    chat = rng.random() < 0.4
    path = "/v1/chat/completions" if chat else "/v1/completions"
    if rng.random() < 0.03:
        return rng.choice(["GET", "PUT", "DELETE"]), path, headers, b""
    if rng.random() < 0.03:
        return "POST", rng.choice(["/v1/completions/", "/v1/x", "/", "/v1/models"]), headers, b"{}"
    r = rng.random()
    if r < 0.06:  # not JSON, or JSON a reader chokes on, or too large
        raw = rng.choice(
            [
                b"",
                b"{",
                b'{"prompt": "x"',
                b"\xff\xfe",
                b"[" * 50_000 + b"]" * 50_000,
                b'{"prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}",
                b'{"prompt": "' + b"x" * 1_300_000 + b'"}',
                bytes(rng.randrange(256) for _ in range(64)),
            ]
        )
        return "POST", path, headers, raw
    if r < 0.10:
        return "POST", path, headers, _dump(_value(rng))
    body: dict[str, Any] = {}
    if chat:
        if rng.random() < 0.8:
            body["messages"] = [_message(rng) for _ in range(rng.randrange(1, 4))]
        else:
            body["messages"] = _value(rng)
    elif rng.random() < 0.7:
        body["prompt"] = rng.choice(["Hello", "The return statement", [5, 6, 7], ["Python"]])
    else:
        body["prompt"] = rng.choice([_value(rng), rng.choice(STRINGS)])
    body["max_tokens" if rng.random() < 0.8 else "max_completion_tokens"] = rng.choice(
        FIELDS["max_tokens"][:3]
    )
    for name, values in FIELDS.items():
        if rng.random() < 0.15:
            body[name] = rng.choice(values)
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = 2  # the cache's remainder would cost this test seconds
    return "POST", path, headers, _dump(body)


def test_generated_requests_are_stable_across_runs() -> None:
    a = [hostile_request(random.Random(31)) for _ in range(3)]
    assert a == [hostile_request(random.Random(31)) for _ in range(3)]


def _check(status: int, content: bytes, stream: bool) -> str | None:
    """What is wrong with one answer (None: a 2xx, or a 4xx in OpenAI's body)."""
    if status >= 500:
        return f"status {status}: {content[:300]!r}"
    if status >= 400:
        try:
            error = json.loads(content)["error"]
        except (ValueError, KeyError, TypeError):
            return f"status {status} without OpenAI's body: {content[:200]!r}"
        if set(error) != {"message", "type", "param", "code"}:
            return f"status {status} error body {error}"
        return None
    if stream:
        text = content.decode()
        if not text.rstrip().endswith("data: [DONE]") and '"error"' not in text:
            return f"a stream that did not end: {text[-200:]!r}"
        return None
    if not content.startswith(b"{") or b'"choices"' not in content:
        return f"status {status}: {content[:200]!r}"
    return None


async def _fuzz(url: str, n: int, seed: int, concurrency: int) -> tuple[list[str], dict[int, int]]:
    """Problems found, and the count of each status (-413: a refused body cut short)."""
    rng = random.Random(seed)
    requests = [hostile_request(rng) for _ in range(n)]
    problems: list[str] = []
    statuses: dict[int, int] = {}
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:

        async def one(i: int) -> None:
            method, path, headers, body = requests[i]
            async with sem:
                try:
                    res = await client.request(method, path, headers=headers, content=body)
                except httpx.TransportError as exc:
                    # the only requests the server may cut short: bodies it refuses by size
                    # (its 413 comes before the upload ends; the client may not read it)
                    if len(body) < 1_000_000:
                        problems.append(f"request {i}: {type(exc).__name__}: {exc}")
                    statuses[-413] = statuses.get(-413, 0) + 1
                    return
            statuses[res.status_code] = statuses.get(res.status_code, 0) + 1
            stream = b'"stream": true' in body
            problem = _check(res.status_code, res.content, stream)
            if problem is not None:
                problems.append(f"request {i} ({body[:120]!r}): {problem}")

        await asyncio.gather(*(one(i) for i in range(n)))
    return problems, statuses


def test_thousands_of_hostile_requests_leave_the_server_up_and_exact(
    server: Server, fresh: str
) -> None:
    start = time.monotonic()
    problems, statuses = asyncio.run(_fuzz(server.url, 2000, seed=31, concurrency=8))
    elapsed = time.monotonic() - start
    assert not problems, "\n".join(problems[:10])
    assert statuses.get(200, 0) > 200 and sum(v for k, v in statuses.items() if k >= 400) > 1000
    assert {400, 401, 404, 405} <= set(statuses), statuses
    assert statuses.get(413, 0) + statuses.get(-413, 0) > 0, statuses  # -413: cut short
    assert server.health()["status"] == "ready"
    assert _post(server, PLAIN).json()["choices"][0]["text"] == fresh
    assert _metric(server, 'torchtrt_requests_total{status="500"}') == 0
    output = server.output()
    assert "Traceback" not in output and "Exception in ASGI application" not in output
    assert elapsed < 120, f"{elapsed:.0f} s"


def test_a_request_that_killed_every_rank_fails_alone(server: Server, fresh: str) -> None:
    result: dict[str, Any] = {}
    stream = threading.Thread(target=lambda: result.update(text=_stream_text(server)))
    stream.start()
    res = _post(server, {"prompt": "Hello", "temperature": 1, "top_p": 1e-300})
    assert res.status_code == 400 and res.json()["error"]["param"] == "top_p"
    tiny = _post(server, {"prompt": "Hello", "temperature": 1, "top_p": 1e-40, "max_tokens": 8})
    greedy = _post(server, {"prompt": "Hello", "temperature": 0, "max_tokens": 8})
    assert tiny.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]
    stream.join(60)
    assert result["text"] == fresh and server.health()["status"] == "ready"


def _stream_text(server: Server, body: dict[str, Any] = PLAIN) -> str:
    text = []
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream(
        "POST", f"{server.url}/v1/completions", json={**body, "stream": True}, headers=headers
    ) as res:
        for line in res.iter_lines():
            if line.startswith("data: {"):
                text.append(json.loads(line[6:])["choices"][0]["text"])
    return "".join(text)


FIVE_THOUSAND = {
    "type": "object",
    "properties": {f"p{i}": {"type": "integer"} for i in range(5000)},
}


def test_big_inputs_never_delay_another_stream(server: Server) -> None:
    """A 5 MB prompt (413 before a byte is read), 5 MB of chat messages (413), a prompt
    at the character limit that the tokenizer takes (400: too many tokens) and 200,000
    messages, and a schema of 5,000 properties (400 naming guided_json: the grammar engine's
    row limit, found by following it before any step, after a compile of 3-7 s that releases
    the interpreter lock) while a stream runs: no gap between its pieces reaches 2.5 s.

    The wrong ways cost more than that here: tokenizing the 5 MB prompt on the event loop
    takes 5.7 s with the demo tokenizer, rendering the 200,000 messages' chat template 2.2 s
    and tokenizing its 3.2 MB about 4 s more. The bound is not tighter because a healthy
    stream's gap has reached 1.03 s here under the suite's two workers (CI, two cores): the
    other worker's processes took the cores. The bodies are encoded before the stream
    starts, so the test's own JSON encoding (0.14 s for the 200,000 messages) holds no gap."""
    gaps: list[float] = []
    done = threading.Event()

    def stream() -> None:
        headers = {"Authorization": f"Bearer {KEY}"}
        body = {"prompt": LONG, "max_tokens": 100, "temperature": 0, "stream": True}
        last = None
        with httpx.stream(
            "POST", f"{server.url}/v1/completions", json=body, headers=headers, timeout=60
        ) as res:
            for _ in res.iter_lines():
                now = time.monotonic()
                if last is not None:
                    gaps.append(now - last)
                last = now
        done.set()

    bodies = [
        (json.dumps(body).encode(), path)
        for body, path in (
            ({"prompt": "x", "guided_json": FIVE_THOUSAND}, "completions"),  # first: the longest
            ({"prompt": "a" * 5_000_000}, "completions"),
            ({"messages": [{"role": "user", "content": "b" * 5_000_000}]}, "chat/completions"),
            ({"prompt": "word " * 1600}, "completions"),
            ({"messages": [{"role": "user", "content": "hi"}] * 200_000}, "chat/completions"),
        )
    ]
    t = threading.Thread(target=stream)
    t.start()
    time.sleep(0.5)
    statuses = []
    headers = {"Content-Type": "application/json"}
    for content, path in bodies:
        try:
            statuses.append(_post(server, None, path, content=content, extra=headers).status_code)
        except httpx.TransportError:  # the server answered 413 and closed before the upload
            statuses.append(413)
    t.join(60)
    assert done.is_set() and statuses == [400, 413, 413, 400, 413]
    assert max(gaps) < 2.5, f"a stream stalled {max(gaps):.2f} s"


def test_a_non_streamed_client_that_leaves_frees_its_row_at_once(server: Server) -> None:
    body = json.dumps({"prompt": LONG, "max_tokens": 100, "temperature": 0}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    host, port = re.match(r"http://([\d.]+):(\d+)", server.url).groups()  # type: ignore[union-attr]
    clients = [socket.create_connection((host, int(port))) for _ in range(ROWS)]
    for c in clients:
        c.sendall(head + body)
    deadline = time.monotonic() + 30
    while _metric(server, "torchtrt_running_requests") != ROWS:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    for c in clients:
        c.close()
    start = time.monotonic()
    while _metric(server, "torchtrt_running_requests") != 0:
        assert time.monotonic() - start < 3, "the rows of clients that left still run"
        time.sleep(0.05)
    res = _post(server, {"prompt": "x", "max_tokens": 2})
    assert res.status_code == 200 and time.monotonic() - start < 5
