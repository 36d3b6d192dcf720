"""The artifact manifest: what was compiled, for which layout, with which software (pure).

``DIR/manifest.json`` describes a directory of per-rank compiled artifacts::

    DIR/manifest.json
    DIR/tokenizer/...              copied from the checkpoint (when it has one)
    DIR/rank-R/weights.safetensors this rank's weight shard (and RoPE tables)
    DIR/rank-R/step.pt2            the step graph: every call of the generation core
    DIR/rank-R/rank.json           the rank's entry, as the rank wrote it

Every file is listed with its sha256 (``rank.json`` and the tokenizer files included), so a
missing or corrupt file is found before loading it, and the manifest carries a ``digest`` of
its own content (sha256 of its canonical JSON without that field), so a changed manifest is
refused too. Nothing here touches torch.distributed or a compiler: build a
:class:`Manifest`, write it atomically, read it back (``checks.py`` beside it checks it against
a run).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from torch_tensorrt_dist.artifacts.graphs import GraphEntry
from torch_tensorrt_dist.errors import ArtifactError

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "FileEntry",
    "GraphEntry",
    "GroupEntry",
    "Manifest",
    "RankEntry",
    "atomic_write_bytes",
    "manifest_digest",
    "publish",
    "read_manifest",
    "sha256_file",
    "verify_files",
    "write_manifest",
]

FORMAT = "torch_tensorrt_dist.artifacts"
FORMAT_VERSION = 4
"""4: the paged step (one graph for every call of the generation core, over a pool of KV blocks
whose size is fixed at compile); 3: a prefill graph per bucket and a decode graph over per-row
caches; 2: the manifest carries its own ``digest``, and each rank lists its ``rank.json``.
Other versions are refused: recompile."""
MANIFEST_NAME = "manifest.json"
DIGEST_FIELD = "digest"
#: Digits of a sha256 shown in a message (enough to tell two files apart at a glance).
SHOWN_HASH = 16


@dataclass(frozen=True)
class FileEntry:
    """One file of a rank, relative to the artifact directory."""

    path: str
    sha256: str
    bytes: int


@dataclass(frozen=True)
class GroupEntry:
    """A process group, in creation order: its c10d name (graphs refer to it) and ranks."""

    name: str
    ranks: list[int]
    role: str
    """``world`` or ``tp`` (``pp`` when pipeline artifacts exist)."""


@dataclass(frozen=True)
class RankEntry:
    rank: int
    files: dict[str, FileEntry]
    """Role -> file: ``weights``, ``entry`` (``rank.json``) and each graph's role (``step``)."""
    schedules: dict[str, list[str]]
    """Graph role -> its collectives in order (``op(group)``): the schedule fingerprint."""
    state: dict[str, list[int]] = field(default_factory=dict)
    """Zero-initialised constants (the KV block pools): name -> shape."""


@dataclass(frozen=True)
class Manifest:
    engine: str
    world_size: int
    tp: int
    pp: int
    groups: list[GroupEntry]
    ranks: list[RankEntry]
    dtype: str
    max_batch_size: int
    """Rows one step runs (``--max-batch-size``)."""
    cache_len: int
    """The longest sequence, prompt and generated tokens (``--max-seq-len``)."""
    block_size: int
    """Tokens per KV block (``--block-size``)."""
    num_blocks: int
    """Blocks in each layer's pool, the null block included (from ``--kv-cache-memory``)."""
    max_prefill_tokens: int
    """Prompt tokens computed per step (``--max-prefill-tokens``)."""
    graphs: list[GraphEntry]
    """The step graphs and the call shapes each takes (``graphs.step_graphs``)."""
    model_args: dict[str, Any]
    checkpoint: dict[str, str]
    """``source`` (a path or ``preset:NAME``) and ``sha256`` (see fingerprint.checkpoint_hash)."""
    options: dict[str, str]
    """Sharding options the graphs were built with (``lm_head``, ``embedding``)."""
    tokenizer: dict[str, FileEntry] | None
    versions: dict[str, str | None]
    device: str = "cpu"
    """Device type the graphs were compiled for (``cpu`` or ``cuda``)."""
    quantization: dict[str, Any] | None = None
    """The weight-only scheme the weights were quantized with (``QuantConfig.to_dict``)."""
    format: str = FORMAT
    format_version: int = FORMAT_VERSION

    def rank_entry(self, rank: int) -> RankEntry:
        for entry in self.ranks:
            if entry.rank == rank:
                return entry
        raise ArtifactError(
            f"the manifest has no entry for rank {rank} (ranks "
            f"{[e.rank for e in self.ranks]}); recompile with --tp {self.tp} --pp {self.pp}"
        )

    def to_json(self) -> str:
        """The manifest file's text, sealed with its ``digest``."""
        data = asdict(self)
        data[DIGEST_FIELD] = manifest_digest(data)
        return json.dumps(data, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Manifest:
        """Parse a manifest; :class:`ArtifactError` for another format, version or shape."""
        if data.get("format") != FORMAT:
            raise ArtifactError(
                f"not a torch_tensorrt_dist artifact manifest (format {data.get('format')!r})"
            )
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise ArtifactError(
                f"artifact format version {version!r}, but this torch_tensorrt_dist reads "
                f"version {FORMAT_VERSION}; recompile with `torchtrt-dist compile`"
            )
        try:
            groups = [GroupEntry(**g) for g in data["groups"]]
            graphs = [GraphEntry(**g) for g in data["graphs"]]
            ranks = [
                RankEntry(
                    rank=r["rank"],
                    files={k: FileEntry(**f) for k, f in r["files"].items()},
                    schedules={k: list(v) for k, v in r["schedules"].items()},
                    state={k: list(v) for k, v in r.get("state", {}).items()},
                )
                for r in data["ranks"]
            ]
            tok = data.get("tokenizer")
            skip = ("groups", "graphs", "ranks", "tokenizer", DIGEST_FIELD)
            fields = {k: v for k, v in data.items() if k not in skip}
            manifest = cls(
                groups=groups,
                graphs=graphs,
                ranks=ranks,
                tokenizer=None if tok is None else {k: FileEntry(**f) for k, f in tok.items()},
                **fields,
            )
        except (KeyError, TypeError) as exc:
            raise ArtifactError(
                f"the manifest lacks or mistypes a field ({type(exc).__name__}: {exc}); it was "
                "not written by this version: recompile"
            ) from exc
        manifest.check_consistent()
        return manifest

    def check_consistent(self) -> None:
        """The manifest agrees with itself: every rank once with a file per graph, equal
        schedules within a group."""
        if self.world_size != self.tp * self.pp:
            raise ArtifactError(
                f"manifest: world_size {self.world_size} != pp {self.pp} x tp {self.tp}"
            )
        if sorted(e.rank for e in self.ranks) != list(range(self.world_size)):
            raise ArtifactError(
                f"manifest lists ranks {sorted(e.rank for e in self.ranks)}, expected "
                f"0..{self.world_size - 1}; the compile did not finish: recompile"
            )
        roles = [g.role for g in self.graphs]
        for entry in self.ranks:
            lacking = [r for r in roles if r not in entry.files]
            if lacking:
                raise ArtifactError(
                    f"manifest: rank {entry.rank} lists no file for the graphs {lacking}; the "
                    "compile did not finish: recompile"
                )
        by_rank = {e.rank: e for e in self.ranks}
        for group in self.groups:
            first = by_rank[group.ranks[0]].schedules
            for r in group.ranks[1:]:
                if by_rank[r].schedules != first:
                    raise ArtifactError(
                        f"ranks {group.ranks[0]} and {r} of group {group.name!r} were compiled "
                        "with different collective schedules (they would hang); recompile"
                    )


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def manifest_digest(data: Mapping[str, Any]) -> str:
    """sha256 of the manifest's canonical JSON (sorted keys, no spaces), without its digest."""
    body = {k: v for k, v in data.items() if k != DIGEST_FIELD}
    blob = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def publish(tmp: str | Path, path: Path) -> None:
    """Rename a finished temporary file to ``path`` (readable by all, as a plain file is)."""
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``path`` through a temporary file in the same directory, then rename it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        publish(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_manifest(root: Path, manifest: Manifest) -> Path:
    manifest.check_consistent()
    path = Path(root) / MANIFEST_NAME
    atomic_write_bytes(path, manifest.to_json().encode())
    return path


def read_manifest(root: Path) -> Manifest:
    """Read and check ``root/manifest.json``: JSON, format, version, its own digest, fields."""
    path = Path(root) / MANIFEST_NAME
    if not path.is_file():
        raise ArtifactError(
            f"{path} does not exist: {root} is not a complete artifact directory (a compile "
            "that did not finish writes no manifest); run `torchtrt-dist compile ... --out "
            f"{root}`"
        )
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArtifactError(
            f"{path} is not valid JSON ({exc}): it is damaged; copy it again or recompile"
        ) from exc
    if not isinstance(data, dict):
        raise ArtifactError(f"{path} holds a {type(data).__name__}, not a manifest object")
    recorded, actual = data.get(DIGEST_FIELD), manifest_digest(data)
    if recorded != actual and data.get("format_version") == FORMAT_VERSION:
        found = (
            "has no digest"
            if recorded is None
            else (
                f"does not match its digest (sha256 {actual[:SHOWN_HASH]}..., recorded "
                f"{str(recorded)[:SHOWN_HASH]}...)"
            )
        )
        raise ArtifactError(
            f"{path} {found}: it was changed after the compile; copy it again or recompile"
        )
    try:
        return Manifest.from_dict(data)
    except ArtifactError as exc:
        raise ArtifactError(f"{path}: {exc}") from exc


def verify_files(root: Path, entries: Mapping[str, FileEntry]) -> None:
    """Every file exists with its recorded size and sha256, else :class:`ArtifactError`
    naming the file, what was found and what the manifest records."""
    for role, entry in entries.items():
        path = Path(root) / entry.path
        if not path.is_file():
            raise ArtifactError(
                f"{entry.path} ({role}) is missing from {root}; copy the whole directory or "
                "recompile"
            )
        size = path.stat().st_size
        if size != entry.bytes:
            raise ArtifactError(
                f"{entry.path} ({role}) is corrupt: {size} bytes, the manifest records "
                f"{entry.bytes}; copy it again or recompile"
            )
        digest = sha256_file(path)
        if digest != entry.sha256:
            raise ArtifactError(
                f"{entry.path} ({role}) is corrupt: sha256 {digest[:SHOWN_HASH]}..., the "
                f"manifest records {entry.sha256[:SHOWN_HASH]}...; copy it again or recompile"
            )
