"""The fields OpenAI and vLLM clients send (issue 29), each through the official ``openai`` client
against one real ``serve --tp 2`` (gloo, 127.0.0.1), checked against a reference: logprobs
against HF transformers' ``log_softmax``, ``repetition_penalty`` against HF ``generate``, the
other logits settings against HF's logits processed by ``logits_process.process``, structured
output against its schema (``jsonschema``), ``n`` / ``best_of`` / prompt lists / ``echo``
against single requests; requests with penalties or a grammar batched with plain ones give
what they give alone; fields the server cannot take are 400s naming them."""

from __future__ import annotations

import concurrent.futures as cf
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from ._core_fns import one_thread
from ._fields_reference import EOS, Reference, check_top
from ._serve import Server, demo_tp2_server, demo_with_chat_template

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

ROWS = 4
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "kind": {"enum": ["cat", "dog"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 2},
    },
    "required": ["name", "age", "kind", "tags"],
    "additionalProperties": False,
}
CHAT = [{"role": "user", "content": "Describe a pet as JSON."}]


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """The references in this process on one torch thread, as each launched rank runs: on a
    busy 2-core machine two threads spin-wait (up to 20x slower); the same values."""
    with one_thread():
        yield


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_with_chat_template(tmp_path_factory.mktemp("fields") / "demo-chat")


@pytest.fixture(scope="module")
def server(ckpt: Path) -> Any:
    srv = demo_tp2_server(ckpt, rows=ROWS, max_seq_len=256)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server: Server) -> Any:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def ref(ckpt: Path) -> Reference:
    return Reference(ckpt)


# ---------------------------------------------------------------------------- logprobs


def test_completion_logprobs_equal_hf_log_softmax(client: Any, ref: Reference) -> None:
    prompt = ref.tok.encode("The return statement")
    res = client.completions.create(
        model="demo", prompt=prompt, max_tokens=12, temperature=1.0, seed=4, logprobs=3
    )
    lps = res.choices[0].logprobs
    ids = [ref.ids[t] for t in lps.tokens]  # the sampled ids (each text one id's)
    assert "".join(lps.tokens) == res.choices[0].text and len(ids) == 12
    lp = ref.log_softmax(prompt + ids)[len(prompt) - 1 : -1]  # the logits each id came from
    for i, token in enumerate(ids):
        assert lps.token_logprobs[i] == pytest.approx(lp[i, token].item(), abs=1e-4)
        assert len(lps.top_logprobs[i]) in (3, 4)  # the 3 most likely, and the sampled one
        check_top(lp[i], lps.top_logprobs[i], ref, 3)
    offsets = [0] + [sum(len(t) for t in lps.tokens[: i + 1]) for i in range(11)]
    assert lps.text_offset == offsets


def test_chat_logprobs_equal_hf_log_softmax(client: Any, ref: Reference) -> None:
    prompt = ref.chat_tok.apply_chat_template(
        CHAT, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    res = client.chat.completions.create(
        model="demo",
        messages=CHAT,
        max_tokens=10,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = res.choices[0].logprobs.content
    ids = [ref.ids[c.token] for c in content]
    lp = ref.log_softmax(list(prompt) + ids)[len(prompt) - 1 : -1]
    for i, c in enumerate(content):
        assert c.logprob == pytest.approx(lp[i, ids[i]].item(), abs=1e-4)
        assert c.bytes == list(c.token.encode())
        assert [t.logprob for t in c.top_logprobs] == pytest.approx(lp[i].topk(2).values, abs=1e-4)
    assert res.choices[0].message.content == "".join(c.token for c in content)


# ------------------------------------------------------------ penalties, bias, stops


def test_repetition_penalty_gives_hf_generates_tokens(client: Any, ref: Reference) -> None:
    text = "The break statement"  # greedy, it repeats itself without the penalty
    prompt = ref.tok.encode(text)
    out = ref.hf.generate(
        torch.tensor([prompt]),
        max_new_tokens=24,
        do_sample=False,
        repetition_penalty=1.3,
        eos_token_id=EOS[0],
        pad_token_id=EOS[0],
    )[0, len(prompt) :].tolist()
    want = ref.tok.decode([i for i in out if i not in EOS])
    res = client.completions.create(
        model="demo",
        prompt=text,
        max_tokens=24,
        temperature=0,
        extra_body={"repetition_penalty": 1.3},
    )
    assert res.choices[0].text == want
    plain = client.completions.create(model="demo", prompt=text, max_tokens=24, temperature=0)
    assert plain.choices[0].text != want  # the penalty changed something


@pytest.mark.parametrize(
    ("text", "fields"),
    [
        ("The break statement", {"presence_penalty": 1.5, "frequency_penalty": 0.8}),
        ("The return statement", {"logit_bias": {"3": 3.0, "581": -100}}),  # '"', ' clause'
        ("The import statement", {"min_tokens": 9}),  # it ends after 4 tokens unless held
        ("The import statement", {"ignore_eos": True}),
        ("The return statement", {"stop_token_ids": [698]}),  # the greedy text's 'except'
    ],
)
def test_logits_settings_follow_the_reference(
    client: Any, ref: Reference, text: str, fields: dict[str, Any]
) -> None:
    want = ref.greedy(ref.tok.encode(text), 20, **fields)
    res = client.completions.create(
        model="demo", prompt=text, max_tokens=20, temperature=0, extra_body=fields
    )
    assert (res.choices[0].text, res.choices[0].finish_reason) == want
    plain = client.completions.create(model="demo", prompt=text, max_tokens=20, temperature=0)
    assert plain.choices[0].text != want[0]


# ------------------------------------------------------------------ structured output


def test_structured_output_parses_and_validates(client: Any) -> None:
    schema = {"type": "json_schema", "json_schema": {"name": "pet", "schema": PERSON}}
    for seed in range(3):
        res = client.chat.completions.create(
            model="demo",
            messages=CHAT,
            max_tokens=210,  # the demo model writes much whitespace (16 at most at a time)
            temperature=1.0,
            seed=seed,
            response_format=schema,
        )
        content = res.choices[0].message.content
        assert res.choices[0].finish_reason == "stop", content  # the grammar ended it
        jsonschema.validate(json.loads(res.choices[0].message.content), PERSON)
    res = client.chat.completions.create(
        model="demo", messages=CHAT, max_tokens=210, seed=7, response_format={"type": "json_object"}
    )
    assert isinstance(json.loads(res.choices[0].message.content), dict)
    stream = client.completions.create(
        model="demo",
        prompt="A pet:",
        max_tokens=210,
        seed=3,
        stream=True,
        extra_body={"guided_json": PERSON},
    )
    jsonschema.validate(json.loads("".join(c.choices[0].text for c in stream)), PERSON)
    regex = "[0-9]{2}-[a-z]{3}"
    for body, check in (
        ({"guided_regex": regex}, lambda t: re.fullmatch(regex, t)),
        ({"guided_choice": ["yes", "no", "maybe"]}, lambda t: t in ("yes", "no", "maybe")),
    ):
        res = client.completions.create(
            model="demo", prompt="Python", max_tokens=30, seed=1, extra_body=body
        )
        assert check(res.choices[0].text) and res.choices[0].finish_reason == "stop"


# ------------------------------------------------------- n, best_of, prompt lists, echo


def _texts(res: Any) -> list[str]:
    assert [c.index for c in res.choices] == list(range(len(res.choices)))
    return [c.text for c in res.choices]


def test_n_choices_are_seeded_and_reproducible(client: Any) -> None:
    def ask(**kw: Any) -> Any:
        return client.completions.create(
            model="demo", prompt="Python", max_tokens=10, temperature=1.0, **kw
        )

    two = _texts(ask(n=2, seed=5))
    assert two == _texts(ask(n=2, seed=5)) and two[0] != two[1]
    assert two == [_texts(ask(seed=5 + j))[0] for j in range(2)]  # vLLM: choice j, seed + j
    stream = ask(n=2, seed=5, stream=True)
    by_index = ["", ""]
    for chunk in stream:
        by_index[chunk.choices[0].index] += chunk.choices[0].text
    assert by_index == two


def test_streams_carry_each_choices_index_and_logprobs(client: Any) -> None:
    """A stream's pieces, gathered by ``index``, are the choices and logprobs of the same
    request not streamed (chat, n=2; completions: ``text_offset`` continues across pieces)."""
    chat = {
        "model": "demo",
        "messages": CHAT,
        "max_tokens": 8,
        "temperature": 1.0,
        "seed": 11,
        "n": 2,
        "logprobs": True,
        "top_logprobs": 1,
    }
    whole = client.chat.completions.create(**chat)
    texts: list[str] = ["", ""]
    values: list[list[float]] = [[], []]
    for chunk in client.chat.completions.create(**chat, stream=True):
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.logprobs is not None:
                values[c.index] += [t.logprob for t in c.logprobs.content]
    assert texts == [c.message.content for c in whole.choices] and texts[0] != texts[1]
    for got, c in zip(values, whole.choices):
        assert got == pytest.approx([t.logprob for t in c.logprobs.content], abs=1e-5)
    plain = {"model": "demo", "prompt": "Lists", "max_tokens": 8, "temperature": 0, "logprobs": 2}
    want = client.completions.create(**plain).choices[0].logprobs
    tokens: list[str] = []
    offsets: list[int] = []
    for chunk in client.completions.create(**plain, stream=True):
        lp = chunk.choices[0].logprobs if chunk.choices else None
        if lp is not None:
            tokens += lp.tokens
            offsets += lp.text_offset
    assert (tokens, offsets) == (want.tokens, want.text_offset)


def test_best_of_returns_the_highest_cumulative_logprob(client: Any) -> None:
    def ask(**kw: Any) -> Any:
        return client.completions.create(
            model="demo", prompt="Exceptions", max_tokens=8, temperature=1.0, **kw
        )

    best = ask(n=1, best_of=3, seed=9)
    alone = [ask(seed=9 + j, logprobs=0) for j in range(3)]
    sums = [math.fsum(a.choices[0].logprobs.token_logprobs) for a in alone]
    assert best.choices[0].text == alone[sums.index(max(sums))].choices[0].text
    assert len(set(sums)) == 3 and best.choices[0].logprobs is None  # none were asked for
    # every candidate was generated
    assert best.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)


def test_prompt_lists_and_echo(client: Any, ref: Reference) -> None:
    prompts = ["The return statement", "Lists"]
    res = client.completions.create(model="demo", prompt=prompts, max_tokens=8, temperature=0, n=2)
    alone = [
        client.completions.create(model="demo", prompt=p, max_tokens=8, temperature=0)
        for p in prompts
    ]
    want = [a.choices[0].text for a in alone for _ in range(2)]  # prompt-major
    assert _texts(res) == want
    assert res.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    echo = client.completions.create(
        model="demo",
        prompt=[prompts[0], ref.tok.encode("Lists")],
        max_tokens=8,
        temperature=0,
        echo=True,
    )
    assert _texts(echo) == [prompts[0] + want[0], ref.tok.decode(ref.tok.encode("Lists")) + want[2]]
    stream = client.completions.create(
        model="demo", prompt=prompts[1], max_tokens=8, temperature=0, echo=True, stream=True
    )
    chunks = [c.choices[0].text for c in stream]
    assert chunks[0] == prompts[1] and "".join(chunks) == prompts[1] + want[2]


# --------------------------------------------------------------------- under concurrency


def test_processed_requests_batched_with_plain_ones_give_their_alone_text(client: Any) -> None:
    schema = {"type": "json_schema", "json_schema": {"name": "pet", "schema": PERSON}}
    asks: list[tuple[str, dict[str, Any]]] = [
        (
            "completions",
            {
                "prompt": "The break statement",
                "max_tokens": 16,
                "temperature": 0,
                "extra_body": {"repetition_penalty": 1.2, "presence_penalty": 0.5},
            },
        ),
        (
            "chat",
            {
                "messages": CHAT,
                "max_tokens": 200,  # the schema's JSON may take spaces between its tokens
                "temperature": 1.0,
                "seed": 2,
                "response_format": schema,
            },
        ),
        (
            "completions",
            {
                "prompt": "Python",
                "max_tokens": 14,
                "temperature": 0.9,
                "seed": 4,
                "extra_body": {"logit_bias": {"3": 2.0}, "min_tokens": 6},
            },
        ),
        ("completions", {"prompt": "Exceptions", "max_tokens": 18, "temperature": 0}),
        (
            "completions",
            {"prompt": "Lists", "max_tokens": 12, "temperature": 0.8, "seed": 1, "logprobs": 2},
        ),
        (
            "completions",
            {
                "prompt": "The for statement",
                "max_tokens": 10,
                "temperature": 1.0,
                "seed": 8,
                "n": 2,
            },
        ),
    ]

    def ask(i: int) -> list[str]:
        kind, kw = asks[i]
        if kind == "chat":
            res = client.chat.completions.create(model="demo", **kw)
            return [c.message.content for c in res.choices]
        return _texts(client.completions.create(model="demo", **kw))

    alone = [ask(i) for i in range(len(asks))]
    with cf.ThreadPoolExecutor(len(asks)) as pool:
        together = list(pool.map(ask, range(len(asks))))
    assert together == alone
    jsonschema.validate(json.loads(alone[1][0]), PERSON)


# -------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("path", "body", "param", "message"),
    [
        (
            "chat/completions",
            {
                "messages": CHAT,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "x",
                        "schema": {"type": "object", "properties": {"a": {"type": "strin"}}},
                    },
                },
            },
            "response_format",
            r"response_format: the JSON schema cannot be compiled: .*strin",
        ),
        ("completions", {"prompt": "x", "guided_regex": "(a"}, "guided_regex", "regex cannot be"),
        ("completions", {"prompt": "x", "n": 5}, "n", r"n=5 .* at most 4 \(--max-batch-size 4\)"),
        ("completions", {"prompt": "x", "best_of": 9}, "best_of", r"best_of=9 .* at most 4"),
        ("completions", {"prompt": "x", "logprobs": 21}, "logprobs", r"in \[0, 20\], got 21"),
        (
            "chat/completions",
            {"messages": CHAT, "logprobs": True, "top_logprobs": 21},
            "top_logprobs",
            r"top_logprobs must be an integer in \[0, 20\], got 21",
        ),
        ("completions", {"prompt": "x", "logit_bias": {"5000": 1}}, "logit_bias", "outside the"),
        ("completions", {"prompt": "x", "max_tokens": 4, "min_tokens": 5}, "min_tokens", "exceeds"),
        # issue 55: what the sampler would see (each used to blame temperature, or answer "")
        (
            "completions",
            {"prompt": "x", "repetition_penalty": 1e-300},
            "repetition_penalty",
            r"in \[0.01, 100\], got 1e-300",
        ),
        (
            "completions",
            {"prompt": "x", "min_tokens": 2, "stop_token_ids": list(range(1024))},
            "min_tokens",
            "holds back every token",
        ),
        ("completions", {"prompt": "x", "guided_regex": r"[^\s\S]"}, "guided_regex", "no text"),
        ("chat/completions", {"messages": CHAT, "guided_json": {"$ref": "#"}}, "guided_json", "no"),
        (
            "completions",
            {
                "prompt": "x",
                "guided_json": {"type": "object", "properties": {f"p{i}": {} for i in range(600)}},
            },
            "guided_json",
            "max is 2000",
        ),
    ],
)
def test_fields_the_server_cannot_take_are_400s_naming_them(
    server: Server, path: str, body: dict[str, Any], param: str, message: str
) -> None:
    res = httpx.post(f"{server.url}/v1/{path}", json=body, timeout=60)
    assert res.status_code == 400, res.text
    error = res.json()["error"]
    assert error["param"] == param and re.search(message, error["message"]), error
