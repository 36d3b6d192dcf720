"""A seeded fuzz of the grammar, sampling and ``n`` fields (issue 55) against the HTTP app in
process, over a real step loop on the demo model (one rank, eager graphs): 2,000 requests,
most refused by validation, every answer a 2xx or a 4xx whose body names a field the request
sent (``param``); the answers that run are checked against what their fields promise (the
choice is one of the list, the regex matches, ``min_tokens`` tokens at least); the step loop
is alive afterwards and a plain request gives the text it gave on the fresh app."""

from __future__ import annotations

import asyncio
import json
import random
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from torch_tensorrt_dist.generation import Generator
from torch_tensorrt_dist.generation.grammar import Grammars
from torch_tensorrt_dist.models.demo import demo_checkpoint_path
from torch_tensorrt_dist.models.tokenizer import load_tokenizer
from torch_tensorrt_dist.parallel.llama_load import load_llama

from ._serve import CHAT_TEMPLATE

pytest.importorskip("fastapi")
pytest.importorskip("llguidance", reason="structured output needs llguidance (the serve extra)")
httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.slow

from torch_tensorrt_dist.serving.api import ServedModel, create_app  # noqa: E402
from torch_tensorrt_dist.serving.bridge import Inbox, ServerState  # noqa: E402
from torch_tensorrt_dist.serving.chat import ChatTemplate  # noqa: E402
from torch_tensorrt_dist.serving.control import ControlChannel  # noqa: E402
from torch_tensorrt_dist.serving.limits import request_limits  # noqa: E402
from torch_tensorrt_dist.serving.loop import Leader, StepLoop  # noqa: E402
from torch_tensorrt_dist.serving.metrics import Metrics  # noqa: E402

DEMO = demo_checkpoint_path()
V, EOS, ROWS, CACHE = 1024, (1,), 4, 96
PLAIN = {"prompt": "The return statement", "max_tokens": 12, "temperature": 0}

# -- the generator: each field's values, valid and not ---------------------------------------

NAN, INF = float("nan"), float("inf")
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
SCHEMAS: list[Any] = [
    PERSON,
    json.dumps(PERSON),
    {"$ref": "#"},  # nothing satisfies it
    {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    {"type": "foo"},
    {"type": "integer", "minimum": 5, "maximum": 3},
    "{not json",
    {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(600)}},
    [1],
    7,
]
REGEXES: list[Any] = ["[a-z]{1,4}", "a{1,3}", "[0-9]{2}", r"[^\s\S]", "(a", r"(a)\1", "", 5]
CHOICES: list[Any] = [["yes", "no"], ["x"], [], ["a", 3], "yes", None]
FIELDS: dict[str, list[Any]] = {
    "temperature": [0, 0.7, 1, 2, 1e-300, -1, 3, NAN, "1"],
    "top_p": [1, 0.5, 1e-40, 1e-300, 0, 2],
    "top_k": [-1, 0, 5, 1.5, -2],
    "seed": [1, 7, 2**64, -1],
    "n": [1, 2, 4, 5, 0, "2"],
    "best_of": [1, 3, 8, 0],
    "stream": [True, False],
    "presence_penalty": [0, 1.5, 2.5, NAN],
    "frequency_penalty": [0, -2, 3],
    "repetition_penalty": [1, 1.3, 0.01, 100, 1e-300, 0.009, 101, 0, -1, INF],
    "logit_bias": [{}, {"5": 100}, {"5": -100}, {"99999": 1}, {"x": 1}, {"1": 101}, [1]],
    "min_tokens": [0, 2, 3, 10, 200, -1],
    "ignore_eos": [True, False, "yes"],
    "stop_token_ids": [[], [5], list(range(V)), [99999], ["a"]],
    "logprobs": [0, 3, 21, True],
    "response_format": [
        {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}},
        {"type": "json_schema", "json_schema": {"name": "p", "schema": {"$ref": "#"}}},
        {"type": "x"},
    ],
    "guided_json": SCHEMAS,
    "guided_regex": REGEXES,
    "guided_choice": CHOICES,
}
#: fields of the grammar (at most one valid per request), picked less often than the others
GRAMMAR = ("response_format", "guided_json", "guided_regex", "guided_choice")


def fuzz_request(rng: random.Random) -> tuple[str, dict[str, Any]]:
    """(path, body) of one generated request: a prompt, a short max_tokens, a few fields."""
    chat = rng.random() < 0.3
    body: dict[str, Any] = {"max_tokens": rng.choice([1, 2, 4, 8]) if rng.random() > 0.05 else 0}
    if chat:
        body["messages"] = [{"role": "user", "content": rng.choice(["Hi", "Say a number"])}]
    else:
        body["prompt"] = rng.choice(["Hello", "The return statement", [5, 6, 7]])
    for name, values in FIELDS.items():
        if rng.random() < (0.08 if name in GRAMMAR else 0.18):
            body[name] = rng.choice(values)
    if chat and body.get("logprobs") is not None:  # chat's logprobs are a bool
        body["top_logprobs"] = body.pop("logprobs")
        body["logprobs"] = rng.random() < 0.8
    return ("/v1/chat/completions" if chat else "/v1/completions"), body


def test_generated_requests_are_stable_across_runs() -> None:
    a = [fuzz_request(random.Random(55)) for _ in range(5)]
    assert a == [fuzz_request(random.Random(55)) for _ in range(5)]


# -- the app in process, over a real step loop -----------------------------------------------


class App:
    """The HTTP app and rank 0's step loop (a thread) of one in-process server."""

    def __init__(self) -> None:
        tok = load_tokenizer(DEMO, vocab_size=V)
        gen = Generator(load_llama(DEMO, progress=False), max_batch_size=ROWS, cache_len=CACHE)
        core = gen.core(tokenizer=tok, text=True)
        core.isolate = True
        core.grammars = Grammars.for_tokenizer(tok, vocab_size=V, eos_ids=EOS)
        model = ServedModel(
            "demo",
            tok,
            ChatTemplate(CHAT_TEMPLATE, {"bos_token": "<s>", "eos_token": "</s>"}),
            CACHE,
            V,
            lambda n, m: gen.runner.check([[0] * n], m),
            request_limits(tok, cache_len=CACHE),
            rows=ROWS,
            max_queue=16,
            grammars=core.grammars,
            eos_ids=EOS,
        )
        self.state, inbox = ServerState(), Inbox(64)
        self.leader = Leader(
            StepLoop(core, ControlChannel(None)),
            gen.scheduler(core),
            inbox,
            self.state,
            stop_ids=EOS,
            idle_tick_s=0.002,
        )
        self.app = create_app(model, inbox, self.state, Metrics())
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="step-loop", daemon=True)
        self.state.set("ready")
        self.thread.start()

    def _run(self) -> None:
        try:
            self.leader.run()
        except BaseException as exc:  # the test reads it
            self.error = exc

    def stop(self) -> None:
        self.state.set("draining")
        self.thread.join(30)

    def client(self) -> Any:
        return httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url="http://app", timeout=60
        )


@pytest.fixture(scope="module")
def app() -> Iterator[App]:
    server = App()
    yield server
    server.stop()


async def _send(
    app: App, requests: list[tuple[str, dict[str, Any]]], concurrency: int
) -> list[Any]:
    sem = asyncio.Semaphore(concurrency)
    async with app.client() as client:

        async def one(path: str, body: dict[str, Any]) -> Any:
            async with sem:
                content = json.dumps(body)  # NaN and Infinity as Python writes them
                headers = {"Content-Type": "application/json"}
                return await client.post(path, content=content, headers=headers)

        return await asyncio.gather(*(one(p, b) for p, b in requests))


def _plain(app: App) -> str:
    (res,) = asyncio.run(_send(app, [("/v1/completions", PLAIN)], 1))
    assert res.status_code == 200, res.text
    return str(res.json()["choices"][0]["text"])


def _events(text: str) -> list[dict[str, Any]]:
    lines = [ln[6:] for ln in text.splitlines() if ln.startswith("data: ")]
    assert lines and lines[-1] == "[DONE]", text[-300:]
    return [json.loads(ln) for ln in lines[:-1]]


def _problem(body: dict[str, Any], status: int, text: str) -> str | None:
    """What is wrong with one answer (None: what its fields promise)."""
    if status >= 400:
        try:
            error = json.loads(text)["error"]
        except (ValueError, KeyError, TypeError):
            return f"status {status} without OpenAI's body: {text[:200]!r}"
        if status >= 500 or not error.get("param") or error["param"] not in body:
            return f"status {status} naming {error.get('param')!r}: {error['message'][:200]}"
        return None
    if status != 200:
        return f"status {status}"
    if body.get("stream"):
        events = _events(text)
        errors = [e["error"] for e in events if "error" in e]
        if errors:  # a request failed in the step loop: named like a 400
            bad = [e for e in errors if not e.get("param") or e["param"] not in body]
            return f"stream error naming no field it sent: {bad}" if bad else None
        choices = [c for e in events for c in e["choices"]]
        texts: dict[int, str] = {}
        finish: dict[int, str] = {}
        for c in choices:
            piece = c.get("text", (c.get("delta") or {}).get("content")) or ""
            texts[c["index"]] = texts.get(c["index"], "") + piece
            if c.get("finish_reason"):
                finish[c["index"]] = c["finish_reason"]
        return _promised(body, [(texts[i], finish.get(i), None) for i in sorted(texts)])
    answer = json.loads(text)
    out = []
    for c in answer["choices"]:
        content = c["text"] if "text" in c else c["message"]["content"]
        out.append((content, c["finish_reason"], answer["usage"]["completion_tokens"]))
    return _promised(body, out)


def _promised(
    body: dict[str, Any], choices: list[tuple[str, str | None, int | None]]
) -> str | None:
    """The text of each choice against the grammar and ``min_tokens`` it was asked for."""
    for text, finish, _ in choices:
        if finish not in ("stop", "length"):
            return f"finish {finish!r}"
        if finish != "stop" or body.get("stop_token_ids"):
            continue  # cut by max_tokens, or by a stop id (not shown): a prefix of a match
        if body.get("guided_choice") is not None and text not in body["guided_choice"]:
            return f"{text!r} is not one of {body['guided_choice']}"
        regex = body.get("guided_regex")
        if regex is not None and not re.fullmatch(regex, text):
            return f"{text!r} does not match {regex!r}"
    grammar = any(body.get(name) is not None for name in GRAMMAR)
    n = body.get("n") or 1
    used = choices[0][2] if choices else None
    if not grammar and used is not None and used < n * (body.get("min_tokens") or 0):
        return f"{used} tokens for min_tokens {body['min_tokens']} x {n}"
    return None


def test_thousands_of_fuzzed_field_combinations_are_answered_by_name(app: App) -> None:
    fresh = _plain(app)
    rng = random.Random(55)
    requests = [fuzz_request(rng) for _ in range(2000)]
    start = time.monotonic()
    answers = asyncio.run(_send(app, requests, concurrency=8))
    elapsed = time.monotonic() - start
    statuses: dict[int, int] = {}
    params: dict[str, int] = {}
    problems = []
    for i, ((_, body), res) in enumerate(zip(requests, answers)):
        statuses[res.status_code] = statuses.get(res.status_code, 0) + 1
        if res.status_code == 400:
            param = res.json()["error"]["param"]
            params[param] = params.get(param, 0) + 1
        problem = _problem(body, res.status_code, res.text)
        if problem is not None:
            problems.append(f"request {i} {json.dumps(body)[:300]}: {problem}")
    assert not problems, "\n".join(problems[:10])
    assert app.thread.is_alive() and app.error is None and app.state.state == "ready"
    assert _plain(app) == fresh
    # most are refused by validation (cheap); every field of the fuzz is named by some 400
    assert statuses.get(200, 0) > 150 and statuses.get(400, 0) > 1200, statuses
    named = {"repetition_penalty", "min_tokens", "guided_regex", "guided_json", "n", "best_of"}
    assert named <= set(params), params
    assert elapsed < 120, f"{elapsed:.0f} s"


def test_each_reproduction_is_a_400_naming_its_field(app: App) -> None:
    """issue 55's reproductions, one by one, and a plain request after them."""
    fresh = _plain(app)
    cases = [
        ({"repetition_penalty": 1e-300, "temperature": 1}, "repetition_penalty", "[0.01, 100]"),
        ({"min_tokens": 2, "stop_token_ids": list(range(V))}, "min_tokens", "every token"),
        ({"guided_regex": r"[^\s\S]"}, "guided_regex", "allows no text"),
        ({"guided_json": {"$ref": "#"}}, "guided_json", "allows no text"),
        ({"guided_json": SCHEMAS[7]}, "guided_json", "max is 2000"),
    ]
    requests = [("/v1/completions", {"prompt": "Hello", "max_tokens": 4, **b}) for b, _, _ in cases]
    answers = asyncio.run(_send(app, requests, concurrency=1))
    for (_, param, message), res in zip(cases, answers):
        assert res.status_code == 400, res.text
        error = res.json()["error"]
        assert error["param"] == param and message in error["message"], error
    # min_tokens with a grammar: the grammar's end wins ("a{1,3}": at most 3 tokens)
    body = {"prompt": "Hello", "max_tokens": 8, "guided_regex": "a{1,3}", "min_tokens": 6}
    (res,) = asyncio.run(_send(app, [("/v1/completions", body)], 1))
    choice = res.json()["choices"][0]
    assert re.fullmatch("a{1,3}", choice["text"]) and choice["finish_reason"] == "stop"
    assert _plain(app) == fresh
