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
        self.byte_pieces = getattr(tok, "byte_pieces", {})

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


def test_byte_fallback_run_is_held_while_valid_and_released_once_invalid(
    tokenizers: dict[str, tuple[Tokenizer, int]],
) -> None:
    """A run of byte pieces decodes as a whole: an invalid byte after a complete character
    turns that character into U+FFFD too, so a valid run's text waits for the run's end; the
    byte that makes it invalid (no later byte can repair it) releases the run's U+FFFD."""
    tok = tokenizers["sentencepiece"][0]
    assert isinstance(tok, HFTokenizer) and len(tok.unstable_ids) == 256
    nul = tok.encode("\x00", add_special_tokens=False)[-1]  # <0x00>
    cont = nul + 0x80  # <0x80>: the byte pieces have consecutive ids
    assert tok.decode([nul, cont]) == "\ufffd\ufffd"  # not "\x00\ufffd"
    pieces, rest, _ = _stream(tok, [nul, 0, cont, cont])  # a skipped special inside the run
    assert pieces == ["", "", "\ufffd\ufffd", "\ufffd"] and rest == ""
    assert "".join(pieces) == tok.decode([nul, 0, cont, cont])
    held = Detokenizer(tok)
    assert held.push(nul) == "" and held.peek() == "\x00"  # held, whole characters so far
    assert held.push(nul + 0xE4) == "" and held.peek() == ""  # inside a character
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


def _gpt2_byte_chars() -> dict[int, str]:
    """Byte -> the character that stands for it in a byte-level BPE vocabulary (GPT-2's
    printable map: printable Latin-1 bytes stand for themselves, the rest from U+0100 on)."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in chars:
            chars[b], extra = chr(0x100 + extra), extra + 1
    return chars


def _byte_ids(tok: Tokenizer, name: str) -> dict[int, int]:
    """Byte -> the id of the token that is that one byte."""
    if name == "byte":
        return {b: b for b in range(256)}
    if name == "sentencepiece":
        assert isinstance(tok, HFTokenizer)
        return {b: i for i, b in tok.byte_pieces.items()}
    assert isinstance(tok, HFTokenizer)
    ids = {b: tok._tok.token_to_id(c) for b, c in _gpt2_byte_chars().items()}
    assert all(i is not None for i in ids.values())
    assert tok.decode([ids[0xE4], ids[0xB8], ids[0xAD]]) == "中"
    return ids  # type: ignore[return-value]


def _held_at_each_step(tok: Tokenizer, ids: list[int]) -> list[int]:
    """Characters of ``decode(ids[:k])`` not released after id k; asserts what was released
    is a prefix of it at each step (text never released early, then changed)."""
    detok, released, held = Detokenizer(tok), "", []
    for k, i in enumerate(ids, 1):
        released += detok.push(i)
        text = tok.decode(ids[:k])
        assert text.startswith(released), (ids[:k], released, text)
        held.append(len(text) - len(released))
    assert released + detok.flush() == tok.decode(ids)
    return held


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_only_what_can_still_change_is_held(
    tokenizers: dict[str, tuple[Tokenizer, int]], name: str, data: st.DataObject
) -> None:
    """Random mixes of single-byte ids (lead, continuation, ASCII: valid and invalid UTF-8) and
    any ids: after each id the released text is a prefix of ``decode(ids[:k])`` and, but for
    a valid byte-fallback run, at most one character (a character's incomplete 1-3 bytes)
    is held back."""
    tok, vocab = tokenizers[name]
    by_byte = _byte_ids(tok, name)
    one_byte = st.sampled_from([0x41, 0x20, 0x80, 0xBF, 0xC3, 0xE4, 0xF0, 0xB8, 0xAD, 0xFF])
    ids = data.draw(
        st.lists(st.one_of(one_byte.map(by_byte.__getitem__), st.integers(0, vocab - 1)))
    )
    held = _held_at_each_step(tok, ids)
    if name != "sentencepiece":
        assert max(held, default=0) <= 1


def test_byte_fallback_invalid_run_is_released_byte_by_byte(
    tokenizers: dict[str, tuple[Tokenizer, int]],
) -> None:
    tok = tokenizers["sentencepiece"][0]
    by_byte = _byte_ids(tok, "sentencepiece")
    ids = [by_byte[0xE4], by_byte[0xB8], by_byte[0x41], *[by_byte[0x80]] * 50]
    held = _held_at_each_step(tok, ids)
    assert held[:2] == [1, 2] and held[2:] == [0] * 51  # shown as U+FFFD once E4 B8 41 fails


@pytest.mark.parametrize("name", NAMES)
def test_long_invalid_run_streams_at_a_bounded_cost(
    tokenizers: dict[str, tuple[Tokenizer, int]], name: str
) -> None:
    """2,000 continuation-byte ids (text that never forms a character), then a character cut
    by specials: each id releases its U+FFFD at once and decodes a few ids, not the run."""
    counting = Counting(tokenizers[name][0])
    by_byte = _byte_ids(counting.tok, name)
    special = 1 if name == "sentencepiece" else (0 if name == "bytelevel-bpe" else 299)
    ids = [by_byte[0x61], *[by_byte[0x80]] * 2000, by_byte[0xE4], special, by_byte[0xB8]]
    ids += [special, by_byte[0xAD], *counting.encode("ok", add_special_tokens=False)]
    detok, pieces, work = Detokenizer(counting), [], []
    for i in ids:
        before = counting.decoded
        pieces.append(detok.push(i))
        work.append(counting.decoded - before)
    rest = detok.flush()
    assert "".join(pieces) + rest == counting.tok.decode(ids)
    # a byte-fallback run holds its 'a' until the first 0x80 shows the run invalid; else a
    # 0x80's U+FFFD is held until the next byte shows it cannot be a character's start
    first = ["", "\ufffd\ufffd"] if name == "sentencepiece" else ["a", ""]
    assert pieces[:2] == first
    assert all(p == "\ufffd" for p in pieces[2:2002])  # one U+FFFD per id, one id late at most
    assert max(work) <= 12, max(work)  # ids decoded per push: a window of a few ids
    assert detok.full_decodes == 0


def test_valid_byte_fallback_run_is_checked_without_decoding(
    tokenizers: dict[str, tuple[Tokenizer, int]],
) -> None:
    """A long valid run (characters outside the vocabulary) is checked byte by byte and
    decoded once, when it ends."""
    counting = Counting(tokenizers["sentencepiece"][0])
    by_byte = _byte_ids(counting.tok, "sentencepiece")
    word = counting.encode("the", add_special_tokens=False)
    ids = [*word, *[by_byte[b] for b in "中".encode() * 300], *word]
    pieces, rest, _ = _stream(counting, ids)
    assert "".join(pieces) + rest == counting.tok.decode(ids)
    assert pieces[len(word) : -len(word)] == [""] * 900 and "中" * 300 in pieces[-len(word)]
    assert counting.decoded < 4 * 900
