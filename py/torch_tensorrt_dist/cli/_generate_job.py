"""``generate``'s job in a rank: the prompts as token ids (checked against the model before it
is loaded), a generator over this rank's shard (from a checkpoint or from artifacts), and on
rank 0 the streamed text, then a JSON object or a status line."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

from torch_tensorrt_dist.cli._rank import RankJob
from torch_tensorrt_dist.config.jobs import GenerateJob
from torch_tensorrt_dist.config.run import RunConfig
from torch_tensorrt_dist.families import ModelPlan, ModelSpec, Rank, check_kv_cache
from torch_tensorrt_dist.families.draft import draft_model
from torch_tensorrt_dist.generation.generate import GenerationResult, Generator
from torch_tensorrt_dist.models.tokenizer import Tokenizer, load_tokenizer

__all__ = ["GenerateRankJob", "Output", "request"]


def request(config: RunConfig, spec: ModelSpec, plan: ModelPlan) -> tuple[list[list[int]], int]:
    """The prompts' token ids and the KV-cache length they need (checked by the family)."""
    job = cast(GenerateJob, config.job)
    tok = load_tokenizer(plan.tokenizer_dir, vocab_size=plan.args.vocab_size)
    prompts = [tok.encode(text) for text in job.prompts]
    return prompts, spec.request_len(config, plan, prompts, job.max_new_tokens)


@dataclass
class Built:
    generator: Generator
    tokenizer: Tokenizer
    prompts: list[list[int]]


class GenerateRankJob(RankJob[Built]):
    """``generate``'s job in a rank (``start(ns, job_of, GenerateRankJob())``)."""

    def check(self, config: RunConfig, spec: ModelSpec, plan: ModelPlan) -> None:
        prompts, cache_len = request(config, spec, plan)
        if plan.manifest is None:  # artifacts hold the KV cache they were compiled for
            check_kv_cache(config, plan, len(prompts), cache_len)

    def build(self, rank: Rank) -> Built:
        prompts, cache_len = request(rank.config, rank.spec, rank.plan)
        draft = draft_model(rank, progress=True)  # --speculative draft: its shard, else None
        gen = rank.generator(rows=len(prompts), cache_len=cache_len, progress=True, draft=draft)
        return Built(gen, rank.tokenizer(), prompts)

    def run(self, rank: Rank, built: Built) -> int:
        config, plan, job = rank.config, rank.plan, cast(GenerateJob, rank.config.job)
        gen, tok, prompts = built.generator, built.tokenizer, built.prompts
        stop_ids = tok.eos_ids or plan.args.eos_token_ids
        out = Output(job, tok, stop_ids, rank.index)
        compile_s: float | None = None
        if job.warmup and plan.manifest is None:  # artifacts compile nothing
            longest = max(map(len, prompts))
            compile_s = gen.warmup(longest, job.max_new_tokens, len(prompts), progress=True)
        on_step = out.on_step()  # prints the prompt: after the warm-up's progress bar
        result = gen.generate(
            prompts,
            max_new_tokens=job.max_new_tokens,
            sampling=job.sampling,
            stop_ids=stop_ids,
            on_step=on_step,
        )
        p = plan.parallel
        fields: dict[str, object] = {
            "tp": p.tp,
            "pp": p.pp,
            "ep": p.ep,
            "engine": gen.runner.engine,
            "dtype": plan.dtype,
        }
        fields |= {"model": plan.source, "quantize": plan.quantize, "threads": rank.threads}
        if plan.manifest is not None:
            fields["load_s"] = gen.runner.load_s
            status = f"[tp={p.tp} {gen.runner.engine}] load {gen.runner.load_s:.2f} s,"
        else:
            fields["compile_s"] = compile_s
            q = "" if config.quantize is None else f" {config.quantize.describe()}"
            status = f"[pp={p.pp} tp={p.tp} engine={gen.runner.engine}{q}]"
            status += f" compile {compile_s:.1f} s," if compile_s else ""
        out.result(result, fields, status)
        return 0


class Output:
    """Rank 0's output of one request; other ranks print nothing."""

    def __init__(
        self, job: GenerateJob, tok: Tokenizer, stop_ids: Sequence[int], rank: int
    ) -> None:
        from torch_tensorrt_dist.generation import TextStream

        self.job, self.tok, self.stop_ids, self.rank = job, tok, tuple(stop_ids), rank
        self.stream = TextStream(tok, len(job.prompts))
        #: a single prompt without --json is streamed as it is generated
        self.streaming = rank == 0 and not job.json and len(job.prompts) == 1

    def on_step(self) -> Callable[[list[list[int]]], None] | None:
        """The generator's per-step callback (None when nothing is streamed); prints the
        prompt first."""
        if not self.streaming:
            return None
        print(self.job.prompts[0], end="", flush=True)

        def step(step_ids: list[list[int]]) -> None:
            piece = self.stream.push(step_ids, self.stop_ids)[0]
            if piece:
                print(piece, end="", flush=True)

        return step

    def result(self, result: GenerationResult, fields: dict[str, object], status: str) -> None:
        """The texts, then one JSON object (``--json``: the result and ``fields``) or the
        ``status`` line with ttft and decode speed on stderr."""
        if self.rank != 0:
            return
        stops = self.stop_ids
        texts = [self.tok.decode([i for i in ids if i not in stops]) for ids in result.tokens]
        if self.job.json:
            summary = {
                "tokens": result.tokens,
                "text": texts,
                "ttft_s": result.ttft_s,
                "tokens_per_s": result.tokens_per_s,
                "prefill_len": result.prefill_len,
                "decode_steps": result.decode_steps,
                **fields,
            }
            print(json.dumps(summary), flush=True)
            return
        if self.streaming:
            print(flush=True)  # end the streamed line
        else:
            for prompt, text in zip(self.job.prompts, texts):
                print(f"{prompt}{text}\n")
        print(
            f"{status} ttft {result.ttft_s * 1e3:.1f} ms, decode {result.tokens_per_s:.1f} tok/s",
            file=sys.stderr,
        )
