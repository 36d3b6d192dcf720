"""A rank's compiled artifacts on disk: its graphs and weight shard under ``rank-R/``, its entry
``rank.json``, the tokenizer's files; the checks of an output directory and of a quantization
before anything is compiled. The compile itself, rank by rank (what is written in which order,
and who writes the manifest): ``families/compile.py``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from torch_tensorrt_dist.artifacts import inductor
from torch_tensorrt_dist.artifacts.graphs import GraphEntry
from torch_tensorrt_dist.artifacts.manifest import (
    FileEntry,
    RankEntry,
    atomic_write_bytes,
    sha256_file,
)
from torch_tensorrt_dist.errors import ArtifactError, ConfigError
from torch_tensorrt_dist.models.llama import Transformer
from torch_tensorrt_dist.quantization import QuantConfig

__all__ = [
    "DEFAULT_MAX_SEQ",
    "DEFAULT_ROWS",
    "CompileResult",
    "build_rank",
    "check_artifact_quantization",
    "check_output_dir",
    "copy_tokenizer",
    "read_rank",
]

logger = logging.getLogger(__name__)

#: The role under which a rank's ``rank.json`` is listed in the manifest.
ENTRY_ROLE = "entry"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "chat_template.jinja",  # the chat template, where transformers saved it apart
)


@dataclass
class CompileResult:
    manifest: Path
    seconds: float
    """Wall time of this rank's compile (load, export, compile, write)."""


#: The sequence length compiled where ``--max-seq-len`` is not given (at most the model's).
DEFAULT_MAX_SEQ = 256
#: The rows compiled where ``--max-batch-size`` is not given (as ``serve``'s default).
DEFAULT_ROWS = 8


def check_artifact_quantization(quantize: QuantConfig | None) -> None:
    """Artifacts take int8 weights; int4 is refused with the reason."""
    if quantize is not None and quantize.scheme == "int4":
        raise ConfigError(
            "compile --quantize int4: AOTInductor gives every CPU int4 matmul a constant of its "
            "own (the group size), which packages built without their constants cannot load; "
            "compile with --quantize int8, or run generate --quantize int4 from the checkpoint"
        )


_ARTIFACT_ENTRY = re.compile(r"^(manifest\.json|tokenizer|rank-\d+|\..*\.tmp)$")


def check_output_dir(out: str | Path) -> None:
    """``out`` can receive artifacts: a directory (or a path that can become one) that this
    user can write, empty or holding artifacts only (a compile overwrites them). Checked by the
    launching process before any rank starts; raises :class:`ArtifactError`."""
    root = Path(out)
    if root.exists() and not root.is_dir():
        raise ArtifactError(
            f"the output path {root} is a file, not a directory; choose a new or empty directory"
        )
    existing = root
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ArtifactError(
            f"the output path {root} cannot be created: {existing} is a file, not a directory"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ArtifactError(
            f"the output path {root} cannot be written: {existing} is not writable by this user "
            "(or is on a read-only file system); choose a writable place"
        )
    if root.is_dir():
        foreign = sorted(p.name for p in root.iterdir() if not _ARTIFACT_ENTRY.match(p.name))
        if foreign:
            shown = ", ".join(foreign[:3]) + (
                f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
            )
            raise ArtifactError(
                f"the output directory {root} is not empty and is not an artifact directory (it "
                f"holds {shown}); choose a new or empty directory, or one written by "
                "`torchtrt-dist compile`, which a compile overwrites"
            )


def _entry(root: Path, path: Path) -> FileEntry:
    return FileEntry(str(path.relative_to(root)), sha256_file(path), path.stat().st_size)


def _save_weights(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save

    cpu = {k: v.to("cpu") for k, v in tensors.items()}
    atomic_write_bytes(path, save(cpu))


def copy_tokenizer(src: Path | None, root: Path) -> dict[str, FileEntry] | None:
    if src is None or not (src / "tokenizer.json").is_file():
        return None
    out: dict[str, FileEntry] = {}
    for name in (*TOKENIZER_FILES, "config.json"):
        if (src / name).is_file():
            dest = root / "tokenizer" / name
            atomic_write_bytes(dest, (src / name).read_bytes())
            out[name] = _entry(root, dest)
    return out


def build_rank(
    model: Transformer, root: Path, rank: int, graphs: list[GraphEntry], wrapper_opt_level: str
) -> RankEntry:
    rank_dir = root / f"rank-{rank}"
    if rank_dir.exists():
        shutil.rmtree(rank_dir)
    rank_dir.mkdir(parents=True)
    files: dict[str, FileEntry] = {}
    schedules: dict[str, list[str]] = {}
    head_group = inductor.detach_head_group(model)
    for graph in graphs:
        ep, schedule = inductor.export_step(model, graph, head_group=head_group)
        path = rank_dir / f"{graph.role}.pt2"
        secs = inductor.compile_graph(ep, path, wrapper_opt_level=wrapper_opt_level)
        logger.info("rank %d: compiled %s in %.1f s", rank, graph.role, secs)
        files[graph.role], schedules[graph.role] = _entry(root, path), schedule
    saved, state = inductor.constants_of(model)
    _save_weights(rank_dir / "weights.safetensors", saved)
    files["weights"] = _entry(root, rank_dir / "weights.safetensors")
    entry = RankEntry(rank=rank, files=files, schedules=schedules, state=state)
    atomic_write_bytes(rank_dir / "rank.json", json.dumps(asdict(entry)).encode())
    return entry


def read_rank(root: Path, rank: int) -> RankEntry:
    """A rank's entry as it wrote it, with ``rank.json`` itself listed (role ``entry``)."""
    path = root / f"rank-{rank}" / "rank.json"
    data = json.loads(path.read_text())
    files = {k: FileEntry(**f) for k, f in data["files"].items()}
    return RankEntry(
        rank=data["rank"],
        files={**files, ENTRY_ROLE: _entry(root, path)},
        schedules=data["schedules"],
        state=data["state"],
    )
