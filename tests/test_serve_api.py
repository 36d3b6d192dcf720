"""One real ``torchtrt-dist serve --tp 2`` (gloo) on 127.0.0.1, driven by the official ``openai``
client and by httpx: exact tokens under concurrency, streaming, chat templates, every error
status, metrics, a client that goes away, and a SIGTERM drain that finishes what runs."""

from __future__ import annotations

import concurrent.futures as cf
import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from torch_tensorrt_dist.generation import Generator
from torch_tensorrt_dist.models.tokenizer import load_tokenizer
from torch_tensorrt_dist.parallel.llama_load import load_llama
from torch_tensorrt_dist.serving.http import event_loop

from ._core_fns import one_thread
from ._serve import Server, demo_tp2_server, demo_with_chat_template

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

KEY = "test-key"
CACHE = 256  # the demo model's positions: the longest hold in the queue test
PROMPTS = [
    "The return statement",
    "A class definition defines a class object",
    "The for statement is used",
    "Python",
    "Exceptions",
    "When an exception is raised, the interpreter looks for a handler in the try statements",
    "The import statement",
    "A module is",
]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_with_chat_template(tmp_path_factory.mktemp("serve") / "demo-chat")


@pytest.fixture(scope="module")
def server(ckpt: Path) -> Any:
    srv = demo_tp2_server(ckpt, rows=4, max_seq_len=CACHE, max_queue=8, key=KEY)
    yield srv
    srv.kill()  # only if a test failed before the drain test


@pytest.fixture(scope="module")
def client(server: Server) -> Any:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def alone(ckpt: Path) -> Any:
    """Text of a prompt's greedy tokens through ``generate`` alone (TP 1), as the server's."""
    tok = load_tokenizer(ckpt, vocab_size=1024)
    gen = Generator(load_llama(ckpt, progress=False), max_batch_size=1, cache_len=CACHE)

    def run(ids: list[int], max_tokens: int) -> tuple[str, str, int]:
        with one_thread():
            res = gen.generate([ids], max_new_tokens=max_tokens, stop_ids=tok.eos_ids)
        out = res.tokens[0]
        stopped = out[-1] in tok.eos_ids
        text = tok.decode([i for i in out if i not in tok.eos_ids])
        return text, "stop" if stopped else "length", len(out)

    return tok, run


def test_health_models_and_the_ready_line(server: Server, client: Any) -> None:
    health = server.health()
    assert health["status"] == "ready" and len(health["pids"]) == 2
    assert [m.id for m in client.models.list().data] == ["demo"]
    ready = server.output()
    assert re.search(r"serving demo at http://127\.0\.0\.1:\d+/v1 \(tp=2 ep=1", ready)
    # what it ran: the event loop, in a process of its own (Linux: fork)
    assert re.search(rf"HTTP on {event_loop()}, own process, warm-up [\d.]+ s\)", ready)
    assert "curl http://127.0.0.1:" in ready and "Authorization: Bearer $TORCHTRT_API_KEY" in ready


def test_concurrent_greedy_requests_equal_each_prompt_alone(client: Any, alone: Any) -> None:
    """8 requests on 4 rows: they join and leave at different steps, some wait for a row."""
    tok, run = alone
    lengths = [20, 6, 24, 9, 15, 12, 30, 5]

    def ask(i: int) -> Any:
        return client.completions.create(
            model="demo", prompt=PROMPTS[i], max_tokens=lengths[i], temperature=0
        )

    with cf.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(ask, range(8)))
    for i, res in enumerate(results):
        text, finish, n = run(tok.encode(PROMPTS[i]), lengths[i])
        choice = res.choices[0]
        assert (choice.text, choice.finish_reason) == (text, finish), PROMPTS[i]
        assert res.usage.completion_tokens == n
        assert res.usage.prompt_tokens == len(tok.encode(PROMPTS[i]))


def test_streaming_pieces_add_up_and_end_with_done(server: Server, client: Any, alone: Any) -> None:
    tok, run = alone
    stream = client.completions.create(
        model="demo",
        prompt=PROMPTS[2],
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert (text, chunks[-2].choices[0].finish_reason) == run(tok.encode(PROMPTS[2]), 16)[:2]
    assert chunks[-1].usage.completion_tokens == 16 and not chunks[-1].choices
    raw = httpx.post(
        f"{server.url}/v1/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        json={"prompt": "Python", "max_tokens": 3, "stream": True},
        timeout=60,
    )
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert raw.text.rstrip().endswith("data: [DONE]")


def test_stop_strings_and_seeded_sampling(client: Any, alone: Any) -> None:
    tok, run = alone
    full = run(tok.encode(PROMPTS[2]), 24)[0]
    cut = full.index(" exception")  # the text before the first " exception"
    res = client.completions.create(
        model="demo", prompt=PROMPTS[2], max_tokens=24, temperature=0, stop=[" exception", "zzz"]
    )
    assert (res.choices[0].text, res.choices[0].finish_reason) == (full[:cut], "stop")

    def sampled(seed: int) -> str:
        return str(
            client.completions.create(
                model="demo",
                prompt=PROMPTS[0],
                max_tokens=12,
                temperature=1.0,
                top_p=0.9,
                seed=seed,
            )
            .choices[0]
            .text
        )

    assert sampled(3) == sampled(3) != sampled(4)


def test_chat_uses_the_template_as_transformers_renders_it(
    ckpt: Path, client: Any, alone: Any
) -> None:
    transformers = pytest.importorskip("transformers")
    _tok, run = alone
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What does the return statement do?"},
    ]
    hf = transformers.AutoTokenizer.from_pretrained(ckpt)
    ids = hf.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    text, finish, _n = run(list(ids), 20)
    res = client.chat.completions.create(
        model="demo", messages=messages, max_tokens=20, temperature=0
    )
    assert res.choices[0].message.role == "assistant"
    assert (res.choices[0].message.content, res.choices[0].finish_reason) == (text, finish)
    assert res.usage.prompt_tokens == len(ids)
    stream = client.chat.completions.create(
        model="demo", messages=messages, max_tokens=20, temperature=0, stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text


def _post(server: Server, body: Any, *, key: str | None = KEY, path: str = "completions") -> Any:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    kwargs = {"content": body} if isinstance(body, str) else {"json": body}
    return httpx.post(f"{server.url}/v1/{path}", headers=headers, timeout=60, **kwargs)


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"prompt": "x", "n": 5}, 400, r"n=5 asks for 5 sequences .* at most 4 \(--max-batch"),
        ({"prompt": "x", "temperature": -1}, 400, r"temperature must be a finite number in \[0, 2"),
        ({"prompt": "x", "top_p": 0}, 400, r"top_p must be a finite number in \(0, 1\]"),
        ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "at most 4"),
        (
            {"prompt": "x", "max_tokens": 300},
            400,
            r"exceeds the longest request served, 256 tokens",
        ),
        ({"prompt": "x", "logprobs": 21}, 400, r"logprobs must be an integer in \[0, 20\], got 21"),
        ({"prompt": [5000]}, 400, r"outside \[0, 1024\)"),
        ({"prompt": "x", "suffix": "y"}, 400, "suffix is not supported"),
        ("{not json", 400, "not JSON"),
        ({"prompt": "x", "model": "gpt-4"}, 404, "is not served here"),
    ],
)
def test_bad_requests_get_openai_errors(
    server: Server, body: Any, status: int, message: str
) -> None:
    res = _post(server, body)
    assert res.status_code == status
    error = res.json()["error"]
    assert re.search(message, error["message"]) and error["type"]


def test_api_key_and_missing_chat_messages(server: Server) -> None:
    res = _post(server, {"prompt": "x"}, key=None)
    assert res.status_code == 401 and res.json()["error"]["code"] == "invalid_api_key"
    assert _post(server, {"prompt": "x"}, key="wrong").status_code == 401
    assert httpx.get(f"{server.url}/health").status_code == 200  # no key needed
    res = _post(server, {"messages": []}, path="chat/completions")
    assert res.status_code == 400 and "messages must be a non-empty list" in res.text


def _metric(server: Server, name: str) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def _wait_metric(server: Server, name: str, value: float, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while _metric(server, name) != value:
        assert time.monotonic() < deadline, f"{name} stayed at {_metric(server, name)}"
        time.sleep(0.2)


def test_full_queue_is_429_and_clients_that_leave_free_their_rows(server: Server) -> None:
    """4 rows + 8 waiting fill the server; the 13th request gets 429; then every client
    disconnects and the rows come free. The rows fill first, then the queue: requests that
    arrive before the step loop admits any wait in the queue, so 12 at once would overflow it."""
    stop = threading.Event()
    started = threading.Semaphore(0)
    statuses: list[int] = []
    errors: list[Exception] = []

    def hold() -> None:  # a streaming request that reads until told, then goes away
        # greedy, this prompt runs 247 tokens without an end-of-text token: the 4 running rows
        # stay busy (and the 8 others queued) for seconds after the 13th request
        body = {"prompt": PROMPTS[1], "max_tokens": 240, "temperature": 0, "stream": True}
        try:
            with httpx.stream(
                "POST",
                f"{server.url}/v1/completions",
                json=body,
                timeout=120,
                headers={"Authorization": f"Bearer {KEY}"},
            ) as res:
                statuses.append(res.status_code)
                started.release()
                for _ in res.iter_lines():
                    if stop.is_set():
                        return  # closes the connection mid-stream
        except httpx.HTTPError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=hold, daemon=True) for _ in range(12)]
    for t in threads[:4]:
        t.start()
    _wait_metric(server, "torchtrt_running_requests", 4.0)
    for t in threads[4:]:
        t.start()
    for _ in range(12):
        assert started.acquire(timeout=60)
    assert statuses == [200] * 12
    _wait_metric(server, "torchtrt_queue_depth", 8.0)
    res = _post(server, {"prompt": "x", "max_tokens": 2})
    assert res.status_code == 429 and "busy" in res.json()["error"]["message"]
    assert _metric(server, "torchtrt_queue_depth") == 8.0
    assert _metric(server, "torchtrt_running_requests") == 4.0
    stop.set()
    for t in threads:
        t.join(60)
    assert not errors and not any(t.is_alive() for t in threads)
    _wait_metric(server, "torchtrt_running_requests", 0.0)
    _wait_metric(server, "torchtrt_queue_depth", 0.0)
    assert _metric(server, 'torchtrt_requests_total{status="cancelled"}') >= 12
    assert _post(server, {"prompt": "x", "max_tokens": 2}).status_code == 200


def test_a_shared_prefix_is_reported_cached_and_changes_no_token(client: Any) -> None:
    """The same long prompt twice, one after the other: the second takes the first one's full
    blocks from the prefix cache (``cached_tokens``: whole blocks of 16, the prompt's last token
    always computed) and gets the same greedy text."""
    prompt = " ".join(PROMPTS[:6])
    first = client.completions.create(model="demo", prompt=prompt, max_tokens=8, temperature=0)
    second = client.completions.create(model="demo", prompt=prompt, max_tokens=8, temperature=0)
    n = first.usage.prompt_tokens
    assert n > 32
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens == (n - 1) // 16 * 16
    assert second.choices[0].text == first.choices[0].text


def test_metrics(server: Server) -> None:
    # a step has run (the KV gauges are set at the first one) and a request was refused, also
    # when this test runs alone
    assert _post(server, {"prompt": "x", "max_tokens": 1}).status_code == 200
    assert _post(server, {"prompt": "x", "max_tokens": -1}).status_code == 400
    text = httpx.get(f"{server.url}/metrics").text
    for name in (
        "torchtrt_requests_total",
        "torchtrt_prompt_tokens_total",
        "torchtrt_generation_tokens_total",
        "torchtrt_queue_depth",
        "torchtrt_running_requests",
        "torchtrt_waiting_requests",
        'torchtrt_kv_blocks{state="free"}',
        'torchtrt_kv_blocks{state="used"}',
        'torchtrt_kv_blocks{state="cached"}',
        "torchtrt_preemptions_total",
        "torchtrt_prefix_cache_queries_total",
        "torchtrt_prefix_cache_hits_total",
        "torchtrt_prefix_cache_hit_rate",
        "torchtrt_time_to_first_token_seconds_bucket",
        "torchtrt_inter_token_latency_seconds_bucket",
        "torchtrt_step_seconds_sum",
        "torchtrt_control_seconds_sum",
        "torchtrt_control_latency_seconds",
    ):
        assert name in text, name
    assert _metric(server, 'torchtrt_requests_total{status="400"}') >= 1
    assert _metric(server, "torchtrt_control_latency_seconds") > 0  # measured at TP 2


def test_the_step_and_http_threads_cpu_is_reported(server: Server) -> None:
    step, http = (f'torchtrt_thread_cpu_seconds_total{{thread="{t}"}}' for t in ("step", "http"))
    before = _metric(server, step)
    res = _post(server, {"prompt": "The return statement", "max_tokens": 32, "temperature": 0})
    assert res.status_code == 200
    # 32 decode steps of the eager TP 2 graph: well over a clock tick of the step thread
    assert _metric(server, step) > before > 0
    for _ in range(100):  # the HTTP thread's time shows once it reaches a clock tick (10 ms)
        if _metric(server, http) > 0:
            break
        res = httpx.get(f"{server.url}/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        assert res.status_code == 200
    assert _metric(server, http) > 0


def test_sigterm_drains_running_requests_and_exits_0(server: Server) -> None:
    """Last: the server stops. A request running at SIGTERM finishes; new ones get 503."""
    result: dict[str, Any] = {}

    def long() -> None:
        body = {"prompt": PROMPTS[1], "max_tokens": 60, "temperature": 0, "stop": ["zzz"]}
        res = _post(server, body)
        result["status"], result["body"] = res.status_code, res.json()

    t = threading.Thread(target=long)
    t.start()
    _wait_metric(server, "torchtrt_running_requests", 1.0)
    server.proc.send_signal(15)
    deadline = time.monotonic() + 10
    while server.health()["status"] != "draining":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert _post(server, {"prompt": "x", "max_tokens": 2}).status_code == 503
    t.join(60)
    assert result["status"] == 200
    assert result["body"]["choices"][0]["finish_reason"] == "length"  # ran to the end
    assert server.proc.wait(60) == 0
    out = server.output()
    assert re.search(r"rank 1: \d+ decode steps", out) and "control channel" in out
    assert json.dumps(result["body"])  # a complete JSON body
