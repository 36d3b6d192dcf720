"""Structured output (llguidance): random sampling under a grammar's mask always gives text that
parses and validates, on every kind of tokenizer the server reads; grammar errors carry the
engine's reason; the batched bitmask equals each matcher's own mask."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests._tokenizers import bytelevel_bpe, sentencepiece
from torch_tensorrt_dist.errors import ConfigError, EngineUnavailableError
from torch_tensorrt_dist.generation.grammar import (
    GrammarError,
    Grammars,
    GrammarSpec,
    Matcher,
    apply_bitmask_,
    new_bitmask,
    unpack_bitmask,
)
from torch_tensorrt_dist.models.demo import demo_checkpoint_path
from torch_tensorrt_dist.models.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer

pytest.importorskip("llguidance", reason="structured output needs llguidance (the serve extra)")
jsonschema = pytest.importorskip("jsonschema", reason="the schema check needs jsonschema (dev)")

TEXTS = [
    '{"name": "Ada", "age": 36, "tags": ["math", "engines"], "ok": true}',
    "the quick brown fox jumps over the lazy dog, 1234-56-78 and café ünïcode",
    "def f(x):\n    return [x, {'a': 1.5e3, 'b': None}]\n",
]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "kind": {"enum": ["cat", "dog", "bird"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "kind", "tags", "ok"],
    "additionalProperties": False,
}
NESTED = {
    "type": "object",
    "properties": {
        "a": {"type": "number", "minimum": -1.5, "maximum": 2},
        "b": {"anyOf": [{"type": "null"}, {"type": "string", "pattern": "^[a-z]{1,4}$"}]},
        "c": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"x": {"type": "integer"}},
                "required": ["x"],
            },
            "minItems": 1,
            "maxItems": 2,
        },
    },
    "required": ["a", "b", "c"],
}
CHOICES = ("a.b (c)?", "x|y", "naïve\nline", "[^$]", "a")  # "a": a prefix of another


class Vocab:
    """A tokenizer under test: its grammar engine, decoder, vocabulary and end-of-text id."""

    def __init__(
        self, grammars: Grammars, tok: Tokenizer, vocab: int, eos: int, path: Path | None = None
    ) -> None:
        self.grammars, self.tok, self.vocab, self.eos, self.path = grammars, tok, vocab, eos, path
        #: +3 on tokens that hold a closing character: random walks end in a few hundred steps
        closing = [i for i in range(vocab) if any(c in tok.decode([i]) for c in '"}]') and i != eos]
        self.bias = torch.zeros(vocab)
        self.bias[closing] = 3.0
        self.bias[eos] = 2.0


@pytest.fixture(scope="module")
def vocabs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Vocab]:
    tmp = tmp_path_factory.mktemp("tok")
    demo = demo_checkpoint_path() / "tokenizer.json"
    bl = bytelevel_bpe(TEXTS * 3, tmp / "bl.json", vocab_size=400)
    sp = sentencepiece(TEXTS * 3, tmp / "sp.json", vocab_size=150)
    out = {}
    for name, path, eos_piece, pad in (
        ("demo", demo, "</s>", 0),
        ("bytelevel", bl, "<|endoftext|>", 13),  # a model vocabulary padded past the tokenizer's
        ("sentencepiece", sp, "</s>", 0),
    ):
        hf = HFTokenizer(path)
        eos = hf._tok.token_to_id(eos_piece)
        vocab = hf._tok.get_vocab_size() + pad
        tok = HFTokenizer(path, (eos,))
        grammars = Grammars.from_file(path, vocab_size=vocab, eos_ids=(eos,))
        out[name] = Vocab(grammars, tok, vocab, eos, path)
    out["bytes"] = Vocab(
        Grammars.for_bytes(vocab_size=300, eos_ids=(299,)), ByteTokenizer(300, (299,)), 300, 299
    )
    return out


def _walk(v: Vocab, matcher: Matcher, seed: int, steps: int = 400) -> tuple[str, list[int]]:
    """Sample under the mask from random logits until the grammar is complete."""
    gen = torch.Generator().manual_seed(seed)
    bitmask = new_bitmask(1, v.vocab)
    out: list[int] = []
    for _ in range(steps):
        v.grammars.fill_bitmask([(matcher, 0)], bitmask)
        x = (torch.randn(v.vocab, generator=gen) + v.bias)[None]
        apply_bitmask_(x, bitmask, [0])
        token = int(torch.multinomial(x.softmax(-1), 1, generator=gen))
        matcher.accept(token)  # raises if the mask let through a token the grammar refuses
        if token == v.eos or matcher.is_finished:
            return v.tok.decode(out if token == v.eos else [*out, token]), out
        out.append(token)
    raise AssertionError(f"the grammar was not complete after {steps} steps")


CASES: list[tuple[str, GrammarSpec, Callable[[str], Any]]] = [
    ("json_object", GrammarSpec.json_object(), lambda t: isinstance(json.loads(t), dict)),
    (
        "person",
        GrammarSpec.json_schema(PERSON),
        lambda t: jsonschema.validate(json.loads(t), PERSON) is None,
    ),
    (
        "nested",
        GrammarSpec.json_schema(json.dumps(NESTED)),
        lambda t: jsonschema.validate(json.loads(t), NESTED) is None,
    ),
    (
        "regex",
        GrammarSpec.regex("[0-9]{4}-[0-9]{2}(-[a-z]+)?"),
        lambda t: re.fullmatch("[0-9]{4}-[0-9]{2}(-[a-z]+)?", t),
    ),
    ("choice", GrammarSpec.choice(CHOICES), lambda t: t in CHOICES),
]


@pytest.mark.parametrize("vocab", ["demo", "bytelevel", "sentencepiece", "bytes"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_sampling_under_the_mask_always_matches(
    vocabs: dict[str, Vocab], vocab: str, case: tuple[str, GrammarSpec, Callable[[str], Any]]
) -> None:
    v = vocabs[vocab]
    _, spec, check = case
    start = v.grammars.compile(spec)
    for seed in range(4):
        text, _ = _walk(v, start.fork(), seed)
        assert check(text), (seed, text)


def test_the_schema_is_enforced_not_just_json(vocabs: dict[str, Vocab]) -> None:
    v = vocabs["demo"]
    matcher = v.grammars.compile(GrammarSpec.json_schema(PERSON))
    ids = v.tok.encode('{"name": "Ada", "age": 151', add_special_tokens=False)
    for t in ids[:-1]:
        matcher.accept(t)
    with pytest.raises(GrammarError, match=rf"the JSON schema refused token {ids[-1]}"):
        matcher.accept(ids[-1])  # 151 > maximum 150
    free = v.grammars.compile(GrammarSpec.json_object())
    for t in ids:
        free.accept(t)  # any object may hold it
    assert not free.is_finished and free.error is None


def test_grammar_errors_carry_the_engines_reason(vocabs: dict[str, Vocab]) -> None:
    g = vocabs["demo"].grammars
    cases = [
        (GrammarSpec.json_schema({"type": "foo"}), "the JSON schema cannot be compiled", "foo"),
        (
            GrammarSpec.json_schema({"$ref": "#/defs/x"}),
            "the JSON schema cannot be compiled",
            "/defs/x",
        ),
        (GrammarSpec.json_schema("{not json"), "the JSON schema cannot be compiled", "key must be"),
        (GrammarSpec.json_schema("[1]"), "the JSON schema cannot be compiled", ""),
        (GrammarSpec.regex("(ab"), "the regex cannot be compiled", "unclosed group"),
        (GrammarSpec.regex(r"(a)\1"), "the regex cannot be compiled", "backreferences"),
    ]
    for spec, message, reason in cases:
        with pytest.raises(GrammarError, match=re.escape(message)) as info:
            g.compile(spec)
        assert reason in info.value.reason and isinstance(info.value, ConfigError)
    with pytest.raises(GrammarError, match="the JSON schema is not JSON"):
        GrammarSpec.json_schema({"x": float("nan")})
    with pytest.raises(ConfigError, match="grammar kind must be one of json_object, json_schema"):
        GrammarSpec("lark", "start: x")
    for bad in ([], "yes"):  # a string is not a list of one-letter choices
        with pytest.raises(ConfigError, match="guided_choice must be a non-empty list of strings"):
            GrammarSpec.choice(bad)
    with pytest.raises(ConfigError, match="guided_choice must hold strings only, got 3"):
        GrammarSpec("choice", ("a", 3))  # type: ignore[arg-type]


def test_spec_round_trips_through_json() -> None:
    for spec in (
        GrammarSpec.json_object(),
        GrammarSpec.json_schema(PERSON),
        GrammarSpec.regex("[0-9]+"),
        GrammarSpec.choice(CHOICES),
    ):
        assert GrammarSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec


def test_batched_masks_equal_each_matchers_own_and_are_the_same_every_time(
    vocabs: dict[str, Vocab],
) -> None:
    v = vocabs["sentencepiece"]
    specs = [
        GrammarSpec.json_schema(PERSON),
        GrammarSpec.regex("[0-9]{3}"),
        GrammarSpec.json_object(),
    ]
    matchers = [v.grammars.compile(s) for s in specs]
    _, ids = _walk(v, matchers[0].fork(), seed=1)
    for t in ids[:5]:
        matchers[0].accept(t)
    matchers[1].accept(v.tok.encode("7", add_special_tokens=False)[-1])
    rows = [(matchers[0], 3), (matchers[1], 0), (matchers[2], 1)]
    bitmask = new_bitmask(4, v.vocab)
    v.grammars.fill_bitmask(rows, bitmask)
    allowed = unpack_bitmask(bitmask, v.vocab)
    for m, i in rows:
        assert torch.equal(allowed[i], m.allowed()), i
    assert allowed[2].all()  # a row without a grammar stays all-allowed
    # another rank: its own engine from the same tokenizer file, the same specs and tokens,
    # its masks computed row by row on this thread (as a CPU step does): the same bits
    assert v.path is not None
    rank1 = Grammars.from_file(v.path, vocab_size=v.vocab, eos_ids=(v.eos,))
    other = [rank1.compile(s) for s in specs]
    for t in ids[:5]:
        other[0].accept(t)
    other[1].accept(v.tok.encode("7", add_special_tokens=False)[-1])
    again = new_bitmask(4, v.vocab)
    rank1.fill_bitmask([(other[0], 3), (other[1], 0), (other[2], 1)], again, parallel=False)
    assert torch.equal(again, bitmask)
    x = torch.randn(4, v.vocab)
    y = x.clone()
    apply_bitmask_(y, bitmask, [3, 0])
    assert torch.equal(y[[1, 2]], x[[1, 2]])  # only the listed rows change
    assert torch.equal(torch.isfinite(y[3]), allowed[3]) and torch.equal(
        y[3][allowed[3]], x[3][allowed[3]]
    )
    # every row at once (one add): row 2, without a grammar (all ones), stays as it was
    z = x.clone()
    apply_bitmask_(z, bitmask)
    assert torch.equal(z, apply_rows(x, bitmask, [0, 1, 2, 3]))
    assert torch.equal(z[2], x[2]) and torch.equal(z[3], y[3]) and not torch.equal(z[1], x[1])


def apply_rows(x: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> torch.Tensor:
    out = x.clone()
    apply_bitmask_(out, bitmask, rows)
    return out


def test_a_finished_grammar_and_a_fork(vocabs: dict[str, Vocab]) -> None:
    v = vocabs["demo"]
    m = v.grammars.compile(GrammarSpec.choice(["yes", "no"]))
    fork = m.fork()
    for t in v.tok.encode("no", add_special_tokens=False):
        m.accept(t)
    assert m.is_finished and m.error is None
    assert not fork.is_finished  # the copy did not move
    assert fork.allowed().sum() >= 2 and not fork.allowed()[v.eos]
    assert m.allowed().tolist() == [i == v.eos for i in range(v.vocab)]  # only the end is left


def test_bad_bitmasks_are_refused(vocabs: dict[str, Vocab]) -> None:
    g = vocabs["demo"].grammars
    m = g.compile(GrammarSpec.json_object())
    with pytest.raises(ValueError, match="contiguous CPU int32 tensor"):
        g.fill_bitmask([(m, 0)], torch.zeros(1, 32, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"bitmask \(1, 31\) does not fit 1024 tokens"):
        g.fill_bitmask([(m, 0)], new_bitmask(1, 992))
    with pytest.raises(ValueError, match=r"rows \[1\]"):
        g.fill_bitmask([(m, 1)], new_bitmask(1, 1024))


def test_without_llguidance_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llguidance", None)  # import llguidance -> ImportError
    with pytest.raises(EngineUnavailableError, match=r"needs llguidance: pip install"):
        Grammars.for_bytes(vocab_size=300, eos_ids=(299,))


def test_ids_past_the_tokenizer_are_never_allowed(vocabs: dict[str, Vocab]) -> None:
    v = vocabs["bytelevel"]  # its model vocabulary is 13 ids longer than its tokenizer's
    for spec in (GrammarSpec.json_object(), GrammarSpec.regex(".*")):
        allowed = v.grammars.compile(spec).allowed()
        assert allowed.shape == (v.vocab,) and allowed[: v.vocab - 13].any()
        assert not allowed[v.vocab - 13 :].any()
