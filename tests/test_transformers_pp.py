"""The transformers family's pipeline stages (``--pp``, ``models/hf_stage.py``): on four gloo
ranks (one spawn for both models: PP 2 x TP 2, PP 4), each stage reads only its own parts'
tensors and holds KV pools for its own layers, and the stages together give HF's greedy
tokens through the native families' pipeline path (``PipelineSpec``, ``PipelineGenerator``);
granite's embedding multiplier scales the embedded tokens on the first stage only; a class
without a ``base_model_pp_plan``, or whose forward changes the hidden states it is given, is
refused by name before any weight is read."""

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


def _config(
    path: str | Path,
    *,
    pp: int = 2,
    tp: int = 1,
    split: tuple[int, ...] | None = None,
    engine: str = "none",
) -> RunConfig:
    return RunConfig(
        "generate",
        ModelOptions(model=str(path), model_impl="transformers"),  # (llama, qwen3: native too)
        Parallel(tp=tp, pp=pp, split=split),
        GenerateJob(),
        engine=engine,
        cache=CacheOptions(block_size=4, max_prefill_tokens=8),  # chunked prefill, packed steps
    )


def pp_rank_generate(rank: int, world: int, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """In a spawned gloo rank: each job's checkpoint as this rank's pipeline stage (the spec
    ``checkpoint_spec`` picks, the generator ``Rank.generator`` builds, as ``generate`` does);
    its greedy tokens, the bytes it read, the layers its KV pools hold and the collectives of
    each graph the job's engine compiled (op, group ranks)."""
    import torch.distributed as dist

    from torch_tensorrt_dist.backend import recording
    from torch_tensorrt_dist.families import PipelineSpec, Rank, TransformersSpec, checkpoint_spec
    from torch_tensorrt_dist.models.paged import PagedKVCache

    out = []
    for job in jobs:
        config = _config(
            job["path"],
            pp=job["pp"],
            tp=job["tp"],
            split=job.get("split"),
            engine=job.get("engine", "none"),
        )
        spec = checkpoint_spec(config)
        assert isinstance(spec, PipelineSpec) and isinstance(spec.inner, TransformersSpec)
        plan = spec.plan(config)
        place = Rank(config, spec, plan, rank, world, group=dist.group.WORLD)
        gen = place.generator(rows=4, cache_len=64)
        model = gen.runner.model  # type: ignore[attr-defined]
        with recording() as graphs:
            res = gen.generate(job["prompts"], max_new_tokens=NEW)
        pools = [i for i, p in enumerate(model.kv_pools) if isinstance(p, PagedKVCache)]
        parts = {n.removeprefix("model.").split(".")[0] for n, _ in model.hf.named_parameters()}
        out.append(
            {
                "tokens": res.tokens,
                "bytes_read": model.bytes_read,
                "pools": pools,
                "parts": sorted(parts),
                "graphs": [[(c.op, c.group_ranks) for c in g.collectives] for g in graphs],
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
def test_stages_exact_and_each_reads_its_share(tmp_path: Path) -> None:
    """One spawn of 4 gloo ranks. llama (2 layers, its own head) at PP 2 x TP 2, compiled by
    the eager engine (two short prompts batched: one packed prefill step, then decode steps;
    two graphs a rank): each stage sharded by the model's own TP plan over its stage's TP group
    (the parts of other stages left out of the plan), its graphs holding only that group's
    collectives (the last stage's head gathers the logits; the stages' sends run between
    graphs), each rank reading a quarter of the tensors and the norms it replicates. qwen3 (5
    layers, a tied head) at PP 4, split 2 + 1 + 1 + 1: middle stages take and give hidden
    states; the first stage reads the embedding and its layers, the last its layer, the norm
    and the embedding again (the head's matrix), every tensor read by one stage.
    granite (an embedding multiplier of 3, which its forward applies to ``inputs_embeds``) at
    PP 4: only the first stage scales. Every rank samples HF's greedy tokens."""
    llama, llama_hf = _hf_ckpt.save("llama", tmp_path)
    qwen3, qwen3_hf = _hf_ckpt.save(
        "qwen3", tmp_path, num_hidden_layers=5, tie_word_embeddings=True
    )
    granite, granite_hf = _hf_ckpt.save(
        "granite", tmp_path, num_hidden_layers=4, embedding_multiplier=3.0
    )
    prompts = _hf_ckpt.PROMPTS
    refs = [hf_greedy(m, prompts, NEW) for m in (llama_hf, qwen3_hf, granite_hf)]
    refs[0] = refs[0][1:]
    jobs = [
        dict(path=str(llama), pp=2, tp=2, prompts=prompts[1:], engine="eager"),  # (a graph
        # a shape class: the long prompt's chunks would add two, 10 s under load)
        dict(path=str(qwen3), pp=4, tp=1, split=(2, 1, 1, 1), prompts=prompts),
        dict(path=str(granite), pp=4, tp=1, prompts=prompts),
    ]
    results: Any = run_on_ranks(pp_rank_generate, 4, jobs, timeout=300)
    for rank in results:
        assert [r["tokens"] for r in rank] == refs
    tensors = _tensor_bytes(llama)
    norms = sum(b for name, b in tensors.items() if name.endswith("norm.weight"))
    for rank in results:
        assert 0 < rank[0]["bytes_read"] <= sum(tensors.values()) / 4 + norms
    assert [rank[0]["pools"] for rank in results] == [[0], [0], [1], [1]]  # stage-major ranks
    for r, rank in enumerate(results):  # the last stage gathers the logits of its head
        group, ops = ((0, 1), {"all_reduce"}) if r < 2 else ((2, 3), {"all_reduce", "all_gather"})
        assert len(rank[0]["graphs"]) == 2, r  # compiled: prefill, decode
        for collectives in rank[0]["graphs"]:
            assert {c for c, _ in collectives} == ops, r
            assert {tuple(g) for _, g in collectives} == {group}, r
        assert not any(rank[i]["graphs"] for i in (1, 2)), r  # engine "none": no graph
    assert [rank[0]["parts"] for rank in results] == [["embed_tokens", "layers"]] * 2 + [
        ["layers", "lm_head", "norm"]
    ] * 2
    tensors = _tensor_bytes(qwen3)
    embed = tensors["model.embed_tokens.weight"]
    assert sum(rank[1]["bytes_read"] for rank in results) == sum(tensors.values()) + embed
    assert [rank[1]["pools"] for rank in results] == [[0, 1], [2], [3], [4]]
    assert [rank[1]["parts"] for rank in results] == [
        ["embed_tokens", "layers"],
        ["layers"],
        ["layers"],
        ["embed_tokens", "layers", "norm"],  # (the tied head's matrix)
    ]


def _plan_error(path: Path) -> str:
    from torch_tensorrt_dist.families import checkpoint_spec

    config = _config(path)
    with pytest.raises(ConfigError) as info:
        checkpoint_spec(config).plan(config)
    return str(info.value)


def test_refused_by_name_before_any_weight(tmp_path: Path) -> None:
    """gpt2 (no base_model_pp_plan: a config alone, no weights to read) is refused at PP 2,
    naming the model type; gemma4_text's forward changes the hidden states
    it is given (per-layer inputs from the tokens: a later stage has none), refused on its
    meta-device model (the plan's check, ``hf_survey.pp_refusal``)."""
    import transformers

    from torch_tensorrt_dist.testing.hf_survey import pp_refusal

    gpt2 = tmp_path / "gpt2"
    transformers.GPT2Config(n_layer=2).save_pretrained(gpt2)
    message = _plan_error(gpt2)
    assert "'gpt2' has no base_model_pp_plan" in message and "--pp 1 only" in message
    message = pp_refusal("gemma4_text") or ""
    assert "'gemma4_text' cannot run as pipeline stages" in message
