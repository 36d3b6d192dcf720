"""Tokenizers for generation: HF ``tokenizers`` from ``tokenizer.json``, or a byte-level fallback.

tok = load_tokenizer(checkpoint_dir, vocab_size=args.vocab_size)
ids = tok.encode("Hello")          # list[int], BOS prepended when the tokenizer does so
text = tok.decode(ids)
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Protocol

from torch_tensorrt_dist.errors import CheckpointError, ConfigError

__all__ = ["ByteTokenizer", "HFTokenizer", "Tokenizer", "load_tokenizer"]

logger = logging.getLogger(__name__)

_BYTE_PIECE = re.compile(r"<0x[0-9A-F]{2}>")


class Tokenizer(Protocol):
    eos_ids: tuple[int, ...]

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def token_text(self, token: int) -> str:
        """One token's text alone, special tokens spelt out (logprobs show it)."""
        ...


class ByteTokenizer:
    """Token id = UTF-8 byte value (ids >= 256 decode to nothing). Needs vocab_size >= 128."""

    def __init__(self, vocab_size: int, eos_ids: tuple[int, ...] = ()) -> None:
        self.vocab_size = vocab_size
        self.eos_ids = eos_ids

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))  # no special tokens to add
        too_big = sorted({b for b in ids if b >= self.vocab_size})
        if too_big:
            raise ConfigError(
                f"the byte-level tokenizer maps bytes to ids, but the prompt holds bytes "
                f"{too_big[:5]} >= the vocabulary size {self.vocab_size}; use ASCII text or a "
                "checkpoint with tokenizer.json"
            )
        return ids

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def token_text(self, token: int) -> str:
        return self.decode([token])


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` loaded from ``tokenizer.json``."""

    def __init__(self, path: Path, eos_ids: tuple[int, ...] = ()) -> None:
        from tokenizers import Tokenizer as _Tokenizer

        self.path = Path(path)
        """The ``tokenizer.json`` read (structured output hands it to its grammar engine)."""
        try:
            self._tok = _Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises its own Exception subclass
            raise CheckpointError(f"cannot read {path}: {exc}") from exc
        self.eos_ids = eos_ids
        #: ids whose text can still change with the next ids: byte-fallback pieces
        #: (``<0xC3>``), which ``decode`` turns into text a whole run at a time (an invalid run
        #: becomes one U+FFFD per byte, characters that were complete included)
        self.unstable_ids: frozenset[int] = frozenset()
        #: the byte each byte-fallback piece stands for (``<0xC3>`` -> 0xC3), by id
        self.byte_pieces: dict[int, int] = {}
        if getattr(self._tok.model, "byte_fallback", False):
            self.byte_pieces = {
                i: int(piece[3:5], 16)
                for piece, i in self._tok.get_vocab().items()
                if _BYTE_PIECE.fullmatch(piece)
            }
            self.unstable_ids = frozenset(self.byte_pieces)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Ids of ``text``; ``add_special_tokens=False`` for text that holds its own (a
        rendered chat template). Through ``encode_batch``, which releases Python's interpreter
        lock while it works (``encode`` holds it: a long prompt would stall every thread)."""
        batch = self._tok.encode_batch([text], add_special_tokens=add_special_tokens)
        return list(batch[0].ids)

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=True))

    def token_text(self, token: int) -> str:
        """The token decoded alone (``</s>`` for a special token; a piece of a character
        alone is U+FFFD), as vLLM shows it in logprobs."""
        return str(self._tok.decode([token], skip_special_tokens=False))


def _eos_from_files(root: Path) -> tuple[int, ...]:
    ids: list[int] = []
    for name in ("generation_config.json", "config.json"):
        file = root / name
        if not file.is_file():
            continue
        eos = json.loads(file.read_text()).get("eos_token_id")
        for i in eos if isinstance(eos, list) else [eos]:
            if isinstance(i, int) and i not in ids:
                ids.append(i)
    return tuple(ids)


def load_tokenizer(path: str | Path | None, *, vocab_size: int) -> Tokenizer:
    """The checkpoint's ``tokenizer.json`` when present, else the byte-level fallback."""
    root = Path(path) if path is not None else None
    eos = _eos_from_files(root) if root is not None else ()
    if root is not None and (root / "tokenizer.json").is_file():
        return HFTokenizer(root / "tokenizer.json", eos)
    if root is not None:
        others = [
            f
            for f in ("tokenizer.model", "vocab.json", "tokenizer_config.json")
            if (root / f).is_file()
        ]
        if others:
            raise ConfigError(
                f"{root} has {', '.join(others)} but no tokenizer.json, the only format read "
                "here; save one with transformers: AutoTokenizer.from_pretrained(path)"
                ".save_pretrained(path)"
            )
        logger.warning(
            "%s has no tokenizer files: token ids are UTF-8 bytes, which is only meaningful for "
            "a model trained on bytes; add the model's tokenizer.json",
            root,
        )
    return ByteTokenizer(vocab_size, eos)
