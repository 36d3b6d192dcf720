"""The mixture-of-experts part of ``torchtrt-dist generate``: ``--ep E --tp T`` on a Mixtral or
Qwen2/3-MoE checkpoint (E x T ranks, TP inner). Kept apart so ``generate.py`` only asks two
questions: is this a MoE checkpoint (and does it split), and load this rank's shard."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.models.llama_args import ModelArgs
from torch_tensorrt_dist.models.moe_args import MoEArgs, is_moe_config

__all__ = ["load_moe_rank", "plan_moe"]


def plan_moe(ns: argparse.Namespace, path: Path | None) -> tuple[ModelArgs, MoEArgs] | None:
    """``(args, moe)`` when ``path`` is a MoE checkpoint (validated for ``--ep x --tp``), None
    for a dense model (where ``--ep`` must be 1)."""
    from torch_tensorrt_dist.models.moe_args import read_moe_config
    from torch_tensorrt_dist.parallel.moe import moe_layout

    ep = getattr(ns, "ep", 1)
    cfg_file = None if path is None else path / "config.json"
    if (
        path is None
        or cfg_file is None
        or not cfg_file.is_file()
        or not is_moe_config(_read(cfg_file))
    ):
        if ep != 1:
            raise ConfigError(
                f"--ep {ep} needs a mixture-of-experts checkpoint (Mixtral, Qwen2-MoE, Qwen3-MoE); "
                f"{'the default model' if path is None else path} is a dense model: drop --ep"
            )
        return None
    if ns.pp > 1 or ns.split:
        raise ConfigError("MoE checkpoints run with --ep and --tp; --pp is not supported yet")
    args, moe = read_moe_config(path)
    moe_layout(args, moe, ep=ep, tp=ns.tp, lm_head=ns.lm_head, embedding=ns.embedding)
    return args, moe


def _read(cfg_file: Path) -> dict[str, Any]:
    from torch_tensorrt_dist.models.checkpoint_files import load_config_json

    return load_config_json(cfg_file.parent)


def load_moe_rank(
    ns: argparse.Namespace,
    path: Path,
    *,
    world: int,
    dtype: torch.dtype,
    device: torch.device | str,
    max_seq_len: int,
) -> Any:
    """This rank's shard of the MoE checkpoint, on an ``(ep, tp)`` mesh when ``world > 1``."""
    from torch_tensorrt_dist.parallel.moe import make_moe_mesh, moe_groups
    from torch_tensorrt_dist.parallel.moe_load import load_moe

    groups = moe_groups(make_moe_mesh(ns.ep, ns.tp)) if world > 1 else None
    return load_moe(
        path,
        groups=groups,
        dtype=dtype,
        device=device,
        lm_head=ns.lm_head,
        embedding=ns.embedding,
        max_seq_len=max_seq_len,
    )
