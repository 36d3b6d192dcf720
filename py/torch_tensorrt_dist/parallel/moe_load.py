"""Load a Hugging Face Mixtral / Qwen2-MoE / Qwen3-MoE checkpoint, each rank reading only its bytes.

    model = load_moe("path/to/ckpt", groups=moe_groups(make_moe_mesh(ep=2, tp=2)))

As ``load_llama``: the model is built on the meta device, sharded (``moe.py`` beside it),
materialised, then filled by positioned reads. A rank reads its TP slices of attention and dense
tensors, the replicated router, its 1/(ep x tp) of the shared expert, and for each of ITS experts
only its TP slice of ``w1``/``w3`` (rows) and ``w2`` (columns); other experts' bytes are never
read. Checkpoints name experts one tensor each, as transformers' ``save_pretrained`` writes them:
``block_sparse_moe.experts.N.w1.weight`` (Mixtral) or ``mlp.experts.N.gate_proj.weight``
(Qwen2-MoE); a checkpoint in transformers' in-memory layout (``mlp.experts.gate_up_proj``
[E, 2I, D], ``mlp.experts.down_proj`` [E, D, I]) is read expert block by expert block.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
from torch import nn

from torch_tensorrt_dist.models.llama_args import ModelArgs
from torch_tensorrt_dist.models.moe import MoETransformer, SparseMoE
from torch_tensorrt_dist.models.moe_args import MoEArgs, read_moe_config
from torch_tensorrt_dist.models.stage import StageRole
from torch_tensorrt_dist.models.weights_check import check_checkpoint
from torch_tensorrt_dist.parallel.llama import Embedding, LMHead, ShardSlice, tp_layout
from torch_tensorrt_dist.parallel.llama_load import hf_name, tp_slice
from torch_tensorrt_dist.parallel.moe import (
    MoEGroups,
    MoELayout,
    apply_moe_parallel,
    expert_slice,
    shared_slice,
)
from torch_tensorrt_dist.parallel.sharded_load import (
    Read,
    checkpoint_dir,
    load_sharded,
    param_reads,
    random_sharded,
)

__all__ = ["MoEShards", "expert_key", "load_moe", "moe_hf_name", "random_moe"]

logger = logging.getLogger(__name__)

_SINGLE = MoEGroups(1, 1, 0, 0, None, None)
#: our stacked expert tensor -> the per-expert checkpoint name, by style
_EXPERT = {
    "mixtral": {"w1": "w1", "w3": "w3", "w2": "w2"},
    "qwen2_moe": {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"},
    "qwen3_moe": {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"},
}
_BLOCK = {"mixtral": "block_sparse_moe", "qwen2_moe": "mlp", "qwen3_moe": "mlp"}
_SHARED = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_MOE_RE = re.compile(r"layers\.(\d+)\.feed_forward\.(gate\.weight|w1|w2|w3|shared\.(\w+)\.weight)$")


def expert_key(layer: int, expert: int, kind: str, moe: MoEArgs) -> str:
    """The checkpoint name of expert ``expert``'s ``kind`` (w1 gate, w3 up, w2 down) tensor."""
    block = f"model.layers.{layer}.{_BLOCK[moe.style]}"
    return f"{block}.experts.{expert}.{_EXPERT[moe.style][kind]}.weight"


def moe_hf_name(name: str, args: ModelArgs, moe: MoEArgs) -> str | None:
    """The checkpoint name of a MoE parameter (router, shared expert); None for the stacked
    expert tensors (one checkpoint tensor per expert: :func:`expert_key`); dense parameters
    map as in ``llama_load.hf_name`` (Qwen3's q/k norms included)."""
    m = _MOE_RE.match(name)
    if m is None:
        return hf_name(name, args)
    layer, what, shared = int(m.group(1)), m.group(2), m.group(3)
    block = f"model.layers.{layer}.{_BLOCK[moe.style]}"
    if what == "gate.weight":
        return f"{block}.gate.weight"
    if what in ("w1", "w2", "w3"):
        return None
    if shared == "gate":
        return f"{block}.shared_expert_gate.weight"
    return f"{block}.shared_expert.{_SHARED[shared]}.weight"


def _fused_slice(kind: str, layout: MoELayout, expert_size: int) -> ShardSlice | None:
    """The slice of one expert's ``gate_up_proj`` [2I, D] (w1: rows of the first half, w3: of
    the second) or ``down_proj`` [D, I] (w2: columns) this rank reads."""
    sl = expert_slice(kind, layout)
    if kind == "w2":
        return sl
    start, stop = (0, expert_size) if sl is None else (sl.start, sl.stop)
    offset = expert_size if kind == "w3" else 0
    return ShardSlice(0, offset + start, offset + stop, stop - start)


def _expert_reads(model: MoETransformer, layout: MoELayout, names: dict[str, Path]) -> list[Read]:
    """The reads of every local expert tensor: one checkpoint tensor per expert, or (experts
    fused on disk, transformers' in-memory layout) expert ``e`` of ``experts.gate_up_proj``
    [E, 2I, D] / ``experts.down_proj`` [E, D, I], read as ``key@e``."""
    reads: list[Read] = []
    moe, d, size = model.moe, model.args.dim, model.moe.expert_size
    for i, layer in enumerate(model.layers):  # global indices (a pipeline stage holds some)
        ffn = getattr(layer, "feed_forward", None)
        if not isinstance(ffn, SparseMoE):
            continue
        fused = f"model.layers.{i}.mlp.experts"
        is_fused = f"{fused}.gate_up_proj" in names and f"{fused}.down_proj" in names
        for kind in ("w1", "w3", "w2"):
            stacked = getattr(ffn, kind)
            for j in range(layout.local_experts):
                e = layout.expert_start + j
                name = f"layers.{i}.feed_forward.{kind}[{e}]"
                if is_fused:
                    part = "down_proj" if kind == "w2" else "gate_up_proj"
                    want = (d, size) if kind == "w2" else (2 * size, d)
                    sl = _fused_slice(kind, layout, size)
                    reads.append(Read(name, stacked[j], f"{fused}.{part}@{e}", sl, want))
                    continue
                want = (d, size) if kind == "w2" else (size, d)
                key = expert_key(i, e, kind, moe)
                reads.append(Read(name, stacked[j], key, expert_slice(kind, layout), want))
    return reads


@dataclass(frozen=True)
class MoEShards:
    """The MoE family's part of the generic loader (``sharded_load.py``): the decoder with
    sparse layers, its EP x TP plan (``moe.py`` beside it), one checkpoint tensor per dense
    parameter and per expert (or per expert block of a fused tensor)."""

    args: ModelArgs
    moe: MoEArgs
    groups: MoEGroups = _SINGLE
    lm_head: LMHead = "vocab_parallel"
    embedding: Embedding = "vocab_parallel"

    def build(self) -> MoETransformer:
        return MoETransformer(self.args, self.moe)

    def shard(self, model: nn.Module) -> None:
        assert isinstance(model, MoETransformer)
        apply_moe_parallel(model, self.groups, lm_head=self.lm_head, embedding=self.embedding)

    def layout(self) -> MoELayout:
        return self.groups.layout(self.args, self.moe, self.lm_head, self.embedding)

    def key(self, name: str, names: dict[str, Path]) -> str | None:
        """:func:`moe_hf_name`, or transformers' in-memory name (router under ``.mlp``)
        where the checkpoint keeps that one."""
        key = moe_hf_name(name, self.args, self.moe)
        if key is None or key in names:
            return key
        alt = key.replace(f".{_BLOCK[self.moe.style]}.", ".mlp.")
        return alt if alt in names else key

    def slice(self, name: str, layout: MoELayout) -> ShardSlice | None:
        m = _MOE_RE.match(name)
        if m is None:  # attention, dense MLP, embedding, head: the dense plan's
            tpl = tp_layout(self.args, layout.tp_rank, layout.tp, self.lm_head, self.embedding)
            return tp_slice(name, tpl)
        if m.group(3) in ("w1", "w2", "w3"):
            return shared_slice(m.group(3), layout)
        return None  # router, shared-expert gate: replicated

    def reads(
        self, model: nn.Module, names: dict[str, Path], full: dict[str, tuple[int, ...]]
    ) -> list[Read]:
        assert isinstance(model, MoETransformer)
        layout = self.layout()
        full = {**full, "output.weight": (self.args.vocab_size, self.args.dim)}
        key_of, slice_of = (lambda n: self.key(n, names)), (lambda n: self.slice(n, layout))
        return param_reads(model, full, key_of, slice_of) + _expert_reads(model, layout, names)


def load_moe(
    path: str | Path,
    *,
    groups: MoEGroups | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    lm_head: LMHead = "vocab_parallel",
    embedding: Embedding = "vocab_parallel",
    max_seq_len: int | None = None,
    progress: bool = True,
    stage: StageRole | None = None,
) -> MoETransformer:
    """Build the (sharded) MoE model of checkpoint ``path``, reading only this rank's bytes
    (``stage``: only a pipeline stage's parts, ``models/stage.py``). ``model.bytes_read`` says
    how many bytes of the checkpoint this rank read."""
    root = checkpoint_dir(path)
    args, moe = read_moe_config(root, max_seq_len=max_seq_len)
    check_checkpoint(root, args, moe)  # names, shapes, counts, dtypes: before allocating
    g = groups or _SINGLE
    shards = MoEShards(args, moe, g, lm_head, embedding)
    shards.layout()  # the split checked before any allocation
    model = load_sharded(root, shards, dtype=dtype, device=device, stage=stage, progress=progress)
    logger.info("loaded %s (ep %d/%d, tp %d/%d)", path, g.ep_rank, g.ep, g.tp_rank, g.tp)
    return cast(MoETransformer, model)


def random_moe(
    args: ModelArgs,
    moe: MoEArgs,
    *,
    seed: int = 0,
    groups: MoEGroups | None = None,
    dtype: torch.dtype = torch.float32,
    lm_head: LMHead = "vocab_parallel",
    embedding: Embedding = "vocab_parallel",
    stage: StageRole | None = None,
) -> MoETransformer:
    """A MoE model with deterministic random weights (the same on every rank), then sharded
    (and cut to a pipeline ``stage``)."""
    shards = MoEShards(args, moe, groups or _SINGLE, lm_head, embedding)
    return cast(MoETransformer, random_sharded(shards, seed=seed, dtype=dtype, stage=stage))
