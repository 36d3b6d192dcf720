"""A family added the way docs/families.md says: its model file (``models/toy.py: ToyLM``), its
TP plan (``parallel/plans.py: toy_lm_tp``) and its spec (``families/toy.py``), nothing else.
Found by its ``model_type``; a checkpoint that lacks a tensor refused by name before a weight is
allocated; greedy tokens through the rank builder at TP 1 equal to its own unsharded forward,
and at TP 2 (2 gloo ranks) equal to TP 1, each rank reading about half of the bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from torch_tensorrt_dist.config import GenerateJob, ModelOptions, Parallel, RunConfig
from torch_tensorrt_dist.errors import CheckpointError
from torch_tensorrt_dist.families import build_generator, checkpoint_spec, rank_for
from torch_tensorrt_dist.families.toy import ToySpec
from torch_tensorrt_dist.models.llama_args import ModelArgs
from torch_tensorrt_dist.models.toy import ToyLM
from torch_tensorrt_dist.testing.checkpoints import write_checkpoint
from torch_tensorrt_dist.testing.multiprocess import run_on_ranks

ARGS = ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=130, intermediate_size=96)
CONFIG = {
    "model_type": "toy_parallel",
    "hidden_size": ARGS.dim,
    "num_hidden_layers": ARGS.n_layers,
    "num_attention_heads": ARGS.n_heads,
    "num_key_value_heads": ARGS.n_kv_heads,
    "vocab_size": ARGS.vocab_size,
    "intermediate_size": ARGS.intermediate_size,
    "max_position_embeddings": 128,
}
PROMPTS = [[5, 9, 17, 3, 80, 41], [7, 7, 120]]
NEW = 8


def _shapes() -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        return {n: tuple(p.shape) for n, p in ToyLM(ARGS).named_parameters()}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    path = tmp_path_factory.mktemp("toy")
    return path, write_checkpoint(path, CONFIG, _shapes(), std=0.2)


def _config(path: Path, tp: int) -> RunConfig:
    return RunConfig(
        "generate", ModelOptions(model=str(path)), Parallel(tp=tp), GenerateJob(), engine="eager"
    )


def toy_rank(rank: int, world: int, path: str) -> dict[str, Any]:
    """In a spawned rank (or this process at world 1): the family's generator over this
    rank's shard, built as ``rank_main`` builds it."""
    import torch.distributed as dist

    group = dist.group.WORLD if world > 1 else None
    built = rank_for(_config(Path(path), world), index=rank, world=world, group=group)
    model = built.model()
    gen = build_generator(model, built.config, rows=2, cache_len=64)
    tokens = gen.generate(PROMPTS, max_new_tokens=NEW).tokens
    return {"tokens": tokens, "bytes_read": model.bytes_read, "family": built.spec.family}


def _unsharded_greedy(path: Path) -> list[list[int]]:
    """The toy model's own forward over the whole sequence, weights from the file as they are."""
    model = ToyLM(ARGS)
    model.load_state_dict(load_file(str(path / "model.safetensors")))
    model.setup_caches(1, 64)
    out = []
    for prompt in PROMPTS:
        ids = list(prompt)
        with torch.no_grad():
            for _ in range(NEW):
                logits = model(torch.tensor([ids]), torch.arange(len(ids)))
                ids.append(int(logits[0, -1].argmax()))
        out.append(ids[len(prompt) :])
    return out


@pytest.fixture(scope="module")
def tp1(ckpt: tuple[Path, int]) -> dict[str, Any]:
    return toy_rank(0, 1, str(ckpt[0]))


def test_tp1_equals_its_unsharded_forward(ckpt: tuple[Path, int], tp1: dict[str, Any]) -> None:
    path, size = ckpt
    assert isinstance(checkpoint_spec(_config(path, 1)), ToySpec)
    got = tp1
    assert got["family"] == "toy"
    assert got["bytes_read"] == size
    assert got["tokens"] == _unsharded_greedy(path)


def test_tp2_equals_tp1_and_reads_its_half(ckpt: tuple[Path, int], tp1: dict[str, Any]) -> None:
    path, size = ckpt
    want = tp1["tokens"]
    ranks = run_on_ranks(toy_rank, 2, str(path), timeout=240)
    norms = sum(4 * s[0] for n, s in _shapes().items() if n.endswith("norm.weight"))
    for r in ranks:
        assert r["tokens"] == want
        assert r["bytes_read"] <= size // 2 + norms  # its half of every split tensor


def test_a_missing_tensor_is_refused_by_name(tmp_path: Path) -> None:
    shapes = _shapes()
    del shapes["layers.1.feed_forward.w2.weight"]
    write_checkpoint(tmp_path, CONFIG, shapes)
    config = _config(tmp_path, 1)
    with pytest.raises(
        CheckpointError, match=r"lacks tensor 'layers\.1\.feed_forward\.w2\.weight'"
    ):
        checkpoint_spec(config).plan(config)
