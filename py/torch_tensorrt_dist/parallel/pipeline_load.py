"""Build one pipeline stage's weights: its layers only, and only this rank's TP slices.

    stage = load_stage("path/to/ckpt", stage=1, pp=2, group=tp_group)
    stage = random_stage(args, stage=1, pp=2, group=tp_group)   # = random_llama's weights

The stage is built on the meta device, sharded by the TP plan, then materialised and filled by
the loader's ``fill_parameters`` (positioned reads of only this rank's slices), so a rank never
reads another stage's layers nor another TP rank's slices.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist

from torch_tensorrt_dist.errors import CheckpointError
from torch_tensorrt_dist.models.llama_args import ModelArgs, read_config
from torch_tensorrt_dist.models.weights_check import check_checkpoint
from torch_tensorrt_dist.parallel.llama import Embedding, LMHead, tp_layout
from torch_tensorrt_dist.parallel.llama_load import fill_parameters, hf_name
from torch_tensorrt_dist.parallel.pipeline import PipelineStage, shard_stage, split_layers

__all__ = ["load_stage", "random_stage", "stage_tensor_names"]

logger = logging.getLogger(__name__)


def _tp(group: dist.ProcessGroup | None) -> tuple[int, int]:
    return (dist.get_rank(group), dist.get_world_size(group)) if group is not None else (0, 1)


def _build(
    args: ModelArgs, stage: int, pp: int, split: Sequence[int] | None, device: str
) -> PipelineStage:
    ranges = split_layers(args.n_layers, pp, split)
    if not 0 <= stage < pp:
        raise CheckpointError(f"stage {stage} is not a stage of pp={pp}")
    with torch.device(device):
        return PipelineStage(args, stage=stage, pp=pp, layers=ranges[stage])


def stage_tensor_names(
    args: ModelArgs, stage: int, pp: int, split: Sequence[int] | None = None
) -> list[str]:
    """The checkpoint tensors stage ``stage`` reads (pure: for tests and planning)."""
    built = _build(args, stage, pp, split, "meta")
    return sorted({hf_name(name, args) for name, _ in built.named_parameters()})


def load_stage(
    path: str | Path,
    *,
    stage: int,
    pp: int,
    group: dist.ProcessGroup | None = None,
    split: Sequence[int] | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    lm_head: LMHead = "vocab_parallel",
    embedding: Embedding = "vocab_parallel",
    max_seq_len: int | None = None,
) -> PipelineStage:
    """Stage ``stage`` of ``pp`` of checkpoint ``path``, sharded over the TP ``group``."""
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"checkpoint directory {root} does not exist")
    args = read_config(root, max_seq_len=max_seq_len)
    check_checkpoint(root, args)  # before any allocation
    rank, size = _tp(group)
    layout = tp_layout(args, rank, size, lm_head, embedding)
    model = _build(args, stage, pp, split, "meta")
    full_shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    shard_stage(model, group, lm_head=lm_head, embedding=embedding)
    model = model.to(dtype).to_empty(device=device)
    fill_parameters(model, root, args, layout, full_shapes, progress=False)
    logger.info(
        "loaded stage %d of %d (layers %s) of %s, tp rank %d of %d",
        stage,
        pp,
        list(model.layer_ids),
        root,
        rank,
        size,
    )
    return model.requires_grad_(False).eval()


def random_stage(
    args: ModelArgs,
    *,
    stage: int,
    pp: int,
    group: dist.ProcessGroup | None = None,
    split: Sequence[int] | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    lm_head: LMHead = "vocab_parallel",
    embedding: Embedding = "vocab_parallel",
) -> PipelineStage:
    """Stage ``stage`` with ``random_llama(args, seed=seed)``'s weights (the whole model is made
    once, then cut: meant for small presets and tests)."""
    from torch_tensorrt_dist.parallel.llama_load import random_llama

    full = dict(random_llama(args, seed=seed).named_parameters())
    model = _build(args, stage, pp, split, "cpu")
    with torch.no_grad():
        for name, param in model.named_parameters():
            src = name
            if name == "output.weight" and args.tie_embeddings:
                src = "tok_embeddings.weight"
            param.copy_(full[src])
    del full
    shard_stage(model, group, lm_head=lm_head, embedding=embedding)
    return model.to(dtype).requires_grad_(False).eval()
