"""The generation core: KV-cache rows are slots; one step function for ``generate`` and ``serve``.

    slots = Slots(prefill, decode, rows=8, cache_len=256, bucket=gen.bucket, device=dev)
    first = slots.join(Request(rid=0, prompt=(1, 5, 7), max_new_tokens=32), slot=0)
    emitted = slots.decode()          # one new token for every running row
    slots.cancel(0)                   # frees the slot at once

A request owns one slot (cache row) from its prefill to its last token. ``join`` runs the
bucketed prefill graph, which writes the prompt into that row from position 0, and samples the
first token; ``decode`` runs the one decode graph over every row, each at its own position
(free rows are padding), so its shapes never change. A row leaves on a stop id, a stop string
or ``max_new_tokens``, and its slot is free for the next join at once.

Everything here is a function of the joins, cancels and logits only, with a generator per
request seeded from its :class:`SamplingConfig`: ranks that apply the same joins and cancels in
the same order hold the same rows and sample the same tokens, without communicating.

Per-request isolation (``slots.isolate = True``, a server): an exception while sampling a row's
token or producing the text that decides its finish (stop strings) fails that request only:
its slot is freed and it emits ``finish="error"`` with a :class:`RowError`; the same inputs give
the same exception on every rank, so every rank frees the same row. Text that only shows
(``render``, rank 0 alone) marks its request failed without freeing the row: the caller must
cancel it on every rank (the server's leader does, at the next step).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.sampling import SamplingConfig, make_generator, sample
from torch_tensorrt_dist.generation.stops import StopText
from torch_tensorrt_dist.models.tokenizer import Tokenizer

__all__ = ["DecodeFn", "Emitted", "PrefillFn", "Request", "RowError", "Slots"]

#: ``(tokens [1, S], slot [1], last [1]) -> logits [1, V]`` (``Transformer.prefill_slot``)
PrefillFn = Callable[[Tensor, Tensor, Tensor], Tensor]
#: ``(tokens [B, 1], pos [B]) -> logits [B, V]`` (``Transformer.decode_rows``)
DecodeFn = Callable[[Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class Request:
    """What every rank must know about a request to run it (rank 0 sends it on join)."""

    rid: int
    prompt: tuple[int, ...]
    max_new_tokens: int
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    stop_ids: tuple[int, ...] = ()
    """Token ids that end the request (shown in ``tokens``, never in ``text``)."""
    stop: tuple[str, ...] = ()
    """Stop strings, matched on the decoded text (needs a tokenizer on every rank)."""


@dataclass(frozen=True)
class RowError:
    """Why one request failed (``Emitted.finish == "error"``): the stage, ``sampling`` or
    ``text``, and the exception in one line."""

    stage: str
    message: str


@dataclass
class Emitted:
    """What one request produced in one call: new ids, new text, and how it ended."""

    rid: int
    tokens: list[int]
    text: str = ""
    """New text (only where :class:`Slots` was built with ``text=True``)."""
    finish: str | None = None
    """``stop`` (stop id or string), ``length``, ``cancelled``, ``error``; None while it runs."""
    error: RowError | None = None
    """Why it failed (``finish == "error"``, only with ``Slots.isolate``)."""


class _Row:
    def __init__(self, req: Request, slot: int, text: StopText | None) -> None:
        self.req, self.slot, self.text = req, slot, text
        self.out: list[int] = []
        self.pos = len(req.prompt)  # where the next token's K/V is written
        self.gen = make_generator(req.sampling)


class Slots:
    """The rows of one KV cache and the prefill/decode graphs that run them."""

    def __init__(
        self,
        prefill: PrefillFn,
        decode: DecodeFn,
        *,
        rows: int,
        cache_len: int,
        bucket: Callable[[int], int],
        device: torch.device | str = "cpu",
        tokenizer: Tokenizer | None = None,
        text: bool = False,
    ) -> None:
        """``bucket(n)``: the prefill length of an n-token prompt (a compiled bucket).
        ``text``: produce each request's text (rank 0 of a server); without it, text is only
        decoded for requests with stop strings."""
        if text and tokenizer is None:
            raise ConfigError("Slots(text=True) needs a tokenizer")
        self._prefill, self._decode, self._bucket = prefill, decode, bucket
        self.rows, self.cache_len, self.device = rows, cache_len, torch.device(device)
        self.tokenizer, self.text = tokenizer, text
        #: leave the text of requests without stop strings (which only shows it, and decides
        #: nothing) to :meth:`render`, so a server can announce its next step first
        self.defer_text = False
        #: per-request isolation (see the module docstring): a server sets it on every rank
        self.isolate = False
        self._unrendered: list[tuple[Emitted, StopText, int | None]] = []
        self._by_slot: list[_Row | None] = [None] * rows
        self._by_rid: dict[int, _Row] = {}

    @property
    def active(self) -> int:
        """Rows running a request."""
        return len(self._by_rid)

    def free_slots(self) -> list[int]:
        return [s for s, row in enumerate(self._by_slot) if row is None]

    def running(self) -> list[int]:
        """Request ids of the running rows, by slot."""
        return [row.req.rid for row in self._by_slot if row is not None]

    def check(self, req: Request) -> int:
        """Validate a request against the cache; return its prefill length."""
        n = len(req.prompt)
        if n < 1:
            raise ConfigError("a prompt is empty; give at least one token of text")
        if req.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {req.max_new_tokens}")
        if n + req.max_new_tokens > self.cache_len:
            raise ConfigError(
                f"prompt ({n} tokens) + max_new_tokens ({req.max_new_tokens}) = "
                f"{n + req.max_new_tokens} exceeds the KV cache length {self.cache_len}; use "
                f"max_new_tokens <= {self.cache_len - n}"
            )
        if req.stop and self.tokenizer is None:
            raise ConfigError("stop strings need the model's tokenizer; none was given")
        return self._bucket(n)

    @torch.no_grad()
    def join(self, req: Request, slot: int) -> Emitted:
        """Prefill ``req`` into the free ``slot`` and sample its first token."""
        bucket = self.check(req)
        if not 0 <= slot < self.rows or self._by_slot[slot] is not None:
            raise ConfigError(f"slot {slot} is not free (free: {self.free_slots()})")
        if req.rid in self._by_rid:
            raise ConfigError(f"request {req.rid} is already running")
        n = len(req.prompt)
        tokens = torch.zeros(1, bucket, dtype=torch.long)
        tokens[0, :n] = torch.tensor(req.prompt, dtype=torch.long)
        dev = self.device
        logits = self._prefill(
            tokens.to(dev), torch.tensor([slot], device=dev), torch.tensor([n - 1], device=dev)
        )  # [1, V]
        needs_text = self.text or bool(req.stop)
        row = _Row(req, slot, StopText(self.tokenizer, req.stop) if needs_text else None)  # type: ignore[arg-type]
        self._by_slot[slot], self._by_rid[req.rid] = row, row
        return self._next(row, logits, None)

    def cancel(self, rid: int) -> Emitted | None:
        """Free the slot of a running request (None when it is not running)."""
        row = self._by_rid.get(rid)
        if row is None:
            return None
        self._free(row)
        return Emitted(rid, [], "", "cancelled")

    @torch.no_grad()
    def decode(self) -> list[Emitted]:
        """One decode step of every running row; returns what each produced."""
        running = [row for row in self._by_slot if row is not None]
        if not running:
            return []
        tokens = [0] * self.rows
        pos = [0] * self.rows
        for row in running:
            tokens[row.slot], pos[row.slot] = row.out[-1], row.pos
        dev = self.device
        logits = self._decode(
            torch.tensor(tokens, device=dev)[:, None], torch.tensor(pos, device=dev)
        )  # [B, V]
        greedy = logits.argmax(dim=-1).tolist()  # one device sync for the whole batch
        emitted = []
        for row in running:
            row.pos += 1
            pick = greedy[row.slot] if row.req.sampling.greedy else None
            emitted.append(self._next(row, logits[row.slot : row.slot + 1], pick))
        return emitted

    def _next(self, row: _Row, logits: Tensor, greedy: int | None) -> Emitted:
        """Sample the row's next token from ``logits`` [1, V] (``greedy``: it is known) and
        advance the row; with ``isolate``, an exception fails this request only."""
        stage = "sampling"
        try:
            token = (
                greedy if greedy is not None else int(sample(logits, row.req.sampling, row.gen)[0])
            )
            stage = "text"
            return self._advance(row, token)
        except MemoryError:
            raise  # not the request's doing: the rank fails
        except Exception as exc:  # the same inputs raise the same on every rank
            if not self.isolate:
                raise
            if self._by_rid.get(row.req.rid) is row:
                self._free(row)
            return Emitted(row.req.rid, [], "", "error", _row_error(stage, exc))

    def _advance(self, row: _Row, token: int) -> Emitted:
        row.out.append(token)
        req, piece, hit = row.req, "", False
        shown = token not in req.stop_ids
        if row.text is not None and req.stop and shown:  # stop strings decide the finish: now
            piece, hit = row.text.push(token)
        finish = None
        if hit or not shown:
            finish = "stop"
        elif len(row.out) >= req.max_new_tokens:
            finish = "length"
        if row.text is not None and req.stop and finish is not None and not hit:
            # what was held back for a stop string, or held inside a character: it can hold one
            rest, hit = row.text.flush()
            piece += rest
            finish = "stop" if hit else finish
        emitted = Emitted(req.rid, [token], "", finish)
        if row.text is not None and req.stop:
            emitted.text = piece if self.text else ""
        elif row.text is not None:  # text only to show it: now, or at render()
            job = (emitted, row.text, token if shown else None)
            if self.defer_text:
                self._unrendered.append(job)
            else:
                self._render(job, self.isolate)
        if finish is not None:
            self._free(row)
        return emitted

    def render(self) -> None:
        """Fill in the text of what was emitted since the last call (``defer_text``)."""
        for job in self._unrendered:
            self._render(job, self.isolate)
        self._unrendered.clear()

    @staticmethod
    def _render(job: tuple[Emitted, StopText, int | None], isolate: bool) -> None:
        emitted, text, token = job
        try:
            piece = text.push(token)[0] if token is not None else ""
            if emitted.finish is not None:
                piece += text.flush()[0]  # bytes that never completed a character
        except MemoryError:
            raise
        except Exception as exc:
            if not isolate:
                raise
            # this rank alone shows text: the row stays, the caller cancels it everywhere
            emitted.finish, emitted.error, piece = "error", _row_error("text", exc), ""
        emitted.text = piece

    def _free(self, row: _Row) -> None:
        self._by_slot[row.slot] = None
        del self._by_rid[row.req.rid]


def _row_error(stage: str, exc: BaseException) -> RowError:
    text = str(exc).strip().splitlines()
    return RowError(stage, f"{type(exc).__name__}: {text[0] if text else ''}"[:300])
