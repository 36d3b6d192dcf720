"""The transformers family's pipeline stages (``--pp``, ``models/hf_stage.py``): on two gloo
ranks (one spawn for every model), each stage reads only its own parts' tensors and holds KV
pools for its own layers, and the two stages together give HF's greedy tokens through the
native families' pipeline path (``PipelineSpec``, ``PipelineGenerator``); a class without a
``base_model_pp_plan``, or whose forward scales the hidden states it is given, is refused by
name before any weight is read."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import safetensors

from tests import _hf_ckpt
from torch_tensorrt_dist.config import GenerateJob, ModelOptions, Parallel, RunConfig
from torch_tensorrt_dist.config.run import CacheOptions
from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.testing.checkpoints import hf_greedy
from torch_tensorrt_dist.testing.multiprocess import run_on_ranks

pytestmark = pytest.mark.transformers

NEW = 6


def _config(path: str | Path, *, pp: int = 2, split: tuple[int, ...] | None = None) -> RunConfig:
    return RunConfig(
        "generate",
        ModelOptions(model=str(path), model_impl="transformers"),  # (llama, qwen3: native too)
        Parallel(tp=1, pp=pp, split=split),
        GenerateJob(),
        engine="none",
        cache=CacheOptions(block_size=4, max_prefill_tokens=8),  # chunked prefill, packed steps
    )


def pp_rank_generate(rank: int, world: int, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """In a spawned gloo rank: each job's checkpoint as this rank's pipeline stage (the spec
    ``checkpoint_spec`` picks, the generator ``Rank.generator`` builds, as ``generate`` does);
    its greedy tokens, the bytes it read and the layers its KV pools hold."""
    import torch.distributed as dist

    from torch_tensorrt_dist.families import PipelineSpec, Rank, TransformersSpec, checkpoint_spec
    from torch_tensorrt_dist.models.paged import PagedKVCache

    out = []
    for job in jobs:
        config = _config(job["path"], split=job.get("split"))
        spec = checkpoint_spec(config)
        assert isinstance(spec, PipelineSpec) and isinstance(spec.inner, TransformersSpec)
        plan = spec.plan(config)
        place = Rank(config, spec, plan, rank, world, group=dist.group.WORLD)
        gen = place.generator(rows=4, cache_len=64)
        model = gen.runner.model  # type: ignore[attr-defined]
        res = gen.generate(job["prompts"], max_new_tokens=NEW)
        pools = [i for i, p in enumerate(model.kv_pools) if isinstance(p, PagedKVCache)]
        parts = {n.removeprefix("model.").split(".")[0] for n, _ in model.hf.named_parameters()}
        out.append(
            {
                "tokens": res.tokens,
                "bytes_read": model.bytes_read,
                "pools": pools,
                "parts": sorted(parts),
            }
        )
    return out


def _tensor_bytes(path: Path) -> dict[str, int]:
    with safetensors.safe_open(path / "model.safetensors", "pt") as f:
        return {
            name: 4 * math.prod(f.get_slice(name).get_shape())
            for name in f.keys()  # noqa: SIM118 (safe_open is not a mapping)
        }


@pytest.mark.timeout(300)
def test_pp2_exact_and_each_stage_reads_its_share(tmp_path: Path) -> None:
    """llama (2 layers, 1 + 1, its own head) and qwen3 (3 layers
    split 2 + 1, a tied head: the last stage keeps the embedding the head reads) at PP 2: both
    ranks sample HF's tokens; stage 0 reads the embedding and its layers, stage 1 its layers,
    the norm and the head, every tensor read by one stage (the tied embedding by both)."""
    llama, llama_hf = _hf_ckpt.save("llama", tmp_path)
    qwen3, qwen3_hf = _hf_ckpt.save(
        "qwen3", tmp_path, num_hidden_layers=3, tie_word_embeddings=True
    )
    jobs = [
        dict(path=str(llama), prompts=_hf_ckpt.PROMPTS),
        dict(path=str(qwen3), split=(2, 1), prompts=_hf_ckpt.PROMPTS),
    ]
    refs = [hf_greedy(m, _hf_ckpt.PROMPTS, NEW) for m in (llama_hf, qwen3_hf)]
    results: Any = run_on_ranks(pp_rank_generate, 2, jobs, timeout=300)
    for i, (path, ref) in enumerate(zip((llama, qwen3), refs, strict=True)):
        first, last = results[0][i], results[1][i]
        assert first["tokens"] == ref == last["tokens"], path.name
        tensors = _tensor_bytes(path)
        embed = tensors["model.embed_tokens.weight"]
        total, both = sum(tensors.values()), first["bytes_read"] + last["bytes_read"]
        assert both == (total + embed if path == qwen3 else total), path.name
        assert 0 < first["bytes_read"] < total and 0 < last["bytes_read"] < total
    (llama_first, qwen_first), (llama_last, qwen_last) = results
    assert (llama_first["pools"], llama_last["pools"]) == ([0], [1])
    assert (qwen_first["pools"], qwen_last["pools"]) == ([0, 1], [2])
    assert llama_first["parts"] == ["embed_tokens", "layers"]
    assert llama_last["parts"] == ["layers", "lm_head", "norm"]
    assert qwen_first["parts"] == ["embed_tokens", "layers"]
    assert qwen_last["parts"] == ["embed_tokens", "layers", "norm"]  # (the head's matrix)


def _plan_error(path: Path) -> str:
    from torch_tensorrt_dist.families import checkpoint_spec

    config = _config(path)
    with pytest.raises(ConfigError) as info:
        checkpoint_spec(config).plan(config)
    return str(info.value)


def test_refused_by_name_before_any_weight(tmp_path: Path) -> None:
    """gpt2 (no base_model_pp_plan: a config alone, no weights to read) and granite (its
    forward scales ``inputs_embeds`` by its embedding multiplier, which a later stage must not
    do again) are refused at PP 2, naming the model type; both plan at PP 1; PP with TP is
    refused as not run yet."""
    import transformers

    gpt2 = tmp_path / "gpt2"
    transformers.GPT2Config(n_layer=2).save_pretrained(gpt2)
    message = _plan_error(gpt2)
    assert "'gpt2' has no base_model_pp_plan" in message and "--pp 1 only" in message
    granite, _ = _hf_ckpt.save("granite", tmp_path)
    message = _plan_error(granite)
    assert "'granite' cannot run as pipeline stages" in message and "inputs_embeds" in message
    from torch_tensorrt_dist.families import checkpoint_spec

    whole = _config(granite, pp=1)
    assert checkpoint_spec(whole).plan(whole).parallel.pp == 1
    config = _config(granite).with_(parallel=Parallel(tp=2, pp=2))
    with pytest.raises(ConfigError, match="not both yet"):
        checkpoint_spec(config).plan(config)
