"""Sampling, prefill buckets, streaming text and tokenizers (pure, one process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation import (
    SamplingConfig,
    TextStream,
    make_generator,
    prefill_bucket,
    sample,
)
from torch_tensorrt_dist.models.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer

PROBS = torch.tensor([0.5, 0.3, 0.15, 0.05])


def _draws(cfg: SamplingConfig, n: int = 4000) -> torch.Tensor:
    logits = PROBS.log().expand(n, -1)
    return sample(logits, cfg, make_generator(cfg))


def test_greedy_is_argmax() -> None:
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    assert torch.equal(
        sample(logits, SamplingConfig(), make_generator(SamplingConfig())), logits.argmax(-1)
    )


def test_temperature_one_follows_the_distribution() -> None:
    freq = torch.bincount(_draws(SamplingConfig(temperature=1.0)), minlength=4) / 4000
    torch.testing.assert_close(freq, PROBS, atol=0.03, rtol=0)


def test_top_k_and_top_p_cut_the_support() -> None:
    assert set(_draws(SamplingConfig(temperature=1.0, top_k=2)).tolist()) == {0, 1}
    # mass before token 2 is 0.8 >= 0.7: tokens 0 and 1 stay, renormalised 0.625 / 0.375
    draws = _draws(SamplingConfig(temperature=1.0, top_p=0.7))
    assert set(draws.tolist()) == {0, 1}
    assert abs((draws == 0).float().mean().item() - 0.625) < 0.03
    assert set(_draws(SamplingConfig(temperature=1.0, top_p=0.4)).tolist()) == {0}


def test_same_seed_same_tokens() -> None:
    a = _draws(SamplingConfig(temperature=1.0, seed=3), 64)
    assert torch.equal(a, _draws(SamplingConfig(temperature=1.0, seed=3), 64))
    assert not torch.equal(a, _draws(SamplingConfig(temperature=1.0, seed=4), 64))


def test_sampling_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"temperature must be 0 \(greedy\) or in"):
        SamplingConfig(temperature=-1)
    with pytest.raises(ConfigError, match=r"top_p must be a finite number in \(0, 1\], got 0"):
        SamplingConfig(top_p=0)
    for t in (float("nan"), float("inf"), 1e-300, 1e3):  # NaN fails every comparison
        with pytest.raises(ConfigError, match=r"temperature must be 0 \(greedy\) or in"):
            SamplingConfig(temperature=t)
    with pytest.raises(ConfigError, match=r"seed must be an integer in \[0, 2\*\*64\)"):
        SamplingConfig(seed=2**64)


def test_prefill_buckets() -> None:
    assert prefill_bucket(5, 10, 128) == 16
    assert prefill_bucket(16, 10, 128) == 16
    assert prefill_bucket(17, 10, 128) == 32
    assert prefill_bucket(40, 20, 64) == 44  # 64 would leave no room for 20 new tokens
    with pytest.raises(ConfigError, match="the prompt has 64 tokens, but the model's max"):
        prefill_bucket(64, 1, 64)
    with pytest.raises(
        ConfigError,
        match=r"exceeds the KV cache length 64; use "
        r"max_new_tokens <= 24",
    ):
        prefill_bucket(40, 30, 64)


def test_text_stream_waits_for_whole_characters() -> None:
    tok = ByteTokenizer(256)
    stream = TextStream(tok, 2)
    e_acute = list("é".encode())
    assert stream.push([e_acute[0], ord("a")]) == ["", "a"]
    assert stream.push([e_acute[1], 2], stop_ids=(2,)) == ["é", ""]
    assert stream.push([ord("b"), ord("c")]) == ["b", ""]  # row 1 stopped


def test_byte_tokenizer_round_trip_and_errors() -> None:
    tok = ByteTokenizer(128)
    assert tok.decode(tok.encode("hello")) == "hello"
    with pytest.raises(ConfigError, match="bytes \\[169, 195\\] >= the vocabulary size 128"):
        tok.encode("é")


def test_hf_tokenizer_from_tokenizer_json(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        ["hello world"] * 10,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["</s>"],
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 0}))
    loaded = load_tokenizer(tmp_path, vocab_size=300)
    assert isinstance(loaded, HFTokenizer)
    assert loaded.eos_ids == (0,)
    ids = loaded.encode("hello world")
    assert len(ids) < len("hello world")  # merged, not bytes
    assert loaded.decode([*ids, 0]) == "hello world"  # special tokens skipped
    assert isinstance(load_tokenizer(None, vocab_size=256), ByteTokenizer)


def test_checkpoint_with_an_unreadable_tokenizer_is_refused(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.model").write_bytes(b"sentencepiece")
    with pytest.raises(ConfigError, match=r"tokenizer.model but no tokenizer.json.*save_pre"):
        load_tokenizer(tmp_path, vocab_size=300)
    (tmp_path / "tokenizer.model").unlink()
    assert isinstance(load_tokenizer(tmp_path, vocab_size=300), ByteTokenizer)  # warned, bytes
