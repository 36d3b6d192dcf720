"""The shipped demo checkpoint (data/demo): format, size, tokenizer, and that it learned English."""

from __future__ import annotations

import itertools
import json
import re
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.models import demo

transformers = pytest.importorskip("transformers")

PROMPT = "The return statement"
MB = 1024 * 1024


@cache
def _path() -> Path:
    return demo.demo_checkpoint_path()


@cache
def _config() -> dict[str, Any]:
    return json.loads((_path() / "config.json").read_text())


@cache
def _tokenizer() -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(_path() / "tokenizer.json"))


@cache
def _hf_model() -> Any:
    model = transformers.LlamaForCausalLM.from_pretrained(_path())
    return model.eval()


@cache
def _corpus_words() -> tuple[frozenset[str], frozenset[tuple[str, str]]]:
    """Words and adjacent word pairs of the training text (lower case)."""
    words: set[str] = set()
    pairs: set[tuple[str, str]] = set()
    for paragraph in demo.demo_corpus():
        seq = [w.lower() for w in re.findall(r"[A-Za-z]+", paragraph)]
        words.update(seq)
        pairs.update(itertools.pairwise(seq))
    return frozenset(words), frozenset(pairs)


def _greedy_text(model: Any, n_new: int = 40) -> str:
    ids = torch.tensor([_tokenizer().encode(PROMPT).ids])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=n_new, do_sample=False, eos_token_id=None)
    return str(_tokenizer().decode(out[0, ids.shape[1] :].tolist()))


@dataclass(frozen=True)
class WordStats:
    words: list[str]
    known: float  # fraction of words found in the training text
    known_pairs: float  # fraction of adjacent word pairs found there
    distinct: int

    def english_like(self) -> bool:
        return (
            len(self.words) >= 10
            and self.known >= 0.6
            and self.known_pairs >= 0.3
            and self.distinct >= 5
        )


def _word_stats(text: str) -> WordStats:
    words = [w.lower() for w in re.findall(r"[A-Za-z]+", text)]
    words = words[:-1]  # the last word may be cut off by the token limit
    vocab, pairs = _corpus_words()
    known = sum(w in vocab for w in words) / max(1, len(words))
    adjacent = list(itertools.pairwise(words))
    known_pairs = sum(p in pairs for p in adjacent) / max(1, len(adjacent))
    return WordStats(words, known, known_pairs, len(set(words)))


def test_path_does_not_import_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry in sys.modules makes `import transformers` raise ImportError.
    monkeypatch.setitem(sys.modules, "transformers", None)
    path = demo.demo_checkpoint_path()
    assert path.is_dir() and path.name == "demo"
    assert (path / "model.safetensors").is_file()


def test_config_suits_tensor_and_pipeline_parallel() -> None:
    cfg = _config()
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["model_type"] == "llama"
    assert 192 <= cfg["hidden_size"] <= 256
    assert cfg["num_hidden_layers"] == 4  # pipeline 2 gets 2 layers per stage
    assert cfg["num_attention_heads"] == 8 and cfg["num_key_value_heads"] == 4
    for tp in (2, 4):
        assert cfg["num_attention_heads"] % tp == 0
        assert cfg["num_key_value_heads"] % tp == 0
        assert cfg["intermediate_size"] % (64 * tp) == 0
    assert cfg["hidden_size"] % cfg["num_attention_heads"] == 0
    assert cfg["rope_parameters"]["rope_theta"] == cfg["rope_theta"] == 10000.0
    assert cfg["tie_word_embeddings"] is True
    assert cfg["dtype"] == "bfloat16"
    assert 512 <= cfg["vocab_size"] <= 2048
    assert cfg["vocab_size"] == _tokenizer().get_vocab_size()
    assert cfg["bos_token_id"] == _tokenizer().token_to_id("<s>")
    assert cfg["eos_token_id"] == _tokenizer().token_to_id("</s>")


def test_weights_are_bfloat16_tied_and_load_in_transformers() -> None:
    from safetensors import safe_open

    with safe_open(str(_path() / "model.safetensors"), "pt") as f:
        names = list(f.keys())
        dtypes = {f.get_slice(n).get_dtype() for n in names}
    assert dtypes == {"BF16"}
    assert "lm_head.weight" not in names  # tied to model.embed_tokens.weight
    model = _hf_model()
    cfg = _config()
    assert model.dtype == torch.bfloat16
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.model.embed_tokens.weight.shape == (cfg["vocab_size"], cfg["hidden_size"])
    assert len(model.model.layers) == cfg["num_hidden_layers"]
    assert torch.isfinite(model.model.layers[0].mlp.down_proj.weight.float()).all()


def test_file_sizes_within_budget() -> None:
    files = {p.name: p.stat().st_size for p in _path().iterdir() if p.is_file()}
    assert set(demo.DEMO_FILES) <= set(files)
    assert files["model.safetensors"] <= 8 * MB
    assert sum(files.values()) <= 10 * MB


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=60))
@example("literal <s> and </s> markers")
@example("\x00\u200b\U0001f642 \t\r\n")
def test_tokenizer_round_trips_any_text(text: str) -> None:
    tok = _tokenizer()
    ids = tok.encode(text).ids
    assert ids[0] == tok.token_to_id("<s>")
    assert tok.decode(ids[1:], skip_special_tokens=False) == text


def test_tokenizer_round_trips_non_ascii_and_is_compact() -> None:
    tok = _tokenizer()
    text = "Grüße, naïve café: 日本語, emoji 🙂, tabs\tand\nnewlines."
    ids = tok.encode(text).ids
    assert tok.decode(ids) == text  # decode drops the leading <s>
    english = "The return statement leaves the current function call with the expression list."
    # Trained merges: well under one token per character on English prose.
    assert len(tok.encode(english).ids) < len(english) / 2.5


def test_greedy_continuation_is_mostly_english_words() -> None:
    text = _greedy_text(_hf_model())
    stats = _word_stats(text)
    assert stats.english_like(), f"{stats} for {text!r}"


def test_english_check_rejects_noise_and_repetition() -> None:
    # The check above must be able to fail: random weights of the same shape fail it...
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig.from_pretrained(_path())
    random_model = transformers.LlamaForCausalLM(cfg).eval()
    text = _greedy_text(random_model)
    assert not _word_stats(text).english_like(), text
    # ...and so does a model stuck on one word, while real English passes.
    assert not _word_stats(" the" * 40).english_like()
    assert _word_stats(
        "The return statement leaves the current function call with the "
        "expression list as the return value of the call. "
    ).english_like()


@pytest.mark.slow
def test_train_demo_is_deterministic(tmp_path: Path) -> None:
    # Two short runs from the same seed write byte-identical weights and tokenizers.
    runs = [
        demo.train_demo(tmp_path / name, steps=2, batch_size=2, seq_len=16, log_every=1)
        for name in ("a", "b")
    ]
    for name in ("model.safetensors", "tokenizer.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert runs[0].final_loss == runs[1].final_loss > 0
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    assert cfg["max_position_embeddings"] == 16 and cfg["dtype"] == "bfloat16"
    info = json.loads((tmp_path / "a" / demo.TRAIN_INFO).read_text())
    assert info["steps"] == 2 and info["seed"] == 0
    model = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "a")
    assert model.dtype == torch.bfloat16


def test_train_demo_rejects_bad_options(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="steps=0"):
        demo.train_demo(tmp_path, steps=0)


def test_demo_checkpoint_path_reports_missing_files(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demo, "DEMO_FILES", (*demo.DEMO_FILES, "missing.bin"))
    with pytest.raises(ConfigError, match=r"lacks missing\.bin.*--out"):
        demo.demo_checkpoint_path()


def test_shipped_tokenizer_is_reproducible() -> None:
    info = json.loads((_path() / demo.TRAIN_INFO).read_text())
    paragraphs = demo.demo_corpus()
    if demo.corpus_sha256(paragraphs) != info["corpus_sha256"]:
        pytest.skip(f"this Python's pydoc topics differ from Python {info['python']}'s")
    fresh = demo.train_tokenizer(paragraphs, _config()["vocab_size"])
    assert json.loads(fresh.to_str()) == json.loads(_tokenizer().to_str())
