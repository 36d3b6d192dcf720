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
- Per step, the mask of a row depends only on its tokens so far, known before the step's graph
  runs: submit :meth:`Grammars.fill_bitmask` to a :class:`MaskFiller` (a worker thread;
  llguidance releases the GIL while it computes) just before launching the graph, and wait
  for it after. Then :func:`apply_bitmask_` on the float32 copy of the logits, *outside* the
  compiled graph (so it works with every engine, TensorRT included), before the logprobs and
  :mod:`.logits_process` (vLLM's order).
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
stays possible; a model cannot loop on whitespace).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch
from torch import Tensor

from torch_tensorrt_dist.errors import ConfigError, EngineUnavailableError

__all__ = [
    "GrammarError",
    "GrammarSpec",
    "Grammars",
    "MaskFiller",
    "Matcher",
    "allows_other",
    "apply_bitmask_",
    "id_bits",
    "new_bitmask",
]

T = TypeVar("T")
KINDS = ("json_object", "json_schema", "regex", "choice")
CACHED_GRAMMARS = 16
"""Specs whose compiled start (or refusal) a :class:`Grammars` keeps: a request that repeats a
schema takes a copy of its start (0.01-1 ms) instead of compiling it again on the step loop of
every rank (0.05-0.4 s for 450 properties to 30,000 choices; 3-7 s before the refusal of
5,000 properties)."""
PROBE_TOKENS = 8
"""Tokens :meth:`Grammars.check` follows a grammar for, on each path, before a request is
accepted."""
PROBE_PATHS = 8
"""Paths :meth:`Grammars.check` follows (each from another first token)."""
JSON_OPTIONS = {"whitespace_pattern": r"[\x20\x0A\x0D\x09]{0,16}"}
"""llguidance's JSON compile options: whitespace between tokens, bounded (see above)."""
_REGEX_META = set("\\.+*?()|[]{}^$#&-~")
_WHAT = {
    "json_object": "the JSON object grammar",
    "json_schema": "the JSON schema",
    "regex": "the regex",
    "choice": "the choice list",
}


class GrammarError(ConfigError):
    """A grammar the engine cannot compile or follow; ``reason`` is the engine's own text."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class GrammarSpec:
    """What a request's output must match, as every rank receives it (:meth:`to_json`)."""

    kind: str
    """``json_object`` (any JSON object: OpenAI's json mode), ``json_schema``, ``regex`` or
    ``choice`` (exactly one of the strings: vLLM's ``guided_choice``)."""
    value: str | tuple[str, ...] = ""
    """The schema as JSON text, the regex, or the choices; empty for ``json_object``."""
    after: str = ""
    """Where the grammar starts: any text may come first, up to and including the first
    ``after`` (a reasoning model's ``</think>``); "": from the first token."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"grammar kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.kind == "choice":
            choices = self.value
            if isinstance(choices, str) or not isinstance(choices, Sequence) or not choices:
                raise ConfigError(
                    f"guided_choice must be a non-empty list of strings, got {choices!r}"
                )
            bad = [c for c in choices if not isinstance(c, str)]
            if bad:
                raise ConfigError(f"guided_choice must hold strings only, got {bad[0]!r}")
            object.__setattr__(self, "value", tuple(choices))
        elif not isinstance(self.value, str):
            raise ConfigError(f"a {self.kind} grammar is text, got {self.value!r}")

    @classmethod
    def json_object(cls) -> GrammarSpec:
        return cls("json_object")

    @classmethod
    def json_schema(cls, schema: Any) -> GrammarSpec:
        """``schema``: a JSON schema as a dict (or bool) or as JSON text. The order of its
        ``properties`` is the order the output gives them in (llguidance), so it is kept."""
        if isinstance(schema, str):
            return cls("json_schema", schema)
        try:
            return cls("json_schema", json.dumps(schema, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise GrammarError(f"the JSON schema is not JSON: {exc}", reason=str(exc)) from None

    @classmethod
    def regex(cls, pattern: str) -> GrammarSpec:
        return cls("regex", pattern)

    @classmethod
    def choice(cls, choices: Sequence[str]) -> GrammarSpec:
        return cls("choice", choices if isinstance(choices, str) else tuple(choices))

    def to_json(self) -> dict[str, Any]:
        value = list(self.value) if isinstance(self.value, tuple) else self.value
        return {"kind": self.kind, "value": value, "after": self.after}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GrammarSpec:
        value = data.get("value", "")
        value = tuple(value) if isinstance(value, list) else value
        return cls(data["kind"], value, after=data.get("after", ""))


def _literal(text: str) -> str:
    """``text`` as a regex that matches exactly it (Rust ``regex`` escapes)."""
    return "".join("\\" + c if c in _REGEX_META else c for c in text)


def _after_lark(spec: GrammarSpec) -> str:
    """``spec`` as a Lark grammar (llguidance's dialect) that any text up to and including the
    first ``spec.after`` precedes (a lazy lexeme: it ends at the first match)."""
    if spec.kind == "json_object" or spec.kind == "json_schema":
        text = "{}" if spec.kind == "json_object" else str(spec.value)
        schema: Any = {"type": "object"} if spec.kind == "json_object" else json.loads(text)
        if schema is True:
            schema = {}
        if isinstance(schema, dict):  # its own x-guidance options win (``_own_options``)
            schema = {"x-guidance": JSON_OPTIONS, **schema}
        body = "%json " + json.dumps(schema)
    elif spec.kind == "regex":
        body = "/" + str(spec.value).replace("/", "\\/") + "/"
    else:
        body = " | ".join(json.dumps(c, ensure_ascii=False) for c in spec.value)
    prefix = _literal(spec.after).replace("/", "\\/")
    return f"start: prefix body\nprefix[lazy]: /(?s:.*){prefix}/\nbody: {body}\n"


def _own_options(schema: str) -> bool:
    """Whether a schema sets llguidance's JSON options itself (a top-level ``x-guidance``,
    as the tool-call grammars do: ``serving/tools/forced.py``)."""
    try:
        value = json.loads(schema)
    except ValueError:
        return False  # the engine says why
    return isinstance(value, dict) and "x-guidance" in value


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
                f"{_WHAT[self.spec.kind]} refused token {token}: {reason}", reason=reason
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
        """From the text of a ``tokenizers`` ``tokenizer.json`` (byte-level BPE, or
        SentencePiece-style with byte fallback)."""
        llg = _llguidance()
        if not eos_ids:
            raise ConfigError(
                "structured output needs the model's end-of-text token id; none is known"
            )
        try:
            tok = llg.LLTokenizer(text, n_vocab=vocab_size, eos_token=list(eos_ids))
        except (ValueError, RuntimeError) as exc:
            raise ConfigError(f"the grammar engine cannot read the tokenizer: {exc}") from None
        out = cls(tok, vocab_size=vocab_size, threads=threads)
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
        start, what = self.compile(spec), _WHAT[spec.kind]
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
                grammar = M.grammar_from_lark(_after_lark(spec))
            elif spec.kind == "json_object":
                grammar = M.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
            elif spec.kind == "json_schema":
                options = None if _own_options(str(spec.value)) else JSON_OPTIONS
                grammar = M.grammar_from_json_schema(spec.value, defaults=options)
            elif spec.kind == "regex":
                grammar = M.grammar_from_regex(spec.value)
            else:
                grammar = M.grammar_from_regex("(" + "|".join(map(_literal, spec.value)) + ")")
        except ValueError as exc:  # not JSON, or not a JSON object
            raise GrammarError(
                f"{_WHAT[spec.kind]} cannot be compiled: {exc}", reason=str(exc)
            ) from None
        # verbose_errors off: the reason is the engine's one line, without a dump of its state
        matcher = M(
            self._tok, grammar, log_level=0, limits=llg.LLParserLimits(verbose_errors=False)
        )
        if matcher.is_error():
            reason = _reason(matcher)
            raise GrammarError(f"{_WHAT[spec.kind]} cannot be compiled: {reason}", reason=reason)
        return Matcher(matcher, spec, self.vocab_size)

    def fill_bitmask(self, rows: Sequence[tuple[Matcher, int]], bitmask: Tensor) -> None:
        """Write each matcher's mask into row ``i`` of ``bitmask`` (int32 [B, W], CPU,
        contiguous: :func:`new_bitmask`), the rows in parallel without the GIL."""
        if (
            bitmask.dtype != torch.int32
            or bitmask.device.type != "cpu"
            or not bitmask.is_contiguous()
        ):
            raise ValueError(
                "the bitmask must be a contiguous CPU int32 tensor (new_bitmask), got "
                f"{bitmask.dtype} on {bitmask.device}"
            )
        b, w = bitmask.shape
        if w != (self.vocab_size + 31) // 32 or any(not 0 <= i < b for _, i in rows):
            raise ValueError(
                f"bitmask {tuple(bitmask.shape)} does not fit {self.vocab_size} tokens and "
                f"rows {[i for _, i in rows]}"
            )
        if rows:
            self._executor.unsafe_compute_mask_ptr(
                [(m._m, i) for m, i in rows], bitmask.data_ptr(), w * 4, b
            )


class MaskFiller:
    """Computes a step's masks in a worker thread, so the core can run its graph meanwhile.
    No matcher of the step may be advanced (:meth:`Matcher.accept`) before ``.result()``."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-mask")

    def submit(
        self, grammars: Grammars, rows: Sequence[tuple[Matcher, int]], bitmask: Tensor
    ) -> Future[None]:
        """Start :meth:`Grammars.fill_bitmask`; ``.result()`` waits (and raises its error)."""
        return self._pool.submit(grammars.fill_bitmask, list(rows), bitmask)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def id_bits(ids: Sequence[int], vocab_size: int) -> Tensor:
    """A bitmask row int32 [ceil(V / 32)] with the bits of ``ids`` set, and those past the
    vocabulary (the last word's padding)."""
    words = (vocab_size + 31) // 32
    bits = torch.zeros(words * 32, dtype=torch.bool)
    bits[[i for i in ids if 0 <= i < vocab_size]] = True
    bits[vocab_size:] = True
    weights = torch.tensor([1 << k for k in range(31)] + [-(1 << 31)], dtype=torch.int64)
    return (bits.view(words, 32).long() * weights).sum(-1).to(torch.int32)


def allows_other(mask_row: Tensor, bits: Tensor) -> bool:
    """Whether bitmask row ``mask_row`` int32 [W] allows a token outside ``bits``
    (:func:`id_bits`)."""
    return bool((mask_row & ~bits).any())


def new_bitmask(rows: int, vocab_size: int) -> Tensor:
    """An all-allowed bitmask int32 [rows, ceil(V / 32)]: token t is bit t % 32 of word t // 32."""
    return torch.full((rows, (vocab_size + 31) // 32), -1, dtype=torch.int32)


#: _BITS[b, k]: bit k of byte b (the bitmask read as bytes is little-endian: token t is bit
#: t % 8 of byte t // 8)
_BITS = (torch.arange(256)[:, None] >> torch.arange(8)) & 1 == 1  # [256, 8] bool


def unpack_bitmask(bitmask: Tensor, vocab_size: int) -> Tensor:
    """int32 [B, W] -> bool [B, V]: which tokens each row allows."""
    as_bytes = bitmask.contiguous().view(torch.uint8).long()  # [B, 4W]
    return _BITS[as_bytes].reshape(bitmask.shape[0], -1)[:, :vocab_size]


#: _FORBID[b, k]: what token bit k of byte b adds to its logit: 0 (allowed) or -inf
_FORBID = torch.where(_BITS, 0.0, float("-inf")).to(torch.float32)  # [256, 8]


def apply_bitmask_(logits: Tensor, bitmask: Tensor, rows: Sequence[int] | None = None) -> None:
    """Set to -inf, in place, the logits of the tokens row ``i`` of ``bitmask`` forbids, for
    each ``i`` in ``rows`` (the rows of float32 ``logits`` [B, V] with a grammar; None: every
    row, ``bitmask`` [B, W] row for row: a row without a grammar is all ones, which adds 0).

    One table lookup per mask byte and one add (x + 0 is x; x - inf is -inf): ten times
    faster on a CPU than unpacking bits into a bool mask and ``masked_fill``. Every row at
    once is one ``add_``; no list indexing and no ``index_add_``, whose CPU kernels go
    parallel even at 8 x 1,024 and wait on a busy core for milliseconds (median 16 us, mean
    1.9-10 ms at load 14 on 2 cores, against 3 us for ``add_``)."""
    if rows is not None and not len(rows):
        return
    dev, v = logits.device, logits.shape[1]
    table = _FORBID if dev.type == "cpu" else _FORBID.to(dev)
    if rows is None:
        n = logits.shape[0]
        as_bytes = bitmask.contiguous().view(torch.uint8).flatten()
        logits.add_(table.index_select(0, as_bytes.to(dev).long()).view(n, -1)[:, :v])
        return
    for i in rows:
        as_bytes = bitmask[i].contiguous().view(torch.uint8)
        logits[i].add_(table.index_select(0, as_bytes.to(dev).long()).view(-1)[:v])
