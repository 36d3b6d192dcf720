"""Incremental detokenization: the released text equals ``tokenizer.decode(ids)``, whatever the
tokenizer (byte, byte-level BPE, SentencePiece with byte fallback), at a bounded cost per token;
stop strings split across tokens are found on it."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests._tokenizers import sentencepiece
from torch_tensorrt_dist.generation.core import Emitted, GenerationCore, Request
from torch_tensorrt_dist.generation.detok import INCOMPLETE, Detokenizer
from torch_tensorrt_dist.generation.kv_blocks import BlockPool
from torch_tensorrt_dist.generation.scheduler import Scheduler
from torch_tensorrt_dist.generation.step_inputs import StepLimits
from torch_tensorrt_dist.generation.stops import StopText
from torch_tensorrt_dist.models.demo import demo_checkpoint_path
from torch_tensorrt_dist.models.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer

TEXTS = [
    "the café serves crème brûlée and naïve ideas",
    "hello world, the quick brown fox 😀 jumps",
    "日本語 text mixes scripts — and dashes",
    "  leading spaces,\nnew lines\n\nand   runs of spaces ",
]


class Counting:
    """A tokenizer that counts the ids it decodes."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok, self.eos_ids, self.decoded = tok, tok.eos_ids, 0
        self.unstable_ids = getattr(tok, "unstable_ids", frozenset())

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return self.tok.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: list[int]) -> str:
        self.decoded += len(ids)
        return self.tok.decode(ids)


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Tokenizer, int]]:
    """name -> (tokenizer, vocabulary size); the HF ones have special tokens 0..2 / 0..1."""
    sp = sentencepiece(TEXTS[:2] * 5, tmp_path_factory.mktemp("sp") / "tokenizer.json")
    return {
        "byte": (ByteTokenizer(300), 300),  # ids >= 256 decode to nothing, as specials do
        "bytelevel-bpe": (HFTokenizer(demo_checkpoint_path() / "tokenizer.json"), 1024),
        "sentencepiece": (HFTokenizer(sp), 363),
    }


def _stream(tok: Tokenizer, ids: list[int]) -> tuple[list[str], str, Detokenizer]:
    detok = Detokenizer(tok)
    pieces = [detok.push(i) for i in ids]
    return pieces, detok.flush(), detok


NAMES = ["byte", "bytelevel-bpe", "sentencepiece"]


@pytest.mark.parametrize("name", NAMES)
def test_real_text_is_released_whole_characters_equal_to_decode(
    tokenizers: dict[str, tuple[Tokenizer, int]], name: str
) -> None:
    tok = tokenizers[name][0]
    for text in TEXTS:
        ids = tok.encode(text)
        pieces, rest, detok = _stream(tok, ids)
        assert "".join(pieces) == tok.decode(ids)
        assert rest == "" and detok.full_decodes == 0
        assert all(INCOMPLETE not in p for p in pieces)  # never cut inside a character
        if name == "byte":
            assert "".join(pieces) == text


def test_sentencepiece_leading_space_and_special_tokens(
    tokenizers: dict[str, tuple[Tokenizer, int]],
) -> None:
    tok = tokenizers["sentencepiece"][0]
    ids = tok.encode("hello world")
    assert tok.decode(ids[1:]) == "world"  # decoding alone strips the word's leading space
    pieces, _, _ = _stream(tok, [1, *ids[:1], 2, *ids[1:], 2])  # <s> hello </s> world </s>
    assert "".join(pieces) == "hello world" == tok.decode([1, *ids, 2])
    assert pieces[2] == ""  # the special token adds nothing
    assert pieces[3].startswith(" ") and "".join(pieces[3:]) == " world"  # the space stays


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_ids_concatenate_to_decode(
    tokenizers: dict[str, tuple[Tokenizer, int]], name: str, data: st.DataObject
) -> None:
    """Random ids (invalid UTF-8, specials, lone spaces): pieces + flush == decode(ids)."""
    tok, vocab = tokenizers[name]
    ids = data.draw(st.lists(st.integers(0, vocab - 1), max_size=40))
    pieces, rest, detok = _stream(tok, ids)
    assert "".join(pieces) + rest == tok.decode(ids)
    assert detok.full_decodes == 0


def test_byte_fallback_run_is_released_when_it_ends(
    tokenizers: dict[str, tuple[Tokenizer, int]],
) -> None:
    """A run of byte pieces decodes as a whole: an invalid byte after a complete character
    turns that character into U+FFFD too, so a run's text waits for the run's end."""
    tok = tokenizers["sentencepiece"][0]
    assert isinstance(tok, HFTokenizer) and len(tok.unstable_ids) == 256
    nul = tok.encode("\x00", add_special_tokens=False)[-1]  # <0x00>
    cont = nul + 0x80  # <0x80>: the byte pieces have consecutive ids
    assert tok.decode([nul, cont]) == "\ufffd\ufffd"  # not "\x00\ufffd"
    pieces, rest, _ = _stream(tok, [nul, 0, cont])  # a skipped special inside the run
    assert pieces == ["", "", ""] and rest == "\ufffd\ufffd" == tok.decode([nul, 0, cont])
    held = Detokenizer(tok)
    assert held.push(nul) == "" and held.peek() == "\x00"  # held, whole characters so far
    assert held.push(cont) == "" and held.peek() == ""  # an invalid run: every byte is U+FFFD
    word = tok.encode("hello", add_special_tokens=False)
    pieces, _, _ = _stream(tok, [nul, *word])
    assert pieces[0] == "" and "".join(pieces) == "\x00 hello" == tok.decode([nul, *word])


@pytest.mark.parametrize("name", NAMES)
def test_cost_per_token_is_bounded(tokenizers: dict[str, tuple[Tokenizer, int]], name: str) -> None:
    """2000 tokens decode a few ids each, not the whole sequence (which would be ~2e6)."""
    counting = Counting(tokenizers[name][0])
    ids = counting.encode(" ".join(TEXTS) * 30)[:2000]
    assert len(ids) == 2000
    pieces, rest, _ = _stream(counting, ids)
    assert counting.decoded < 20 * len(ids)
    assert "".join(pieces) + rest == counting.tok.decode(ids)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("stop", [("brûlée",), ("quick brown", "xyz"), ("—",), ("\n\n", "s,")])
def test_stop_strings_split_across_tokens(
    tokenizers: dict[str, tuple[Tokenizer, int]], name: str, stop: tuple[str, ...]
) -> None:
    """The text shown is decode(ids) up to the first stop string, however tokens split it."""
    tok = tokenizers[name][0]
    for text in TEXTS:
        ids = tok.encode(text)
        full = tok.decode(ids)
        tail = StopText(tok, stop)
        pieces, hit = [], False
        for i in ids:
            piece, hit = tail.push(i)
            pieces.append(piece)
            if hit:
                break
        found = [i for i in (full.find(s) for s in stop) if i >= 0]
        if found:
            assert hit and "".join(pieces) == full[: min(found)], (text, stop)
            # at the first token whose text holds a stop string: not one token late
            k = len(pieces)
            assert not any(s in tok.decode(ids[: k - 1]) for s in stop), (text, stop)
        else:
            assert not hit and "".join(pieces) + tail.flush()[0] == full
        assert tail.text == "".join(pieces) + ("" if hit else tail.text[len("".join(pieces)) :])
        assert all(INCOMPLETE not in p for p in pieces)


def _scripted(tok: Tokenizer, vocab: int, script: list[int], req: Request) -> list[Emitted]:
    """``req`` run by a core whose model generates ``script`` after a one-token prompt,
    whatever the prompt is; what the core emitted."""

    def step(*inputs: torch.Tensor) -> torch.Tensor:
        start, last = inputs[1], inputs[2]
        pos = (start + last).tolist()  # the row's last token's position: 0 is the prompt
        return torch.nn.functional.one_hot(
            torch.tensor([script[min(p, len(script) - 1)] for p in pos]), vocab
        ).float()

    limits = StepLimits(rows=1, tokens=8, blocks=16, block_size=4)
    core = GenerationCore(
        step, pool=BlockPool(17, 4), max_seq_len=64, limits=limits, tokenizer=tok, text=True
    )
    sched = Scheduler(core, max_rows=1, max_prefill_tokens=8)
    sched.add(req)
    out: list[Emitted] = []
    while not sched.idle():
        out += core.step(sched.plan())
    return out


@pytest.mark.parametrize("after", ["eos", "length", "more text"])
def test_byte_fallback_stop_string_ends_at_its_last_byte(
    tokenizers: dict[str, tuple[Tokenizer, int]], after: str
) -> None:
    """A stop string of byte pieces (a character not in the vocabulary) is found at the token
    that completes it, never shown, whether the request then ends (a stop id, the length) or
    goes on: the byte-fallback run it is in is still held by the detokenizer then."""
    tok, vocab = tokenizers["sentencepiece"]
    ids = tok.encode("the 中", add_special_tokens=False)
    assert len(ids) == 5 and all(i in tok.unstable_ids for i in ids[2:])  # 中: three bytes
    tail = StopText(tok, ("中",))
    assert [tail.push(i) for i in ids] == [
        ("the", False),
        (" ", False),
        ("", False),
        ("", False),
        ("", True),
    ]
    then = {"eos": [2], "length": [], "more text": tok.encode("the", add_special_tokens=False)}
    script = ids + then[after]
    req = Request(0, (1,), len(ids) if after == "length" else 20, stop_ids=(2,), stop=("中",))
    out = _scripted(tok, vocab, script, req)
    assert [e.tokens[0] for e in out] == ids  # it ends at the last byte of 中
    assert "".join(e.text for e in out) == "the " and out[-1].finish == "stop"


def test_flush_stop_hit_ends_the_request_with_stop(
    tokenizers: dict[str, tuple[Tokenizer, int]],
) -> None:
    """A stop string only the end's flush shows (bytes that never completed a character show as
    U+FFFD) is a hit: the finish is ``stop``, not ``length``, and the stop string is not shown."""
    tok, vocab = tokenizers["byte"]
    out = _scripted(tok, vocab, [ord("a"), 0xE4], Request(0, (1,), 2, stop=("\ufffd",)))
    assert [(e.tokens, e.text, e.finish) for e in out] == [([97], "a", None), ([0xE4], "", "stop")]


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_stop_string_ends_the_text_at_the_first_token_that_completes_it(
    tokenizers: dict[str, tuple[Tokenizer, int]], name: str, data: st.DataObject
) -> None:
    """Random ids, a stop string cut from their text: the hit comes at the first k where
    ``decode(ids[:k])`` holds the stop string, and the text shown is that text before it."""
    tok, vocab = tokenizers[name]
    ids = data.draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=30))
    full = tok.decode(ids)
    start = data.draw(st.integers(0, max(len(full) - 1, 0)))
    stop = full[start : start + data.draw(st.integers(1, 3))]
    if not stop or INCOMPLETE in stop:
        return  # a stop string is text a client sends
    tail, shown, at = StopText(tok, (stop,)), "", None
    for k, i in enumerate(ids, 1):
        piece, hit = tail.push(i)
        shown += piece
        if hit:
            at = k
            break
    else:
        piece, hit = tail.flush()
        shown, at = shown + piece, len(ids) if hit else None
    first = next(k for k in range(1, len(ids) + 1) if stop in tok.decode(ids[:k]))
    text = tok.decode(ids[:first])
    assert at == first and shown == text[: text.find(stop)], (ids, stop)
