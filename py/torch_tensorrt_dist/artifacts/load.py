"""Run many: a rank starts from its artifacts (no checkpoint, no compile) and generates.

    gen = load_generator("DIR")        # on every rank, after init_distributed()
    result = gen.generate(prompts, max_new_tokens=32)

Before any collective runs, the rank checks, in this order: the manifest is complete and of
this format; the world size and layout are the compiled ones; the software versions that the
packages depend on match; every recorded process group exists here under the same name with
the same ranks (graphs call collectives by group name); its own files (``rank.json`` too) and
the tokenizer files match their sha256. It then loads its shard and graphs, and only when every
rank has passed all of that (one exchange through the c10d store) does any rank go on; a rank's
refusal stops every rank with its message. The weights come from the rank's safetensors shard
(no pickle), the graphs from their packages; :class:`ArtifactGenerator` plugs them into
:class:`Generator`'s loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor

from torch_tensorrt_dist.artifacts.fingerprint import running_versions
from torch_tensorrt_dist.artifacts.manifest import (
    Manifest,
    check_device,
    check_layout,
    check_versions,
    pick_bucket,
    read_manifest,
    verify_files,
)
from torch_tensorrt_dist.errors import ArtifactError, ConfigError
from torch_tensorrt_dist.generation.buckets import check_request
from torch_tensorrt_dist.generation.generate import Generator, StepFn
from torch_tensorrt_dist.models.dtypes import DTYPES
from torch_tensorrt_dist.models.llama_args import ModelArgs, RopeScaling
from torch_tensorrt_dist.ops.groups import check_group_ranks
from torch_tensorrt_dist.runtime.agree import agreed

__all__ = [
    "ArtifactGenerator",
    "check_groups",
    "load_generator",
    "model_args",
    "open_artifacts",
    "read_weights",
]

logger = logging.getLogger(__name__)


def model_args(manifest: Manifest) -> ModelArgs:
    data = dict(manifest.model_args)
    scaling = data.pop("rope_scaling", None)
    data["eos_token_ids"] = tuple(data.get("eos_token_ids", ()))
    return ModelArgs(**data, rope_scaling=None if scaling is None else RopeScaling(**scaling))


def check_groups(manifest: Manifest) -> None:
    """Every recorded group resolves, by its name, to its recorded ranks (no collective)."""
    for group in manifest.groups:
        if not dist.is_initialized():
            raise ArtifactError(
                f"the artifacts call collectives on group {group.name!r} (ranks {group.ranks}), "
                "but torch.distributed is not initialised; launch "
                f"{manifest.world_size} ranks (torchtrt-dist generate --artifacts starts them)"
            )
        try:
            check_group_ranks(group.name, group.ranks)
        except Exception as exc:
            raise ArtifactError(
                f"process group {group.name!r} ({group.role}) of the artifacts: {exc}"
            ) from exc


@dataclass
class Opened:
    """A checked manifest and this rank's place in it."""

    root: Path
    manifest: Manifest
    rank: int


def open_artifacts(root: str | Path, *, tp: int | None = None, pp: int | None = None) -> Opened:
    """Read and check the manifest and this rank's files (every refusal of this rank; no
    collective, no exchange with the other ranks: :func:`load_generator` does that)."""
    path = Path(root)
    manifest = read_manifest(path)
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    check_layout(manifest, world_size=world, tp=tp, pp=pp)
    check_versions(manifest, running_versions())
    check_groups(manifest)
    verify_files(path, manifest.rank_entry(rank).files)
    if manifest.tokenizer:
        verify_files(path, manifest.tokenizer)
    return Opened(path, manifest, rank)


class ArtifactGenerator(Generator):
    """:class:`Generator` over loaded graphs: one prefill per compiled bucket, one decode.

    Requests are checked against the compiled shapes; a prompt takes the smallest compiled
    bucket that holds it.
    """

    def __init__(
        self,
        manifest: Manifest,
        prefill: dict[int, StepFn],
        decode: StepFn,
        *,
        device: torch.device,
        constants: dict[str, Tensor] | None = None,
        load_s: float = 0.0,
    ) -> None:  # Generator.__init__ builds and compiles a model: not called on purpose
        self.manifest = manifest
        self.constants = constants or {}  # the graphs read these tensors in place: keep them
        self.args = model_args(manifest)
        self.engine = f"artifacts:{manifest.engine}"
        self.max_batch_size = manifest.max_batch_size
        self.cache_len = manifest.cache_len
        self.device = device
        self.load_s = load_s
        graphs = dict(prefill)

        def prefill_any(tokens: Tensor, slot: Tensor, last: Tensor) -> Tensor:
            return graphs[tokens.shape[1]](tokens, slot, last)

        self._prefill = prefill_any
        self._decode = decode

    def bucket(self, prompt_len: int) -> int:
        return pick_bucket(self.manifest, [prompt_len], 1)

    def buckets(self) -> list[int]:
        return sorted(self.manifest.buckets)

    def check(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> int:
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ConfigError("a prompt is empty; give at least one token of text")
        if max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        bucket = pick_bucket(self.manifest, [len(p) for p in prompts], max_new_tokens)
        check_request(  # token ids in range (shapes were checked above)
            prompts,
            max_new_tokens,
            max_batch_size=self.max_batch_size,
            vocab_size=self.args.vocab_size,
            cache_len=self.cache_len,
        )
        return bucket


def read_weights(path: Path, device: torch.device) -> dict[str, Tensor]:
    """A rank's ``weights.safetensors`` (no pickle), each tensor read into its own allocation:
    ``safetensors.torch.load_file`` returns views of one buffer at the file's offsets, and
    torch's int8 weight-only CPU kernel crashes on a weight that is not 64-byte aligned."""
    from torch_tensorrt_dist.models.safetensors_io import SafetensorsReader

    with SafetensorsReader(path) as reader:
        return {k: reader.read(k).to(device) for k in reader.keys()}  # noqa: SIM118


def load_generator(
    root: str | Path,
    *,
    tp: int | None = None,
    pp: int | None = None,
    device: torch.device | str | None = None,
) -> ArtifactGenerator:
    """Check the artifacts, load this rank's shard and graphs, return a ready generator.

    Every rank checks and loads its own part, then the ranks agree (``runtime.agree``): if any
    rank refused or failed, every rank raises before any graph runs, the others with a
    :class:`RankFailedError` quoting that rank's message."""
    start = time.perf_counter()
    with agreed("the artifact check"):
        gen = _load_generator(root, tp=tp, pp=pp, device=device)
    gen.load_s = time.perf_counter() - start
    logger.info(
        "rank %d: loaded the artifacts of %s in %.2f s",
        dist.get_rank() if dist.is_initialized() else 0,
        root,
        gen.load_s,
    )
    return gen


def _load_generator(
    root: str | Path,
    *,
    tp: int | None,
    pp: int | None,
    device: torch.device | str | None,
) -> ArtifactGenerator:
    opened = open_artifacts(root, tp=tp, pp=pp)
    manifest, entry = opened.manifest, opened.manifest.rank_entry(opened.rank)
    dev = (
        torch.device(device)
        if device is not None
        else (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else torch.device("cpu")
        )
    )
    check_device(manifest, dev.type)
    constants = read_weights(opened.root / entry.files["weights"].path, dev)
    dtype = DTYPES[manifest.dtype]
    for name, shape in entry.state.items():
        constants[name] = torch.zeros(shape, dtype=dtype, device=dev)
    roles = [r for r in entry.files if r == "decode" or r.startswith("prefill-")]
    paths = {r: opened.root / entry.files[r].path for r in roles}
    from torch_tensorrt_dist.artifacts.inductor import load_graphs

    graphs = load_graphs(paths, constants, dev)
    prefill = {int(r.removeprefix("prefill-")): g for r, g in graphs.items() if r != "decode"}
    if "decode" not in graphs or sorted(prefill) != sorted(manifest.buckets):
        raise ArtifactError(
            f"rank {opened.rank} lists graphs {sorted(graphs)}, but the manifest compiled "
            f"buckets {manifest.buckets} and a decode graph; recompile"
        )
    return ArtifactGenerator(manifest, prefill, graphs["decode"], device=dev, constants=constants)
