"""``torchtrt-dist serve --pp 2`` at tp 1 (2 gloo ranks, compiled by the eager engine) and tp 2
(4 ranks): concurrent greedy requests through the official ``openai`` client get exactly the
tokens each prompt gets alone at TP 1, streaming included; the server drains and exits 0."""

from __future__ import annotations

import concurrent.futures as cf
import re
from collections.abc import Iterator
from typing import Any

import pytest

from torch_tensorrt_dist.generation import Generator
from torch_tensorrt_dist.models.demo import demo_checkpoint_path
from torch_tensorrt_dist.models.tokenizer import load_tokenizer
from torch_tensorrt_dist.parallel.llama_load import load_llama

from ._core_fns import one_thread
from ._serve import Server, start_server

openai = pytest.importorskip("openai")

CACHE = 128
PROMPTS = [
    "The return statement",
    "A class definition defines a class object",
    "Python",
    "When an exception is raised, the interpreter looks for a handler in the try statements",
    "The import statement",
    "A module is",
]
LENGTHS = [18, 6, 24, 9, 15, 12]
LAYOUTS = {
    "pp2_tp1": ["--pp", "2", "--tp", "1", "--engine", "eager"],
    "pp2_tp2": ["--pp", "2", "--tp", "2", "--engine", "none", "--split", "1,3"],
}


@pytest.fixture(scope="module")
def alone() -> Any:
    """A prompt's greedy text alone through ``generate`` at TP 1, and its finish."""
    path = demo_checkpoint_path()
    tok = load_tokenizer(path, vocab_size=1024)
    gen = Generator(load_llama(path, progress=False), max_batch_size=1, cache_len=CACHE)

    def run(prompt: str, max_tokens: int) -> tuple[str, str]:
        with one_thread():
            out = gen.generate(
                [tok.encode(prompt)], max_new_tokens=max_tokens, stop_ids=tok.eos_ids
            )
        ids = out.tokens[0]
        stopped = ids[-1] in tok.eos_ids
        return tok.decode([i for i in ids if i not in tok.eos_ids]), "stop" if stopped else "length"

    return run


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, Server]]:
    args = [*LAYOUTS[request.param], "--max-batch-size", "4", "--max-seq-len", str(CACHE)]
    srv = start_server([*args, "--served-model-name", "demo", "--block-size", "4"])
    yield request.param, srv
    srv.kill()  # only if a test failed before the drain test


def _client(srv: Server) -> Any:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=120)


def test_ready_line_and_every_rank(server: tuple[str, Server]) -> None:
    name, srv = server
    tp = 1 if name == "pp2_tp1" else 2
    assert re.search(
        rf"serving demo at http://127\.0\.0\.1:\d+/v1 \(pp=2 tp={tp} ep=1", srv.output()
    )
    assert len(srv.health()["pids"]) == 2 * tp


def test_concurrent_greedy_requests_equal_each_prompt_alone(
    server: tuple[str, Server], alone: Any
) -> None:
    """6 requests on 4 rows: they join and leave at different steps, some wait for a row."""
    client = _client(server[1])

    def ask(i: int) -> Any:
        return client.completions.create(
            model="demo", prompt=PROMPTS[i], max_tokens=LENGTHS[i], temperature=0
        )

    with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
        results = list(pool.map(ask, range(len(PROMPTS))))
    for i, res in enumerate(results):
        choice = res.choices[0]
        assert (choice.text, choice.finish_reason) == alone(PROMPTS[i], LENGTHS[i]), PROMPTS[i]


def test_streamed_pieces_equal_the_prompt_alone(server: tuple[str, Server], alone: Any) -> None:
    stream = _client(server[1]).completions.create(
        model="demo", prompt=PROMPTS[0], max_tokens=16, temperature=0, stream=True
    )
    text = "".join(c.choices[0].text for c in stream if c.choices)
    assert text == alone(PROMPTS[0], 16)[0]


def test_sigterm_drains_and_exits_0(server: tuple[str, Server]) -> None:
    assert server[1].stop() == 0
