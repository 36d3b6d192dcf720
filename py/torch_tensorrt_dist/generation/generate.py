"""``Generator``: the compiled prefill and decode graphs of a model, and ``generate``.

    gen = Generator(model, engine="inductor", max_batch_size=2)
    result = gen.generate([[1, 5, 7], [1, 9]], max_new_tokens=32, stop_ids=(2,))

Two kinds of graph per rank: a prefill per bucket (a prompt right-padded to a power of two,
written into its own KV-cache row from position 0) and one decode graph that runs every row at
its own position. Slots, positions and pads are tensors, so neither recompiles. ``generate`` is
the case of the generation core (``slots.py``) where every prompt joins at once; the server
(``serving/``) puts a request queue in front of the same core. Every rank runs the same loop on
the same logits with the same seeded generators: the ranks agree on every token without a
broadcast.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar, cast

import torch
from torch import Tensor

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.buckets import check_request, slot_bucket, slot_buckets
from torch_tensorrt_dist.generation.sampling import SamplingConfig
from torch_tensorrt_dist.generation.slots import DecodeFn, PrefillFn, Request, Slots
from torch_tensorrt_dist.models.llama import Transformer
from torch_tensorrt_dist.models.tokenizer import Tokenizer

__all__ = [
    "ENGINES",
    "GenerationResult",
    "Generator",
    "compile_step",
    "decode_example",
    "decode_step",
    "prefill_example",
    "prefill_step",
]

logger = logging.getLogger(__name__)

#: ``none`` runs the model as plain PyTorch (no torch.compile); the others go through the
#: ``torch_tensorrt_dist`` Dynamo backend with that engine.
ENGINES = ("tensorrt", "inductor", "eager", "none")

StepFn = Callable[..., Tensor]
F = TypeVar("F", bound=StepFn)


def prefill_step(model: Transformer) -> PrefillFn:
    """``(tokens [1, S_bucket], slot [1], last [1]) -> logits [1, V]``: one prompt into its
    KV-cache row (one graph per bucket)."""

    def prefill(tokens: Tensor, slot: Tensor, last: Tensor) -> Tensor:
        return model.prefill_slot(tokens, slot, last)

    return prefill


def decode_step(model: Transformer) -> DecodeFn:
    """``(tokens [B, 1], pos [B]) -> logits [B, V]``: every row at its own position; one graph
    for every step."""

    def decode(tokens: Tensor, pos: Tensor) -> Tensor:
        return model.decode_rows(tokens, pos)

    return decode


def decode_example(batch: int, slot: int = 8) -> tuple[Tensor, Tensor]:
    """Example inputs of a decode step writing KV slot ``slot`` of every row (for explain and
    benchmarks)."""
    return torch.zeros(batch, 1, dtype=torch.long), torch.full((batch,), slot, dtype=torch.long)


def prefill_example(length: int, slot: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """Example inputs of a prefill of bucket ``length`` into row ``slot``."""
    return (
        torch.zeros(1, length, dtype=torch.long),
        torch.tensor([slot]),
        torch.tensor([length - 1]),
    )


def compile_step(fn: F, engine: str, *, verify: bool | None = None) -> F:
    """``fn`` compiled as one static-shape graph per rank by the given engine.

    ``verify``: check the first call of each graph against its eager reference (the
    backend's ``verify`` option; ``None``: on for ``tensorrt`` only).
    """
    if engine not in ENGINES:
        raise ConfigError(f"engine={engine!r} is not one of {', '.join(ENGINES)}")
    if engine == "none":
        return fn
    import torch_tensorrt_dist.backend  # noqa: F401  (registers the backend)

    compiled = torch.compile(
        fn,
        backend="torch_tensorrt_dist",
        options={"engine": engine} if verify is None else {"engine": engine, "verify": verify},
        fullgraph=True,
        dynamic=False,
    )
    return cast(F, compiled)


@dataclass
class GenerationResult:
    """Generated ids per prompt (a stop token, when hit, is the last id) and timings."""

    tokens: list[list[int]]
    ttft_s: float
    """Prompts in to first tokens out (the prefills + first samples)."""
    decode_s: float
    decode_steps: int
    prefill_len: int
    """The longest prefill bucket of the prompts."""
    stopped: list[bool] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        """Decode tokens per second per sequence (steps / decode time)."""
        return self.decode_steps / self.decode_s if self.decode_s > 0 else 0.0


class Generator:
    """Compiles a model's prefill and decode graphs over caches it sets up, and generates."""

    def __init__(
        self,
        model: Transformer,
        *,
        engine: str = "none",
        max_batch_size: int = 1,
        cache_len: int | None = None,
        verify: bool | None = None,
    ) -> None:
        self.model = model
        self.args = model.args
        self.engine = engine
        self.max_batch_size = max_batch_size
        self.cache_len = cache_len or model.args.max_seq_len
        model.setup_caches(max_batch_size, self.cache_len)
        self.device = model.tok_embeddings.weight.device

        if engine != "none":  # one prefill graph per bucket: let Dynamo keep them all
            limit = torch._dynamo.config.recompile_limit
            torch._dynamo.config.recompile_limit = max(limit, len(self.buckets()) + 1)
        self._prefill: PrefillFn = compile_step(prefill_step(model), engine, verify=verify)
        self._decode: DecodeFn = compile_step(decode_step(model), engine, verify=verify)

    def bucket(self, prompt_len: int) -> int:
        """The prefill length of a ``prompt_len``-token prompt."""
        return slot_bucket(prompt_len, self.cache_len)

    def buckets(self) -> list[int]:
        """Every prefill length this generator may run (one graph each)."""
        return slot_buckets(self.cache_len)

    def check(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> int:
        """Validate a request; return its longest prefill bucket (the same on every rank)."""
        check_request(
            prompts,
            max_new_tokens,
            max_batch_size=self.max_batch_size,
            vocab_size=self.args.vocab_size,
            cache_len=self.cache_len,
        )
        return max(self.bucket(len(p)) for p in prompts)

    def slots(self, *, tokenizer: Tokenizer | None = None, text: bool = False) -> Slots:
        """The generation core over this generator's graphs and KV cache (all rows free)."""
        return Slots(
            self._prefill,
            self._decode,
            rows=self.max_batch_size,
            cache_len=self.cache_len,
            bucket=self.bucket,
            device=self.device,
            tokenizer=tokenizer,
            text=text,
        )

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        sampling: SamplingConfig | None = None,
        stop_ids: Sequence[int] = (),
        on_step: Callable[[list[int]], None] | None = None,
    ) -> GenerationResult:
        """Generate up to ``max_new_tokens`` per prompt; ``on_step`` gets each step's tokens
        (one per prompt; a finished prompt repeats its last id).

        Each prompt samples from its own generator seeded with ``sampling.seed``: a prompt
        gets the same tokens alone or in a batch.
        """
        bucket = self.check(prompts, max_new_tokens)
        return self._run(
            prompts, bucket, max_new_tokens, sampling or SamplingConfig(), stop_ids, on_step
        )

    def _run(
        self,
        prompts: Sequence[Sequence[int]],
        bucket: int,
        max_new_tokens: int,
        sampling: SamplingConfig,
        stop_ids: Sequence[int],
        on_step: Callable[[list[int]], None] | None,
    ) -> GenerationResult:
        slots = self.slots()
        out: list[list[int]] = [[] for _ in prompts]
        start = time.perf_counter()
        for i, ids in enumerate(prompts):
            req = Request(i, tuple(ids), max_new_tokens, sampling, tuple(stop_ids))
            out[i] += slots.join(req, slot=i).tokens
        ttft = time.perf_counter() - start
        if on_step is not None:
            on_step([row[-1] for row in out])
        steps = 0
        decode_start = time.perf_counter()
        while slots.active:
            for e in slots.decode():
                out[e.rid] += e.tokens
            steps += 1
            if on_step is not None:
                on_step([row[-1] for row in out])
        decode_s = time.perf_counter() - decode_start
        stops = set(stop_ids)
        return GenerationResult(
            tokens=out,
            ttft_s=ttft,
            decode_s=decode_s,
            decode_steps=steps,
            prefill_len=bucket,
            stopped=[bool(row and row[-1] in stops) for row in out],
        )

    def warmup(self, prompt_len: int, max_new_tokens: int, batch_size: int = 1) -> float:
        """Compile the prefill graph of this length's bucket and the decode graph; return s."""
        start = time.perf_counter()
        prompts = [[0] * prompt_len] * batch_size
        bucket = self.check(prompts, max_new_tokens)
        self._run(prompts, bucket, min(2, max_new_tokens), SamplingConfig(), (), None)
        return time.perf_counter() - start

    def warmup_all(self, *, stop: Callable[[], bool] | None = None) -> float:
        """Compile every prefill bucket and the decode graph (a server's warm-up); return s.
        ``stop()`` is asked before each graph: True ends the warm-up there (a server stopped
        while warming up; every rank must get the same answer, as each graph's collectives
        need every rank)."""
        start = time.perf_counter()
        runs = [(min(b, self.cache_len - 1), 1) for b in self.buckets()] + [(1, 2)]
        for n, new in runs:
            if stop is not None and stop():
                break
            self._run([[0] * n], self.bucket(n), new, SamplingConfig(), (), None)
        return time.perf_counter() - start
