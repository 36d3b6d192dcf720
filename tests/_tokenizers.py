"""Tokenizers made here with the ``tokenizers`` library (no downloads), of the two kinds
``models.tokenizer.HFTokenizer`` reads: byte-level BPE (GPT-2, Llama 3, Qwen) and
SentencePiece-style BPE with byte fallback (Llama 2, Mistral)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path


def sentencepiece(texts: Sequence[str], path: Path, *, vocab_size: int = 120) -> Path:
    """A Llama-style tokenizer.json: Metaspace pieces, byte fallback (``<0x..>`` pieces after
    the learned ones), a decoder that strips the sequence's leading space; ``<unk>``, ``<s>``,
    ``</s>`` are ids 0, 1, 2."""
    from tokenizers import Tokenizer as HF
    from tokenizers import decoders, models, pre_tokenizers, trainers

    specials = ["<unk>", "<s>", "</s>"]
    base = HF(models.BPE(unk_token="<unk>"))
    base.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    base.train_from_iterator(
        texts,
        trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False),
    )
    model = json.loads(base.to_str())["model"]
    vocab, merges = model["vocab"], [tuple(m) for m in model["merges"]]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    tok = HF(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    tok.add_special_tokens(specials)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    tok.save(str(path))
    return path


def bytelevel_bpe(texts: Sequence[str], path: Path, *, vocab_size: int = 400) -> Path:
    """A GPT-2-style tokenizer.json: ByteLevel pre-tokenizer and decoder over all 256 byte
    symbols, merges learned from ``texts``; ``<|endoftext|>`` is the last id."""
    from tokenizers import Tokenizer as HF
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = HF(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 1,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(str(path))
    return path
