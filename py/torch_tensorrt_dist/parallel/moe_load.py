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
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm

from torch_tensorrt_dist.errors import CheckpointError
from torch_tensorrt_dist.models.checkpoint_files import weight_map
from torch_tensorrt_dist.models.llama_args import ModelArgs
from torch_tensorrt_dist.models.moe import MoETransformer, SparseMoE
from torch_tensorrt_dist.models.moe_args import MoEArgs, read_moe_config
from torch_tensorrt_dist.models.safetensors_io import SafetensorsReader, TensorInfo
from torch_tensorrt_dist.models.stage import StageRole, cut_stage
from torch_tensorrt_dist.models.weights_check import check_checkpoint
from torch_tensorrt_dist.parallel.llama import Embedding, LMHead, ShardSlice, shard_slice, tp_layout
from torch_tensorrt_dist.parallel.llama_load import hf_name, load_into
from torch_tensorrt_dist.parallel.moe import (
    MoEGroups,
    MoELayout,
    apply_moe_parallel,
    expert_slice,
    moe_layout,
    shared_slice,
)

__all__ = ["expert_key", "load_moe", "moe_hf_name", "random_moe"]

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


Job = tuple[str, torch.Tensor, str, "ShardSlice | None", tuple[int, ...]]
"""(our name, destination, checkpoint key, slice, the checkpoint tensor's expected shape)"""


def _fused_slice(kind: str, layout: MoELayout, expert_size: int) -> ShardSlice | None:
    """The slice of one expert's ``gate_up_proj`` [2I, D] (w1: rows of the first half, w3: of
    the second) or ``down_proj`` [D, I] (w2: columns) this rank reads."""
    sl = expert_slice(kind, layout)
    if kind == "w2":
        return sl
    start, stop = (0, expert_size) if sl is None else (sl.start, sl.stop)
    offset = expert_size if kind == "w3" else 0
    return ShardSlice(0, offset + start, offset + stop, stop - start)


def _expert_jobs(
    model: MoETransformer, layout: MoELayout, names: dict[str, Path], root: Path
) -> list[Job]:
    """The jobs of every local expert tensor: one checkpoint tensor per expert, or (experts
    fused on disk, transformers' in-memory layout) expert ``e`` of ``experts.gate_up_proj``
    [E, 2I, D] / ``experts.down_proj`` [E, D, I], read as ``key@e``."""
    jobs: list[Job] = []
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
                    jobs.append((name, stacked[j], f"{fused}.{part}@{e}", sl, want))
                    continue
                key = expert_key(i, e, kind, moe)
                if key not in names:
                    raise CheckpointError(_missing_expert(root, names, i, e, key, moe))
                want = (d, size) if kind == "w2" else (size, d)
                jobs.append((name, stacked[j], key, expert_slice(kind, layout), want))
    return jobs


def _missing_expert(
    root: Path, names: dict[str, Path], layer: int, e: int, key: str, moe: MoEArgs
) -> str:
    prefix = f"model.layers.{layer}.{_BLOCK[moe.style]}.experts."
    ids = [k[len(prefix) :].split(".")[0] for k in names if k.startswith(prefix)]
    have = sorted({int(x) for x in ids if x.isdigit()})
    return (
        f"{root} lacks expert {e} of layer {layer} ({key!r}); config.json says "
        f"{moe.n_experts} experts, the checkpoint has {len(have)} for that layer "
        f"({have[:8]}{'...' if len(have) > 8 else ''})"
    )


def _expert_view(reader: SafetensorsReader, key: str) -> None:
    """Make ``base@e`` readable: expert ``e``'s [2I, D] or [D, I] block of a fused tensor."""
    if key in reader.tensors:
        return
    base, e = key.rsplit("@", 1)
    t = reader.info(base)
    if not t.shape or not 0 <= int(e) < t.shape[0]:
        raise CheckpointError(
            f"{reader.path.name}: tensor {base!r} of shape {list(t.shape)} has no expert {e}"
        )
    stride = (t.end - t.begin) // t.shape[0]
    begin = t.begin + int(e) * stride
    reader.tensors[key] = TensorInfo(t.dtype, t.shape[1:], begin, begin + stride)


def fill_moe_parameters(
    model: MoETransformer,
    root: Path,
    layout: MoELayout,
    full_shapes: dict[str, tuple[int, ...]],
    *,
    lm_head: LMHead,
    embedding: Embedding,
    progress: bool = True,
) -> int:
    """Fill every parameter of a sharded, materialised MoE model with this rank's slice of its
    checkpoint tensor (``full_shapes``: the unsharded shapes); return the bytes read."""
    args, moe = model.args, model.moe
    names = weight_map(root)
    tpl = tp_layout(args, layout.tp_rank, layout.tp, lm_head, embedding)
    jobs: list[Job] = []
    for name, param in model.named_parameters():
        key = moe_hf_name(name, args, moe)
        if key is None:
            continue
        # transformers' in-memory names (router under .mlp) where a checkpoint keeps them
        alt = key.replace(f".{_BLOCK[moe.style]}.", ".mlp.")
        key = alt if key not in names and alt in names else key
        if key not in names:
            raise CheckpointError(f"{root} lacks tensor {key!r} (for {name})")
        sm = _MOE_RE.match(name)
        if sm is not None and sm.group(3) in ("w1", "w2", "w3"):
            sl = shared_slice(sm.group(3), layout)
        elif sm is not None:
            sl = None  # router, shared-expert gate: replicated
        else:
            sl = shard_slice(name, tpl)
            if sl is not None and name.endswith(".bias") and sl.dim == 1:
                sl = None
        jobs.append((name, param, key, sl, full_shapes[name]))
    jobs += _expert_jobs(model, layout, names, root)
    by_file: dict[Path, list[Job]] = {}
    for job in jobs:
        by_file.setdefault(names[job[2].split("@")[0]], []).append(job)
    show = progress and (not dist.is_initialized() or dist.get_rank() == 0)
    total = 0
    with (
        tqdm(total=len(jobs), desc=f"loading {root.name}", disable=not show) as bar,
        torch.no_grad(),
    ):
        for file, entries in by_file.items():
            with SafetensorsReader(file) as reader:
                for _, dest, key, sl, want in entries:
                    if "@" in key:
                        _expert_view(reader, key)
                    if reader.info(key).shape != want:
                        base = key.split("@")[0]
                        raise CheckpointError(
                            f"{file.name}: tensor {base!r} has shape "
                            f"{list(reader.info(base).shape)}, but config.json implies "
                            f"{list(want)} (per expert where experts are fused); the config "
                            "and weights do not match"
                        )
                    load_into(dest, reader, key, sl)
                    bar.update(1)
                total += reader.bytes_read
    return total


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
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"checkpoint directory {root} does not exist")
    args, moe = read_moe_config(root, max_seq_len=max_seq_len)
    check_checkpoint(root, args, moe)  # names, shapes, counts, dtypes: before any allocation
    g = groups or _SINGLE
    layout = moe_layout(
        args,
        moe,
        ep=g.ep,
        tp=g.tp,
        ep_rank=g.ep_rank,
        tp_rank=g.tp_rank,
        lm_head=lm_head,
        embedding=embedding,
    )
    with torch.device("meta"):
        model = MoETransformer(args, moe)
    full_shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    full_shapes["output.weight"] = (args.vocab_size, args.dim)
    apply_moe_parallel(model, g, lm_head=lm_head, embedding=embedding)
    if stage is not None:
        cut_stage(model, stage)
    model = model.to(dtype).to_empty(device=device)
    model.bytes_read = fill_moe_parameters(
        model, root, layout, full_shapes, lm_head=lm_head, embedding=embedding, progress=progress
    )
    logger.info("loaded %s (ep %d/%d, tp %d/%d)", root, g.ep_rank, g.ep, g.tp_rank, g.tp)
    return model.requires_grad_(False).eval()


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
    gen = torch.Generator().manual_seed(seed)
    model = MoETransformer(args, moe)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5 / p.shape[-1] ** 0.5)
    apply_moe_parallel(model, groups or _SINGLE, lm_head=lm_head, embedding=embedding)
    if stage is not None:
        cut_stage(model, stage)
    return model.to(dtype).requires_grad_(False).eval()
