"""The generation loop: a compiled prefill graph per bucket, one compiled decode graph.

    gen = Generator(model, engine="inductor", max_batch_size=2)
    result = gen.generate([[1, 5, 7], [1, 9]], max_new_tokens=32, stop_ids=(2,))

Prompts are left-padded to a bucket length (``buckets.py``): all rows then end at the same KV
slot, one prefill graph serves every prompt length of the bucket, and decode writes slot
``bucket + step`` for every row. Slots, pads and positions are tensors, so decode never
recompiles. Every rank runs the same loop on the same logits with the same seeded generator:
the ranks agree on every token without a broadcast.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.buckets import check_request, left_pad
from torch_tensorrt_dist.generation.sampling import SamplingConfig, make_generator, sample
from torch_tensorrt_dist.models.llama import Transformer

__all__ = [
    "ENGINES",
    "GenerationResult",
    "Generator",
    "compile_step",
    "decode_example",
    "decode_step",
    "prefill_step",
]

logger = logging.getLogger(__name__)

#: ``none`` runs the model as plain PyTorch (no torch.compile); the others go through the
#: ``torch_tensorrt_dist`` Dynamo backend with that engine.
ENGINES = ("tensorrt", "inductor", "eager", "none")

StepFn = Callable[[Tensor, Tensor, Tensor], Tensor]


def prefill_step(model: Transformer) -> StepFn:
    """``(tokens [B, S_bucket], cache_pos [S], pad [B]) -> last-position logits [B, V]``."""

    def prefill(tokens: Tensor, cache_pos: Tensor, pad: Tensor) -> Tensor:
        return model(tokens, cache_pos, pad, last_only=True)[:, -1]

    return prefill


def decode_step(model: Transformer) -> StepFn:
    """``(tokens [B, 1], cache_pos [1], pad [B]) -> logits [B, V]``: one graph for every step."""

    def decode(tokens: Tensor, cache_pos: Tensor, pad: Tensor) -> Tensor:
        return model(tokens, cache_pos, pad)[:, -1]

    return decode


def decode_example(batch: int, slot: int = 8) -> tuple[Tensor, Tensor, Tensor]:
    """Example inputs of a decode step writing KV slot ``slot`` (for explain and benchmarks)."""
    return (
        torch.zeros(batch, 1, dtype=torch.long),
        torch.tensor([slot]),
        torch.zeros(batch, dtype=torch.long),
    )


def compile_step(fn: StepFn, engine: str, *, verify: bool | None = None) -> StepFn:
    """``fn`` compiled as one static-shape graph per rank by the given engine.

    ``verify``: check the first call of each graph against its eager reference (the
    backend's ``verify`` option; ``None``: on for ``tensorrt`` only).
    """
    if engine not in ENGINES:
        raise ConfigError(f"engine={engine!r} is not one of {', '.join(ENGINES)}")
    if engine == "none":
        return fn
    import torch_tensorrt_dist.backend  # noqa: F401  (registers the backend)

    compiled: StepFn = torch.compile(
        fn,
        backend="torch_tensorrt_dist",
        options={"engine": engine} if verify is None else {"engine": engine, "verify": verify},
        fullgraph=True,
        dynamic=False,
    )
    return compiled


@dataclass
class GenerationResult:
    """Generated ids per prompt (a stop token, when hit, is the last id) and timings."""

    tokens: list[list[int]]
    ttft_s: float
    """Prompt in to first token out (prefill + first sample)."""
    decode_s: float
    decode_steps: int
    prefill_len: int
    """The bucket the prompts were padded to."""
    stopped: list[bool] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        """Decode tokens per second per sequence (steps / decode time)."""
        return self.decode_steps / self.decode_s if self.decode_s > 0 else 0.0


class Generator:
    """Runs prefill and decode for a model whose caches it sets up."""

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
        self.engine = engine
        self.max_batch_size = max_batch_size
        self.cache_len = cache_len or model.args.max_seq_len
        model.setup_caches(max_batch_size, self.cache_len)
        self.device = model.tok_embeddings.weight.device

        self._prefill = compile_step(prefill_step(model), engine, verify=verify)
        self._decode = compile_step(decode_step(model), engine, verify=verify)

    def check(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> int:
        """Validate a request; return its prefill bucket (the same on every rank)."""
        return check_request(
            prompts,
            max_new_tokens,
            max_batch_size=self.max_batch_size,
            vocab_size=self.model.args.vocab_size,
            cache_len=self.cache_len,
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
        """Generate up to ``max_new_tokens`` per prompt; ``on_step`` gets each step's tokens."""
        bucket = self.check(prompts, max_new_tokens)
        return self._run(
            prompts, bucket, max_new_tokens, sampling or SamplingConfig(), stop_ids, on_step
        )

    @torch.no_grad()
    def _run(
        self,
        prompts: Sequence[Sequence[int]],
        bucket: int,
        max_new_tokens: int,
        sampling: SamplingConfig,
        stop_ids: Sequence[int],
        on_step: Callable[[list[int]], None] | None,
    ) -> GenerationResult:
        # every cache row is filled (padding rows past the prompts): the KV write is then
        # index_copy into the whole cache buffer, done in place by every engine
        tokens, pad = left_pad(prompts, bucket, self.device, rows=self.max_batch_size)
        n = len(prompts)
        filler = torch.zeros(self.max_batch_size - n, dtype=torch.long, device=self.device)
        gen = make_generator(sampling)
        stops = set(stop_ids)
        out: list[list[int]] = [[] for _ in prompts]
        done = [False] * len(prompts)

        start = time.perf_counter()
        logits = self._prefill(tokens, torch.arange(bucket, device=self.device), pad)
        nxt = sample(logits[:n], sampling, gen)  # [n]
        step_ids = nxt.tolist()
        ttft = time.perf_counter() - start
        steps = 0
        decode_start = time.perf_counter()
        while True:
            for row, tok in enumerate(step_ids):
                if not done[row]:
                    out[row].append(tok)
                    done[row] = tok in stops or len(out[row]) >= max_new_tokens
            if on_step is not None:
                on_step(step_ids)
            if all(done):
                break
            slot = torch.tensor([bucket + steps], dtype=torch.long, device=self.device)
            logits = self._decode(torch.cat([nxt, filler])[:, None], slot, pad)
            nxt = sample(logits[:n], sampling, gen)
            step_ids = nxt.tolist()  # also waits for the device
            steps += 1
        decode_s = time.perf_counter() - decode_start
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
