"""Structured output: a grammar per request that masks the tokens its text cannot continue with.

    spec = GrammarSpec.json_schema({"type": "object", "properties": {...}})  # json_object(),
    grammars = Grammars.from_file(checkpoint / "tokenizer.json",             #   regex(), choice()
                                  vocab_size=V, eos_ids=tok.eos_ids)         # once per server
    matcher = grammars.compile(spec)         # GrammarError (a ConfigError: 400) with the reason
    bitmask = new_bitmask(B, V)              # int32 [B, ceil(V / 32)], one bit per token
    grammars.fill_bitmask([(matcher, row)], bitmask)
    apply_bitmask_(x, bitmask, [row])        # -inf outside the grammar; float32 logits [B, V]
    matcher.accept(token)                    # then: matcher.is_finished, matcher.error

How the core calls it (design; integration is the core's):

- On join, **every rank** compiles the request's :class:`GrammarSpec` (JSON, sent with the
  request) into its own :class:`Matcher`: the same spec, tokenizer and tokens give the same
  masks on every rank, so ranks still sample alike without communicating. ``n`` > 1: one
  :meth:`Matcher.fork` per choice. A :class:`GrammarError` fails that request only (400).
- Per step: the masks (:mod:`.grammar_masks`), computed once the step's graph is launched.
- After sampling: :meth:`Matcher.accept`. The request ends with ``stop`` when
  :attr:`Matcher.is_finished` (the grammar admits nothing more; no end-of-text token needed)
  or on an end-of-text token the grammar accepted; :attr:`Matcher.error` set (an engine limit
  hit mid-way) fails that request only. A request cut by ``max_tokens`` ends with ``length``
  and its text may not parse, as with OpenAI and vLLM.

Engine: **llguidance** (Microsoft's Rust library, also a backend of vLLM, SGLang and llama.cpp),
chosen on measurements on this project's machines (issue 29 report): it installs as one 3 MB
abi3 wheel with no Python dependencies (no torch pin; xgrammar 0.2.9 requires torch,
transformers, triton and apache-tvm-ffi and takes 6 s to import), builds its token trie from our
``tokenizer.json`` text itself (byte-level BPE and SentencePiece byte fallback alike; 6 ms at
1,024 tokens, 0.3 s at 32,000), compiles a grammar in about 1-5 ms (outlines-core: 0.3 s for a
small schema at 32,000 tokens, 10 s for ``json_object`` at 1,024, and it ignored ``maximum``),
computes a mask in about 0.1-0.3 ms at 32,000 tokens, gave schema-valid JSON in every sampled
run (xgrammar let a raw control character into a string), and reports a grammar error as text.
Regexes use Rust's ``regex`` syntax (``\\d`` is any Unicode digit: write ``[0-9]`` for ASCII).
JSON is generated with at most 16 whitespace characters between tokens (pretty-printing
stays possible; a model cannot loop on whitespace)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch
from torch import Tensor

from torch_tensorrt_dist.errors import ConfigError, EngineUnavailableError
from torch_tensorrt_dist.generation.grammar_masks import (
    allows_other,
    apply_bitmask_,
    id_bits,
    new_bitmask,
    unpack_bitmask,
)
from torch_tensorrt_dist.generation.grammar_spec import (
    JSON_OPTIONS,
    GrammarError,
    GrammarSpec,
    after_lark,
    describe,
    literal,
    own_options,
)
from torch_tensorrt_dist.generation.grammar_tokens import memoized

__all__ = [
    "GrammarError",
    "GrammarSpec",
    "Grammars",
    "Matcher",
    "allows_other",
    "apply_bitmask_",
    "id_bits",
    "new_bitmask",
]

T = TypeVar("T")
CACHED_GRAMMARS = 16
"""Specs whose compiled start (or refusal) a :class:`Grammars` keeps: a request that repeats a
schema takes a copy of its start (0.01-1 ms) instead of compiling it again on the step loop of
every rank (0.05-0.4 s for 450 properties to 30,000 choices; 3-7 s before the refusal of
5,000 properties)."""
PROBE_TOKENS = 8
"""Tokens :meth:`Grammars.check` follows a grammar for, on each path, before accepting it."""
PROBE_PATHS = 8
"""Paths :meth:`Grammars.check` follows (each from another first token)."""


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError:
        raise EngineUnavailableError(
            "structured output (response_format, guided_json/regex/choice) needs llguidance: "
            "pip install 'torch_tensorrt_dist[serve]'"
        ) from None
    return llguidance


def _reason(matcher: Any) -> str:
    """The engine's error text, without its marker of a shortened message."""
    return str(matcher.get_error()).removesuffix("<non-verbose/>").strip()


class _ByteVocab:
    """llguidance's view of the byte-level fallback tokenizer: id = byte value; ids from 256
    up decode to nothing, so they are special (never text)."""

    def __init__(self, vocab_size: int, eos: int) -> None:
        self.eos_token_id, self.bos_token_id = eos, None
        self.tokens = [bytes([i]) for i in range(256)] + [b""] * (vocab_size - 256)
        self.special_token_ids = list(range(256, vocab_size))

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


def _fail(what: str, step: int, reason: str | None) -> None:
    """GrammarError when the engine failed (``reason``) after ``step`` tokens of a probe."""
    if reason is not None:
        raise GrammarError(
            f"{what} cannot be followed: the grammar engine fails after {step} token(s) "
            f"({reason}); make it smaller or simpler",
            reason=reason,
        )


class _Recent(Generic[T]):
    """The last ``size`` values put, by key (least recently used out first; thread-safe: the
    HTTP layer's worker threads check grammars at once)."""

    def __init__(self, size: int) -> None:
        self._size, self._items, self._lock = size, OrderedDict[Any, T](), threading.Lock()

    def get(self, key: Any) -> T | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: Any, value: T) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self._size:
                self._items.popitem(last=False)


class Matcher:
    """One request's position in its grammar."""

    def __init__(self, matcher: Any, spec: GrammarSpec, vocab_size: int) -> None:
        self._m, self.spec, self.vocab_size = matcher, spec, vocab_size

    def accept(self, token: int) -> None:
        """Advance by the token just sampled; GrammarError if the grammar refuses it (it
        cannot when the token was sampled under this matcher's mask)."""
        if not self._m.consume_token(token):
            reason = _reason(self._m)
            raise GrammarError(
                f"{describe(self.spec.kind)} refused token {token}: {reason}", reason=reason
            )

    @property
    def is_finished(self) -> bool:
        """The grammar admits no more text: the request is complete."""
        return bool(self._m.is_stopped()) and not self._m.is_error()

    @property
    def error(self) -> str | None:
        """The engine's reason once it has failed (a limit hit mid-way), else None."""
        return _reason(self._m) if self._m.is_error() else None

    def allowed(self) -> Tensor:
        """The tokens the grammar allows next, bool [V] (one row; the core uses bitmasks)."""
        mask = new_bitmask(1, self.vocab_size)
        self._m.unsafe_compute_mask_ptr(mask.data_ptr(), mask.numel() * 4)
        return unpack_bitmask(mask, self.vocab_size)[0]

    def fork(self) -> Matcher:
        """An independent copy at the same position (another choice of the request)."""
        return Matcher(self._m.deep_copy(), self.spec, self.vocab_size)


class Grammars:
    """The grammar engine for one tokenizer (built once per server, on every rank)."""

    def __init__(self, tokenizer: Any, *, vocab_size: int, threads: int = 2) -> None:
        """``tokenizer``: an ``llguidance.LLTokenizer``; prefer :meth:`from_file`,
        :meth:`from_json` and :meth:`for_bytes`. ``threads``: mask computation threads."""
        llg = _llguidance()
        self.vocab_size, self._tok = vocab_size, tokenizer
        self.eos_ids: tuple[int, ...] = ()
        """The end-of-text ids the engine was told (set by the constructors)."""
        self._compiled: _Recent[Matcher | GrammarError] = _Recent(CACHED_GRAMMARS)
        self._checked: _Recent[bool | GrammarError] = _Recent(CACHED_GRAMMARS)
        self._bytes: list[int] | None = None  # one-byte tokens (``_byte_tokens``)
        self._executor = llg.LLExecutor(num_threads=threads)

    @classmethod
    def from_json(
        cls, text: str, *, vocab_size: int, eos_ids: Sequence[int], threads: int = 2
    ) -> Grammars:
        """From a ``tokenizer.json``'s text (byte-level BPE, or with byte fallback)."""
        llg = _llguidance()
        if not eos_ids:
            raise ConfigError(
                "structured output needs the model's end-of-text token id; none is known"
            )
        try:
            tok = llg.LLTokenizer(text, n_vocab=vocab_size, eos_token=list(eos_ids))
        except (ValueError, RuntimeError) as exc:
            raise ConfigError(f"the grammar engine cannot read the tokenizer: {exc}") from None
        out = cls(memoized(tok, vocab_size, eos_ids), vocab_size=vocab_size, threads=threads)
        out.eos_ids = tuple(eos_ids)
        return out

    @classmethod
    def from_file(
        cls, path: str | Path, *, vocab_size: int, eos_ids: Sequence[int], threads: int = 2
    ) -> Grammars:
        return cls.from_json(
            Path(path).read_text(), vocab_size=vocab_size, eos_ids=eos_ids, threads=threads
        )

    @classmethod
    def for_bytes(cls, *, vocab_size: int, eos_ids: Sequence[int], threads: int = 2) -> Grammars:
        """For the byte-level fallback tokenizer (``models.tokenizer.ByteTokenizer``)."""
        llg = _llguidance()
        if vocab_size < 256 or not eos_ids:
            raise ConfigError(
                f"structured output over bytes needs a vocabulary of >= 256 ids and an "
                f"end-of-text id, got {vocab_size} ids and eos {list(eos_ids)}"
            )
        tok = llg.LLTokenizer(
            llg.TokenizerWrapper(_ByteVocab(vocab_size, eos_ids[0])), n_vocab=vocab_size
        )
        out = cls(tok, vocab_size=vocab_size, threads=threads)
        out.eos_ids = (eos_ids[0],)
        return out

    @classmethod
    def for_tokenizer(
        cls, tokenizer: Any, *, vocab_size: int, eos_ids: Sequence[int], threads: int = 2
    ) -> Grammars:
        """For a tokenizer of ``models.tokenizer``: its ``tokenizer.json`` (``HFTokenizer``),
        or the bytes (``ByteTokenizer``)."""
        path = getattr(tokenizer, "path", None)
        if path is not None:
            return cls.from_file(path, vocab_size=vocab_size, eos_ids=eos_ids, threads=threads)
        return cls.for_bytes(vocab_size=vocab_size, eos_ids=eos_ids, threads=threads)

    def check(self, spec: GrammarSpec) -> Matcher:
        """:meth:`compile` ``spec`` and follow it along a few paths of ``PROBE_TOKENS`` tokens
        (:meth:`_probe`), so that
        what the engine would report at the first steps is a GrammarError now, before the
        request joins a step: a grammar no text satisfies (its first mask fails: llguidance's
        ``NoExtensionBias``; it would allow only the end-of-text token, which the grammar
        does not accept) and the engine's size limits (a schema of 5,000 properties compiles,
        then fails at its second token: "Current row has 20007 items; max is 2000").

        A few paths of many: a limit hit only on another path still fails that request when
        it is reached, with the same reason. Returns the matcher at the start. The verdict
        on one of the last ``CACHED_GRAMMARS`` specs is not computed again."""
        verdict = self._checked.get(spec)
        if verdict is None:
            try:
                self._probe(spec)
                verdict = True
            except GrammarError as exc:
                verdict = exc
            self._checked.put(spec, verdict)
        if isinstance(verdict, GrammarError):
            raise GrammarError(str(verdict), reason=verdict.reason)
        return self.compile(spec)

    def _probe(self, spec: GrammarSpec) -> None:
        """Follow ``spec`` from its first mask along up to ``PROBE_PATHS`` paths: the lowest
        allowed id, then each allowed one-byte token of another first byte, punctuation first
        (JSON's ``{``, ``[``, ``"``: the alternatives of an untyped schema start apart), each for
        up to ``PROBE_TOKENS`` tokens by its lowest allowed id."""
        start, what = self.compile(spec), describe(spec.kind)
        end = torch.zeros(self.vocab_size, dtype=torch.bool)
        end[[i for i in self.eos_ids if 0 <= i < self.vocab_size]] = True
        allowed = start.allowed()  # the engine fails here when it fails at a step
        reason = start.error
        if reason is not None and "NoExtensionBias" in reason:
            raise GrammarError(
                f"{what} allows no text: nothing satisfies it ({reason})", reason=reason
            )
        _fail(what, 0, reason)
        firsts = (allowed & ~end).nonzero().flatten().tolist()[:1]
        for token in self._byte_tokens():
            if len(firsts) >= PROBE_PATHS:
                break
            if allowed[token] and token not in firsts:
                firsts.append(token)
        for first in firsts:
            probe = start.fork()
            token = first
            for step in range(1, PROBE_TOKENS + 1):
                try:
                    probe.accept(token)
                except GrammarError as exc:
                    _fail(what, step, exc.reason)
                allowed = probe.allowed()
                _fail(what, step, probe.error)
                nxt = (allowed & ~end).nonzero()
                if probe._m.is_stopped() or not nxt.numel():
                    break
                token = int(nxt[0, 0])

    def _byte_tokens(self) -> list[int]:
        """One token id per byte value that a token spells alone, punctuation first
        (computed once)."""
        if self._bytes is None:
            found: dict[bytes, int] = {}
            for i in range(self.vocab_size):
                try:
                    text = self._tok.decode_bytes([i])
                except (ValueError, RuntimeError, IndexError):  # ids past the tokenizer's
                    continue
                if len(text) == 1 and not self._tok.is_special_token(i):
                    found.setdefault(text, i)
            # punctuation first (JSON's values start apart there), then digits and letters
            self._bytes = [found[b] for b in sorted(found, key=lambda b: (b.isalnum(), b))]
        return self._bytes

    def compile(self, spec: GrammarSpec) -> Matcher:
        """A matcher at the start of ``spec``; GrammarError with the engine's reason. A spec
        compiled before (one of the last ``CACHED_GRAMMARS``) is not compiled again: its start
        is copied (:meth:`Matcher.fork`), or its refusal raised again."""
        found = self._compiled.get(spec)
        if found is None:
            try:
                found = self._compile(spec)
            except GrammarError as exc:
                found = exc
            self._compiled.put(spec, found)
        if isinstance(found, GrammarError):
            raise GrammarError(str(found), reason=found.reason)
        return found.fork()

    def _compile(self, spec: GrammarSpec) -> Matcher:
        llg = _llguidance()
        M = llg.LLMatcher
        try:
            if spec.after:
                grammar = M.grammar_from_lark(after_lark(spec))
            elif spec.kind == "json_object":
                grammar = M.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
            elif spec.kind == "json_schema":
                options = None if own_options(str(spec.value)) else JSON_OPTIONS
                grammar = M.grammar_from_json_schema(spec.value, defaults=options)
            elif spec.kind == "regex":
                grammar = M.grammar_from_regex(spec.value)
            else:
                grammar = M.grammar_from_regex("(" + "|".join(map(literal, spec.value)) + ")")
        except ValueError as exc:  # not JSON, or not a JSON object
            raise GrammarError(
                f"{describe(spec.kind)} cannot be compiled: {exc}", reason=str(exc)
            ) from None
        # verbose_errors off: the reason is the engine's one line, without a dump of its state
        matcher = M(
            self._tok, grammar, log_level=0, limits=llg.LLParserLimits(verbose_errors=False)
        )
        if matcher.is_error():
            reason = _reason(matcher)
            raise GrammarError(f"{describe(spec.kind)} cannot be compiled: {reason}", reason=reason)
        return Matcher(matcher, spec, self.vocab_size)

    def fill_bitmask(
        self, rows: Sequence[tuple[Matcher, int]], bitmask: Tensor, *, parallel: bool = True
    ) -> None:
        """Write each matcher's mask into row ``i`` of ``bitmask`` (int32 [B, W], CPU,
        contiguous: :func:`new_bitmask`) without the GIL: the rows in parallel (the engine's
        threads), or (``parallel`` False) one by one on this thread (:meth:`fill_rows`)."""
        b, w = bitmask.shape
        fits = bitmask.dtype == torch.int32 and bitmask.device.type == "cpu"
        fits = fits and bitmask.is_contiguous() and w == (self.vocab_size + 31) // 32
        if not fits or any(not 0 <= i < b for _, i in rows):
            raise ValueError(
                f"bitmask {tuple(bitmask.shape)} does not fit {self.vocab_size} tokens and rows "
                f"{[i for _, i in rows]}, or is not a contiguous CPU int32 tensor (new_bitmask): "
                f"{bitmask.dtype} on {bitmask.device}"
            )
        self.fill_rows(rows, bitmask.data_ptr(), b, w * 4, parallel=parallel)

    def fill_rows(
        self, rows: Sequence[tuple[Matcher, int]], ptr: int, b: int, size: int, *, parallel: bool
    ) -> None:
        """:meth:`fill_bitmask` unchecked: ``b`` rows of ``size`` bytes at ``ptr``."""
        if parallel and len(rows) > 1:
            self._executor.unsafe_compute_mask_ptr([(m._m, i) for m, i in rows], ptr, size, b)
        else:
            for m, i in rows:
                m._m.unsafe_compute_mask_ptr(ptr + i * size, size)
