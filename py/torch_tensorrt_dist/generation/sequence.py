"""A request's state in the generation core, and what the core gives back for it.

:class:`Sequence` is one request on one rank: its tokens, its blocks, how many of them hold
computed K/V, its sampling state and its speculation state; ranks that apply the same plans
hold equal sequences. :class:`Emitted` is what a request produced in one step,
:class:`RowError` why one failed (per-request isolation, ``core.py``), :class:`CoreError` a
plan this rank cannot apply.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_tensorrt_dist.errors import TensorRTDistError
from torch_tensorrt_dist.generation.grammar import Grammars
from torch_tensorrt_dist.generation.kv_blocks import next_key
from torch_tensorrt_dist.generation.logits_process import TokenLogprobs
from torch_tensorrt_dist.generation.plan import Request
from torch_tensorrt_dist.generation.sampler import RowSampling
from torch_tensorrt_dist.generation.speculative.config import SpeculativeConfig
from torch_tensorrt_dist.generation.speculative.state import RowSpeculation
from torch_tensorrt_dist.generation.stops import StopText

__all__ = ["CoreError", "Emitted", "RowError", "Sequence", "render_text", "row_error"]


class CoreError(TensorRTDistError):
    """A plan this rank cannot apply as rank 0 planned it (the ranks' states differ: a bug)."""


@dataclass(frozen=True)
class RowError:
    """Why one request failed (``Emitted.finish == "error"``): the stage (``join``: its grammar
    did not compile; ``sampling``; ``processing``: its logits settings; ``grammar``: its
    grammar refused or failed; ``masked``: no token was left to draw; ``text``) and the
    exception in one line."""

    stage: str
    message: str


def row_error(stage: str, exc: BaseException) -> RowError:
    text = str(exc).strip().splitlines()
    return RowError(stage, f"{type(exc).__name__}: {text[0] if text else ''}"[:300])


@dataclass
class Emitted:
    """What one request produced in one step: new ids, new text, and how it ended."""

    rid: int
    tokens: list[int]
    text: str = ""
    """New text (only where the core was built with ``text=True``)."""
    finish: str | None = None
    """``stop`` (stop id or string), ``length``, ``cancelled``, ``error``; None while it runs."""
    cached: int = 0
    """Prompt tokens taken from the prefix cache (on a request's first emission)."""
    error: RowError | None = None
    """Why it failed (``finish == "error"``, only with ``GenerationCore.isolate``)."""
    logprobs: TokenLogprobs | None = None
    """The token's logprob and the most likely alternatives (``SamplingConfig.logprobs``)."""


class Sequence:
    """A request's state on this rank: its tokens, blocks and sampling state."""

    def __init__(
        self,
        req: Request,
        text: StopText | None,
        grammars: Grammars | None,
        speculative: SpeculativeConfig | None = None,
    ) -> None:
        self.req, self.rid, self.text = req, req.rid, text
        self.tokens: list[int] = list(req.prompt)
        """The prompt, then every token produced (the last one's K/V is not computed yet)."""
        self.out: list[int] = []
        self.blocks: list[int] = []
        self.keys: list[bytes] = []
        """Prefix-cache keys of the full blocks committed so far."""
        self.computed = 0
        """Tokens whose K/V are in ``blocks``."""
        self.cached = 0
        self.sampling = RowSampling(req, grammars)
        """Generator, penalty state, grammar matcher: kept across preemption."""
        self.spec = None if speculative is None else RowSpeculation(speculative.num_tokens)
        """Adaptive k of speculative decoding (None: the core does not speculate)."""
        self.proposal: tuple[int, int, list[int]] | None = None
        """The last proposal (tokens then, k, proposed tokens): every rank asks it again."""

    def advance(self, token: int, complete: bool) -> tuple[str | None, str]:
        """Append the produced ``token``: its finish (``stop``: a stop id, a stop string, or
        ``complete``: the grammar admits nothing more; ``length``; None: it goes on) and,
        where stop strings decide the finish, the new text."""
        self.out.append(token)
        self.tokens.append(token)
        req, piece, hit = self.req, "", False
        shown = token not in req.stop_ids
        if self.text is not None and req.stop and shown:  # stop strings decide the finish: now
            piece, hit = self.text.push(token)
        finish = None
        if hit or not shown or complete:
            finish = "stop"
        elif len(self.out) >= req.max_new_tokens:
            finish = "length"
        if self.text is not None and req.stop and finish is not None and not hit:
            # what was held back for a stop string, or held inside a character: it can hold one
            rest, hit = self.text.flush()
            piece += rest
            finish = "stop" if hit else finish
        return finish, piece

    def new_keys(self, block_size: int, salt: bytes) -> list[tuple[int, bytes]]:
        """The prefix-cache keys of the blocks that filled since the last call (appended to
        ``keys``), with their block ids."""
        out, bs = [], block_size
        while (len(self.keys) + 1) * bs <= self.computed:
            i = len(self.keys)
            prev = self.keys[-1] if self.keys else None
            self.keys.append(next_key(prev, self.tokens[i * bs : (i + 1) * bs], salt=salt))
            out.append((self.blocks[i], self.keys[-1]))
        return out

    @property
    def to_compute(self) -> int:
        return len(self.tokens) - self.computed

    @property
    def decoding(self) -> bool:
        """The prompt is computed: the next row is the last token alone."""
        return bool(self.out) and self.to_compute == 1


def render_text(emitted: Emitted, text: StopText, token: int | None, isolate: bool) -> None:
    """Fill in ``emitted.text`` with ``token``'s text (None: a stop id, no text) and, where it
    finished, what ``text`` held back; with ``isolate`` an exception marks it failed."""
    try:
        piece = text.push(token)[0] if token is not None else ""
        if emitted.finish is not None:
            piece += text.flush()[0]  # bytes that never completed a character
    except MemoryError:
        raise
    except Exception as exc:
        if not isolate:
            raise
        # this rank alone shows text: the request stays, the caller cancels it everywhere
        emitted.finish, emitted.error, piece = "error", row_error("text", exc), ""
    emitted.text = piece
