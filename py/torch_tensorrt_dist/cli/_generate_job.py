"""``generate``'s job in a rank: the prompts as token ids (checked against the model before it
is loaded), a generator over this rank's shard, the text streamed or printed on rank 0."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch_tensorrt_dist.cli._output import Output
from torch_tensorrt_dist.config.jobs import GenerateJob
from torch_tensorrt_dist.config.run import RunConfig
from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.families import ModelPlan, Rank
from torch_tensorrt_dist.models.tokenizer import Tokenizer, load_tokenizer

__all__ = ["build", "check", "check_prompt_ids", "request", "run"]


def _job(config: RunConfig) -> GenerateJob:
    if not isinstance(config.job, GenerateJob):
        raise ConfigError(f"{config.command} does not generate")
    return config.job


def check_prompt_ids(prompts: Sequence[Sequence[int]], *, vocab_size: int) -> None:
    """Token ids within the vocabulary, checked on the tokenized prompts before the model is
    loaded or a prompt echoed."""
    for i, ids in enumerate(prompts):
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise ConfigError(
                f"prompt #{i + 1} encodes to token id {bad[0]}, outside the model's vocabulary "
                f"[0, {vocab_size}) (config.json vocab_size): the tokenizer is not this model's"
            )


def request(config: RunConfig, plan: ModelPlan) -> tuple[list[list[int]], int]:
    """The prompts' token ids and the KV-cache length they need (the compiled one for
    artifacts; else ``--max-seq-len``, or what the prompts and new tokens need, rounded up to
    64), every length checked."""
    from torch_tensorrt_dist.generation import check_lengths, prefill_bucket

    job = _job(config)
    tok = load_tokenizer(plan.tokenizer_dir, vocab_size=plan.args.vocab_size)
    prompts = [tok.encode(text) for text in job.prompts]
    if plan.manifest is not None:
        from torch_tensorrt_dist.artifacts.manifest import pick_bucket

        if any(not p for p in prompts):
            raise ConfigError("a prompt is empty; give at least one token of text")
        pick_bucket(plan.manifest, [len(p) for p in prompts], job.max_new_tokens)
        return prompts, int(plan.manifest.cache_len)
    check_prompt_ids(prompts, vocab_size=plan.args.vocab_size)
    limit = min(plan.args.max_seq_len, config.cache.max_seq_len or plan.args.max_seq_len)
    for ids in prompts:
        check_lengths(len(ids), job.max_new_tokens, limit)
    if config.cache.max_seq_len is not None:
        return prompts, config.cache.max_seq_len
    need = max(prefill_bucket(len(p), job.max_new_tokens, limit) for p in prompts)
    return prompts, min(limit, -(-(need + job.max_new_tokens) // 64) * 64)


def check(config: RunConfig, plan: ModelPlan) -> None:
    request(config, plan)


@dataclass
class Built:
    generator: Any
    tokenizer: Tokenizer
    prompts: list[list[int]]


def build(rank: Rank) -> Built:
    prompts, cache_len = request(rank.config, rank.plan)
    gen = rank.generator(rows=len(prompts), cache_len=cache_len, progress=True)
    return Built(gen, rank.tokenizer(), prompts)


def run(rank: Rank, built: Built) -> int:
    config, plan, job = rank.config, rank.plan, _job(rank.config)
    gen, tok, prompts = built.generator, built.tokenizer, built.prompts
    stop_ids = tok.eos_ids or plan.args.eos_token_ids
    out = Output(job, tok, stop_ids, rank.index)
    on_step = out.on_step()
    compile_s: float | None = None
    if job.warmup and plan.manifest is None:  # artifacts compile nothing
        compile_s = gen.warmup(max(map(len, prompts)), job.max_new_tokens, len(prompts))
    result = gen.generate(
        prompts,
        max_new_tokens=job.max_new_tokens,
        sampling=job.sampling,
        stop_ids=stop_ids,
        on_step=on_step,
    )
    p = plan.parallel
    if plan.manifest is not None:
        fields = {
            "tp": p.tp,
            "pp": p.pp,
            "engine": gen.engine,
            "load_s": gen.load_s,
            "dtype": plan.manifest.dtype,
            "model": plan.source,
            "quantize": plan.manifest.quantization,
            "threads": rank.threads,
        }
        out.result(result, fields, f"[tp={p.tp} {gen.engine}] load {gen.load_s:.2f} s,")
        return 0
    quant = config.quantize
    fields = {
        "tp": p.tp,
        "pp": p.pp,
        "ep": p.ep,
        "engine": config.engine,
        "compile_s": compile_s,
        "dtype": config.model.dtype,
        "model": plan.source,
        "quantize": None if quant is None else quant.to_dict(),
        "threads": rank.threads,
    }
    q = "" if quant is None else f" {quant.describe()}"
    status = f"[pp={p.pp} tp={p.tp} engine={config.engine}{q}]"
    out.result(result, fields, status + (f" compile {compile_s:.1f} s," if compile_s else ""))
    return 0
