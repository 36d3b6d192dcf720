"""A tool-call stream reads each character once (``scan.Reader``) and gives, over any split
of a text into pieces, what the whole text's parse gives (random texts of every format, whole,
cut short, and with characters that break them)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from torch_tensorrt_dist.serving.tools import FORMATS
from torch_tensorrt_dist.serving.tools import scan as S
from torch_tensorrt_dist.serving.tools.forced import REQUIRED
from torch_tensorrt_dist.serving.tools.mistral import Normalizer, normalize

from .test_tool_parsers import _streamed

_NOISE = ['"', "\\", "{", "}", "[", "]", ",", ":", " ", "\n", "[TOOL_CALLS]", "[ARGS]", "x", "é"]


def _value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(6 if depth < 2 else 4)
    if kind == 0:
        return rng.randint(-1000, 1000)
    if kind == 1:
        return rng.choice([True, False, None, 2.5])
    if kind in (2, 3):  # strings with what a scanner must step over
        return "".join(rng.choice(["a", " ", '"', "\\", "}", "]", "{", "é", "[TOOL_", "\n"])
                       for _ in range(rng.randrange(6)))  # fmt: skip
    if kind == 4:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(3))]
    return {f"k{i}": _value(rng, depth + 1) for i in range(rng.randrange(3))}


def _calls(rng: random.Random) -> list[tuple[str, dict[str, Any]]]:
    return [
        (rng.choice(["get_weather", "f", "now"]), _value(rng, 1) if rng.random() < 0.2 else
         {f"a{i}": _value(rng, 1) for i in range(rng.randrange(3))})
        for _ in range(rng.randint(1, 3))
    ]  # fmt: skip


def _text(fmt: str, rng: random.Random) -> str:
    calls, sep = _calls(rng), rng.choice(["", " ", "\n"])
    if fmt == "hermes":
        head = rng.choice(["", "Let me check.\n"])
        return head + "".join(
            f"<tool_call>{sep}{json.dumps({'name': n, 'arguments': a})}{sep}</tool_call>\n"
            for n, a in calls
        )
    if fmt == "llama3_json":
        tag = rng.choice(["", " ", "<|python_tag|>"])
        return tag + "; ".join(json.dumps({"name": n, "parameters": a}) for n, a in calls)
    if fmt == "mistral":
        return "[TOOL_CALLS]" + sep + json.dumps([{"name": n, "arguments": a} for n, a in calls])
    if fmt == "mistral_v11":
        return "".join(f"[TOOL_CALLS]{sep}{n}[ARGS]{sep}{json.dumps(a)}" for n, a in calls)
    return json.dumps([{"name": n, "parameters": a} for n, a in calls])  # required


def _variant(text: str, rng: random.Random) -> str:
    """The text whole, cut short, or with a few characters put in anywhere."""
    k = rng.randrange(3)
    if k == 0:
        return text
    if k == 1:
        return text[: rng.randrange(len(text) + 1)]
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(text) + 1)
        text = text[:at] + rng.choice(_NOISE) + text[at:]
    return text


def _split(text: str, rng: random.Random) -> list[str]:
    out, i = [], 0
    while i < len(text):
        n = rng.choice([1, 1, 2, 3, 5, 8, 40])
        out.append(text[i : i + n])
        i += n
    return out


FMTS = {"mistral_v11": FORMATS["mistral"], "required": REQUIRED, **FORMATS}


@pytest.mark.parametrize("name", sorted(FMTS))
def test_any_split_streams_what_one_character_at_a_time_and_the_whole_parse_give(
    name: str,
) -> None:
    fmt, rng = FMTS[name], random.Random(name)
    parsed_calls = 0
    for _ in range(150):
        text = _variant(_text(name, rng), rng)
        one = _strip_ids(_streamed(fmt, list(text)))  # a character at a time
        assert _strip_ids(_streamed(fmt, [text])) == one, text
        for _ in range(3):
            assert _strip_ids(_streamed(fmt, _split(text, rng))) == one, text
        whole = fmt.parse(text)
        if whole.calls:
            parsed_calls += 1
            content, calls = one
            # a last call cut short is left out of the parse; a stream had sent what it had
            n = len(whole.calls)
            assert calls[:n] == [(c.name, c.arguments) for c in whole.calls], text
            assert len(calls) <= n + 1
            assert content == (whole.content or "") or (
                not content.strip() and whole.content is None
            )
    assert parsed_calls > 40  # most texts hold calls that parse


def _strip_ids(got: tuple[str, list[dict[str, Any]]]) -> tuple[str, list[tuple[str, str]]]:
    content, calls = got
    return content, [(c["name"], c["arguments"]) for c in calls]


def test_the_mistral_normalizer_streams_what_normalize_gives_the_whole_text() -> None:
    rng = random.Random(7)
    for _ in range(300):
        region = _variant(_text("mistral_v11", rng), rng).removeprefix("[TOOL_CALLS]")
        whole = normalize(region)
        for _ in range(2):
            norm = Normalizer()
            assert "".join(norm.feed(p) for p in _split(region, rng)) + norm.flush() == whole


def test_each_character_is_read_once_however_many_pieces() -> None:
    """2,000 pieces of one call's arguments: the reader steps over each character once (the
    scan before read the whole calls' text again at every piece)."""
    steps = 0
    step = S.Member.step

    def counted(self: S.Member, text: str, j: int) -> None:
        nonlocal steps
        steps += 1
        step(self, text, j)

    args = json.dumps({"q": "word " * 2000})
    text = '<tool_call>{"name": "f", "arguments": ' + args + "}</tool_call>"
    pieces = [text[i : i + 5] for i in range(0, len(text), 5)]
    assert len(pieces) > 2000
    S.Member.step = counted  # type: ignore[method-assign]
    try:
        _, calls = _streamed(FORMATS["hermes"], pieces)
    finally:
        S.Member.step = step  # type: ignore[method-assign]
    assert calls[0]["arguments"] == args
    assert steps <= len(text)
