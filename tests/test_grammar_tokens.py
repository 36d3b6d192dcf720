"""The grammar engine's memoized tokenizer (``generation/grammar_tokens``) gives the masks the
engine's own tokenizer gives: the serve grammars (forced tool calls, a named function, JSON
schemas, regex, choice, a grammar after reasoning) walked with random and greedy tokens over
three tokenizers, every step's mask compared bit for bit."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tests._tokenizers import bytelevel_bpe, sentencepiece
from torch_tensorrt_dist.generation.grammar import Grammars, GrammarSpec
from torch_tensorrt_dist.generation.grammar_tokens import MemoTokenizer
from torch_tensorrt_dist.models.demo import demo_checkpoint_path
from torch_tensorrt_dist.models.tokenizer import HFTokenizer
from torch_tensorrt_dist.serving.tools.forced import named_schema, required_schema

llg = pytest.importorskip("llguidance")

TEXTS = [
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}',
    "the quick brown fox jumps over the lazy dog, 1234-56-78 and café ünïcode",
    '[{"name": "get_time", "parameters": {}}, {"n": 12, "ok": true}]',
]
PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["c", "f"]},
        "days": {"type": "integer"},
    },
    "required": ["city", "unit"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]
SPECS = {
    "required": GrammarSpec.json_schema({**required_schema(TOOLS, parallel=True), "minItems": 3}),
    "required_one": GrammarSpec.json_schema(required_schema(TOOLS, parallel=False)),
    "named": GrammarSpec.json_schema(named_schema(TOOLS[0])),
    "schema": GrammarSpec.json_schema({"type": "array", "items": PARAMS, "minItems": 2}),
    "regex": GrammarSpec.regex(r"(get_weather|get_time)\(\"[a-z]{1,8}\"\)"),
    "choice": GrammarSpec.choice(["get_weather", "get_time", "none"]),
    "after": replace(GrammarSpec.json_schema(named_schema(TOOLS[0])), after="</think>"),
}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Grammars, Grammars]]:
    """Per tokenizer: (the engine's own tokenizer, the memoized one)."""
    tmp = tmp_path_factory.mktemp("tok")
    out = {}
    bl = bytelevel_bpe(TEXTS * 3, tmp / "bl.json", vocab_size=400)
    sp = sentencepiece(TEXTS * 3, tmp / "sp.json", vocab_size=150)
    for name, path, eos_piece, pad in (
        ("demo", demo_checkpoint_path() / "tokenizer.json", "</s>", 0),
        ("bytelevel", bl, "<|endoftext|>", 13),  # a model vocabulary padded past the tokenizer's
        ("sentencepiece", sp, "</s>", 0),
    ):
        hf = HFTokenizer(Path(path))
        eos, vocab = hf._tok.token_to_id(eos_piece), hf._tok.get_vocab_size() + pad
        text = Path(path).read_text()
        own = llg.LLTokenizer(text, n_vocab=vocab, eos_token=[eos])
        plain = Grammars(own, vocab_size=vocab)
        plain.eos_ids = (eos,)
        memo = Grammars.from_file(path, vocab_size=vocab, eos_ids=(eos,))
        out[name] = (plain, memo)
    return out


@pytest.mark.parametrize("name", ["demo", "bytelevel", "sentencepiece"])
def test_same_vocabulary(pairs: dict[str, tuple[Grammars, Grammars]], name: str) -> None:
    plain, memo = pairs[name]
    a, b = plain._tok, memo._tok
    assert isinstance(memo._tok, llg.LLTokenizer) and memo._tok is not plain._tok
    for i in range(plain.vocab_size):
        assert a.decode_bytes([i]) == b.decode_bytes([i]), i
        assert a.is_special_token(i) == b.is_special_token(i), i
    for text in [*TEXTS, '", "unit": "', "}}, {", "ünï\n  x"]:
        assert a.tokenize_str(text) == b.tokenize_str(text)


def _walks(plain: Grammars, memo: Grammars, spec: GrammarSpec, seed: int, steps: int) -> int:
    """Walk ``spec`` with both, the same tokens (random from seed, or greedy: the lowest and the
    highest allowed id); the number of steps taken (all with identical masks)."""
    g = torch.Generator().manual_seed(seed)
    a, b = plain.compile(spec), memo.compile(spec)
    eos = torch.zeros(plain.vocab_size, dtype=torch.bool)
    eos[list(plain.eos_ids)] = True
    taken = 0
    if spec.after:  # some reasoning text first, then the end of it (tokenized by the model)
        for t in memo._tok.tokenize_str("ok, the weather</think>"):
            a.accept(t)
            b.accept(t)
    for _ in range(steps):
        ma, mb = a.allowed(), b.allowed()
        assert torch.equal(ma, mb), (spec.kind, seed, taken)
        ids = (ma & ~eos).nonzero().flatten()
        if a.is_finished or not len(ids):
            break
        drawn = int(torch.randint(len(ids), (1,), generator=g))
        token = int(ids[{0: 0, 1: len(ids) - 1}.get(seed % 3, drawn)])
        a.accept(token)
        b.accept(token)
        taken += 1
    return taken


@pytest.mark.parametrize("name", ["demo", "bytelevel", "sentencepiece"])
def test_same_masks(pairs: dict[str, tuple[Grammars, Grammars]], name: str) -> None:
    plain, memo = pairs[name]
    forced = 0
    for kind, spec in SPECS.items():
        for seed in range(6):
            assert _walks(plain, memo, spec, seed, 120) > 0, (kind, seed)
    # the walks went through forced states (one allowed token), where the memo serves
    m = memo.compile(SPECS["required"])
    for _ in range(40):
        allowed = m.allowed().nonzero().flatten()
        forced += len(allowed) == 1
        m.accept(int(allowed[0]))
    assert forced > 5


def test_memo_bounded() -> None:
    from torch_tensorrt_dist.generation import grammar_tokens

    base = llg.LLTokenizer(
        (demo_checkpoint_path() / "tokenizer.json").read_text(), n_vocab=1024, eos_token=[1]
    )
    memo = MemoTokenizer(base, 1024, (1,))
    for i in range(grammar_tokens.MEMO_SIZE + 5):
        assert memo(f"k{i}") == base.tokenize_str(f"k{i}")
    assert len(memo._memo) <= grammar_tokens.MEMO_SIZE
    assert memo("k1") is memo("k1")  # a hit: the same list
