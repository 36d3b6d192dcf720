"""Pipeline x tensor parallel generation: one compiled prefill and decode graph per stage rank.

    result = generate_pipeline("ckpt/", [[1, 5, 7]], pp=2, tp=2, engine="inductor",
                               max_new_tokens=32)          # on every rank of a 4-rank job

Each rank runs its stage's layers as compiled graphs (TP all-reduces on its stage's TP group
inside them) and moves activations with explicit ``dist.send``/``dist.recv`` between the
graphs (``pipeline_transfers.py``). The last stage samples each prompt from its own seeded
generator (as ``generate`` does) and returns the token to the first stage's matching TP rank.

A batch of B rows runs as ``microbatches`` equal microbatches (default: pp when it divides B):
while stage s + 1 runs microbatch m, stage s runs m + 1, so in steady state every stage is busy
when there are at least pp microbatches. Each microbatch owns a block of KV-cache rows
(``PipelineStage.select_rows``), and all of them share the one prefill and one decode graph.
Decode at batch 1 has a single microbatch: the stages then run in turn.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.buckets import check_request, left_pad
from torch_tensorrt_dist.generation.generate import GenerationResult, compile_step
from torch_tensorrt_dist.generation.pipeline_transfers import (
    HEADER_RUN,
    HEADER_SKIP,
    HEADER_STOP,
    Links,
)
from torch_tensorrt_dist.generation.sampling import SamplingConfig, make_generator, sample_rows
from torch_tensorrt_dist.models.llama_args import ModelArgs
from torch_tensorrt_dist.parallel.llama import Embedding, LMHead
from torch_tensorrt_dist.parallel.pipeline import (
    PipelineLayout,
    PipelineStage,
    check_mesh,
    make_pipeline_mesh,
    stage_groups,
)

__all__ = ["PipelineGenerator", "generate_pipeline", "stage_steps"]

logger = logging.getLogger(__name__)


class _Rows:
    """Generated ids per row and which rows are finished (same rule as ``Generator``)."""

    def __init__(self, rows: int, max_new_tokens: int, stop_ids: Sequence[int]) -> None:
        self.out: list[list[int]] = [[] for _ in range(rows)]
        self.done = [False] * rows
        self.max_new, self.stops = max_new_tokens, set(stop_ids)

    def push(self, ids: list[int], first_row: int = 0) -> bool:
        """Record one step of rows ``first_row...``; True when all of those rows are finished."""
        for row, tok in enumerate(ids, first_row):
            if not self.done[row]:
                self.out[row].append(tok)
                self.done[row] = tok in self.stops or len(self.out[row]) >= self.max_new
        return all(self.done[first_row : first_row + len(ids)])


StepFn = Callable[[Tensor, Tensor, Tensor], Tensor]


def stage_steps(stage: PipelineStage) -> tuple[StepFn, StepFn]:
    """The prefill and decode functions of a stage (each compiles to one graph per rank).

    x is tokens [B, S] on the first stage, hidden [B, S, dim] elsewhere; the output is hidden
    [B, S, dim], or logits [B, V] of the last position on the last stage.
    """
    last = stage.is_last

    def prefill(x: Tensor, cache_pos: Tensor, pad: Tensor) -> Tensor:
        y = stage(x, cache_pos, pad, last_only=True)
        return y[:, -1] if last else y

    def decode(x: Tensor, cache_pos: Tensor, pad: Tensor) -> Tensor:
        y = stage(x, cache_pos, pad)
        return y[:, -1] if last else y

    return prefill, decode


class PipelineGenerator:
    """Runs this rank's stage in the pipeline generation loop (call it on every rank)."""

    def __init__(
        self,
        stage: PipelineStage,
        layout: PipelineLayout,
        *,
        engine: str = "none",
        max_batch_size: int = 1,
        cache_len: int | None = None,
        microbatches: int = 1,
        verify: bool | None = None,
    ) -> None:
        if not 1 <= microbatches <= max_batch_size:
            raise ConfigError(
                f"microbatches={microbatches} must be in [1, max_batch_size={max_batch_size}]"
            )
        if (layout.stage, layout.pp) != (stage.stage, stage.pp):
            raise ConfigError(
                f"rank {layout.rank} is stage {layout.stage} of pp={layout.pp}, but was given "
                f"stage {stage.stage} of pp={stage.pp}; load the stage of this rank"
            )
        self.stage, self.layout, self.engine = stage, layout, engine
        self.max_batch_size = max_batch_size
        self.cache_len = cache_len or stage.args.max_seq_len
        self.microbatches = microbatches
        stage.setup_caches(max_batch_size, self.cache_len, microbatches=microbatches)
        first = next(stage.parameters())
        self.device, self.dtype = first.device, first.dtype
        prefill, decode = stage_steps(stage)
        self._prefill = compile_step(prefill, engine, verify=verify)
        self._decode = compile_step(decode, engine, verify=verify)

    def check(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> int:
        """Validate a request; return its prefill bucket (the same on every rank)."""
        return check_request(
            prompts,
            max_new_tokens,
            max_batch_size=self.max_batch_size,
            vocab_size=self.stage.args.vocab_size,
            cache_len=self.cache_len,
        )

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        sampling: SamplingConfig | None = None,
        stop_ids: Sequence[int] = (),
        on_step: Callable[[list[int]], None] | None = None,
    ) -> GenerationResult:
        """Generate on this rank's stage. ``tokens`` are filled on the first and last stages
        (middle stages never see them: their result has empty rows); ``on_step`` runs on the
        first stage, once per step with every row's token."""
        bucket = self.check(prompts, max_new_tokens)
        n_mb = self.microbatches
        if len(prompts) % n_mb:
            raise ConfigError(
                f"{len(prompts)} prompts do not split into {n_mb} equal microbatches; give a "
                f"multiple of {n_mb} prompts or build the generator with microbatches=1"
            )
        sampling = sampling or SamplingConfig()
        lay, dev, b = self.layout, self.device, len(prompts) // n_mb
        tokens, pad = left_pad(prompts, bucket, dev)
        gens = [make_generator(sampling) for _ in prompts]  # each prompt its own, as generate
        rows = _Rows(len(prompts), max_new_tokens, stop_ids)
        links = Links(lay, dev, window=64 + 8 * n_mb)
        mb_done = [False] * n_mb
        last_tok: list[Tensor] = [tokens[:, -1]] * n_mb  # the token each microbatch runs next
        step_ids = [0] * len(prompts)

        start = time.perf_counter()
        ttft, decode_start, step, rounds = 0.0, start, 0, 0
        while True:
            seq = bucket if step == 0 else 1
            cache_pos = (
                torch.arange(bucket, device=dev)
                if step == 0
                else (torch.tensor([bucket + step - 1], dtype=torch.long, device=dev))
            )
            ran = False
            for m in range(n_mb):
                sl = slice(m * b, (m + 1) * b)
                if lay.is_first:
                    if step > 0 and not mb_done[m]:
                        if lay.token_peer is not None:
                            last_tok[m] = links.recv((b,), torch.long, lay.token_peer)
                        ids = last_tok[m].tolist()
                        step_ids[sl] = ids
                        mb_done[m] = rows.push(ids, m * b)
                    if step == 1 and m == n_mb - 1:
                        ttft = time.perf_counter() - start
                        decode_start = time.perf_counter()
                    if mb_done[m]:
                        links.header(HEADER_SKIP)
                        continue
                    x = tokens[sl] if step == 0 else last_tok[m][:, None]
                else:
                    header = links.recv_header()
                    if header == HEADER_STOP:
                        links.header(HEADER_STOP)
                        links.drain()
                        return self._result(rows, ttft, decode_start, rounds, bucket)
                    if header == HEADER_SKIP:
                        links.header(HEADER_SKIP)
                        continue
                    x = links.recv((b, seq, self.stage.args.dim), self.dtype, lay.prev)
                if n_mb > 1:
                    self.stage.select_rows(m * b, b)
                y = (self._prefill if step == 0 else self._decode)(x, cache_pos, pad[sl])
                ran = True
                if lay.next is not None:
                    links.header(HEADER_RUN)
                    links.send(y, lay.next)
                if lay.is_last:
                    last_tok[m] = sample_rows(y, sampling, gens[sl])  # [b]
                    if lay.token_peer is not None:
                        links.send(last_tok[m], lay.token_peer)
                        rows.push(last_tok[m].tolist(), m * b)
            if lay.is_first and step > 0 and on_step is not None:
                on_step(list(step_ids))
            rounds += int(ran)
            if lay.is_first and all(mb_done):
                links.header(HEADER_STOP)
                links.drain()
                return self._result(rows, ttft, decode_start, rounds, bucket)
            step += 1

    @staticmethod
    def _result(
        rows: _Rows, ttft: float, decode_start: float, rounds: int, bucket: int
    ) -> GenerationResult:
        return GenerationResult(
            tokens=rows.out,
            ttft_s=ttft,
            decode_s=time.perf_counter() - decode_start,
            decode_steps=max(rounds - 1, 0),
            prefill_len=bucket,
            stopped=[bool(r and r[-1] in rows.stops) for r in rows.out],
        )

    def warmup(self, prompt_len: int, max_new_tokens: int, batch_size: int = 1) -> float:
        """Compile this stage's prefill (of this length's bucket) and decode graphs; return s."""
        start = time.perf_counter()
        self.generate([[0] * prompt_len] * batch_size, max_new_tokens=min(2, max_new_tokens))
        return time.perf_counter() - start


def generate_pipeline(
    model: str | Path | ModelArgs,
    prompts: Sequence[Sequence[int]],
    *,
    pp: int,
    tp: int,
    engine: str = "eager",
    max_new_tokens: int = 32,
    sampling: SamplingConfig | None = None,
    stop_ids: Sequence[int] = (),
    split: Sequence[int] | None = None,
    dtype: torch.dtype = torch.float32,
    lm_head: LMHead = "vocab_parallel",
    embedding: Embedding = "vocab_parallel",
    cache_len: int | None = None,
    warmup: bool = True,
    seed: int = 0,
    microbatches: int | None = None,
    on_step: Callable[[list[int]], None] | None = None,
    verify: bool | None = None,
) -> GenerationResult:
    """Generate on a ``(pp, tp)`` mesh; call on every rank of an initialised world of pp*tp.

    ``model`` is a checkpoint directory or ModelArgs (random weights from ``seed``, as
    ``random_llama``). Returns this rank's :class:`GenerationResult` (tokens on first and last
    stage ranks; global rank 0 is always on the first stage).
    """
    from torch_tensorrt_dist.parallel.pipeline_load import load_stage, random_stage

    if not dist.is_initialized():
        raise ConfigError("generate_pipeline needs torch.distributed (init_distributed())")
    if isinstance(model, ModelArgs):
        args = model
    else:
        from torch_tensorrt_dist.models.llama_args import read_config

        args = read_config(model)
    check_mesh(pp, tp, dist.get_world_size(), args)
    mesh = make_pipeline_mesh(pp, tp)
    layout, group = stage_groups(mesh)
    device = f"cuda:{torch.cuda.current_device()}" if mesh.device_type == "cuda" else "cpu"
    if isinstance(model, ModelArgs):
        stage = random_stage(
            args,
            stage=layout.stage,
            pp=pp,
            group=group,
            split=split,
            seed=seed,
            dtype=dtype,
            lm_head=lm_head,
            embedding=embedding,
        ).to(device)
    else:
        stage = load_stage(
            model,
            stage=layout.stage,
            pp=pp,
            group=group,
            split=split,
            dtype=dtype,
            device=device,
            lm_head=lm_head,
            embedding=embedding,
        )
    if microbatches is None:
        microbatches = pp if len(prompts) % pp == 0 else 1
    runner = PipelineGenerator(
        stage,
        layout,
        engine=engine,
        max_batch_size=len(prompts),
        cache_len=cache_len,
        microbatches=microbatches,
        verify=verify,
    )
    if warmup:
        runner.warmup(max(len(p) for p in prompts), max_new_tokens, len(prompts))
    return runner.generate(
        prompts,
        max_new_tokens=max_new_tokens,
        sampling=sampling,
        stop_ids=stop_ids,
        on_step=on_step,
    )
