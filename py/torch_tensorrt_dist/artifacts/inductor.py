"""AOTInductor artifacts: export the sharded paged step, compile, package, load.

A graph is a ``torch.export`` of this rank's sharded ``Transformer.paged_step`` with the rows,
tokens and blocks of a call as dynamic dimensions over the ranges of its
:class:`~torch_tensorrt_dist.artifacts.graphs.GraphEntry` (its collectives stay
``_c10d_functional`` ops naming the process group), compiled by
``torch._inductor.aoti_compile_and_package`` **without** its constants
(``aot_inductor.package_constants_in_so=False``). At load time every package gets the same
tensors through ``load_constants(..., user_managed=True)``: the weights read once from the
rank's safetensors shard, and one set of KV block pools (zeros, fixed size) that every call
writes and reads in place.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import Tensor, nn

from torch_tensorrt_dist.artifacts.fingerprint import collective_schedule
from torch_tensorrt_dist.artifacts.graphs import GraphEntry
from torch_tensorrt_dist.artifacts.manifest import publish, sha256_file
from torch_tensorrt_dist.errors import ArtifactError
from torch_tensorrt_dist.models.llama import Transformer

__all__ = [
    "STATE_SUFFIXES",
    "Package",
    "StepModule",
    "compile_graph",
    "constants_of",
    "detach_head_group",
    "example_inputs",
    "export_step",
    "load_graphs",
    "unpacked",
]

logger = logging.getLogger(__name__)

#: Constants that start as zeros and are written by the graphs (not saved with the weights).
STATE_SUFFIXES = (".k_pool", ".v_pool")

_INDUCTOR_CONFIGS = {"aot_inductor.package_constants_in_so": False}
#: Sizes the example inputs take where a range allows (none is 0 or 1, and no two are equal,
#: so that tracing neither specialises nor ties dimensions).
_EXAMPLE = {"rows": 3, "tokens": 5, "blocks": 4}

StepFn = Callable[..., Tensor]


def detach_head_group(model: Transformer) -> dist.ProcessGroup | None:
    """Take the vocabulary-parallel LM head's group off ``model`` (see :class:`StepModule`)."""
    group, model.group = model.group, None
    return group


class StepModule(nn.Module):
    """An exportable step of the generation core: ``(tokens [R, S], start [R], last [R],
    past [R, NBp], dest [R, S]) -> logits [R, V]`` (``Transformer.paged_step``).

    With a vocabulary-parallel head (``head_group``, taken off the model by
    :func:`detach_head_group`) the shards are assembled by an all-reduce of zero-padded logits
    rather than an all-gather: AOTInductor runs ``all_gather_into_tensor`` through its proxy
    executor, whose tensors reach Python, and a gloo worker freeing them then waits for the GIL
    that the running graph holds (a hang). ``all_reduce`` has a C shim; adding zeros is exact.
    """

    def __init__(self, model: Transformer, *, head_group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        self.model = model
        self.head_group = head_group

    def forward(
        self, tokens: Tensor, start: Tensor, last: Tensor, past: Tensor, dest: Tensor
    ) -> Tensor:
        logits = self.model.paged_step(tokens, start, last, past, dest)  # [R, V|Vs]
        if self.head_group is None:
            return logits
        tp, rank = dist.get_world_size(self.head_group), dist.get_rank(self.head_group)
        vs = logits.shape[-1]
        # [R, tp * Vs + 1]: this rank's shard at its offset, zeros elsewhere. The extra column
        # makes the returned logits a view, never the reduced tensor itself: a tensor that
        # Python holds must not be the one a gloo work frees later (that, too, needs the GIL).
        full = F.pad(logits, (rank * vs, (tp - 1 - rank) * vs + 1))
        full = funcol.all_reduce(full, "sum", self.head_group)
        return full[:, : self.model.args.vocab_size]


def _size(name: str, bounds: list[int]) -> tuple[int, Any]:
    """(example size, export dimension) of one dimension: static where its range is one size."""
    lo, hi = bounds
    if lo == hi:
        return lo, None
    return min(max(_EXAMPLE[name], lo), hi), torch.export.Dim(name, min=lo, max=hi)


def example_inputs(
    graph: GraphEntry, device: torch.device
) -> tuple[tuple[Tensor, ...], tuple[dict[int, Any], ...]]:
    """Example inputs of ``graph`` (a call within its ranges, on the null block) and their
    ``dynamic_shapes`` for ``torch.export``."""
    (r, rows), (s, tokens), (nb, blocks) = (
        _size("rows", graph.rows),
        _size("tokens", graph.tokens),
        _size("blocks", graph.blocks),
    )

    def dynamic(*axes: tuple[int, Any]) -> dict[int, Any]:  # (axis, Dim or None) -> {axis: Dim}
        return {axis: dim for axis, dim in axes if dim is not None}

    inputs = (
        torch.zeros(r, s, dtype=torch.long, device=device),
        torch.zeros(r, dtype=torch.long, device=device),
        torch.full((r,), s - 1, dtype=torch.long, device=device),
        torch.zeros(r, nb, dtype=torch.long, device=device),
        torch.zeros(r, s, dtype=torch.long, device=device),
    )
    shapes = (
        dynamic((0, rows), (1, tokens)),
        dynamic((0, rows)),
        dynamic((0, rows)),
        dynamic((0, rows), (1, blocks)),
        dynamic((0, rows), (1, tokens)),
    )
    return inputs, shapes


def export_step(
    model: Transformer,
    graph: GraphEntry,
    *,
    head_group: dist.ProcessGroup | None = None,
) -> tuple[torch.export.ExportedProgram, list[str]]:
    """Export the paged step over ``graph``'s ranges; also return its collective schedule."""
    device = model.tok_embeddings.weight.device
    step = StepModule(model, head_group=head_group)
    inputs, shapes = example_inputs(graph, device)
    with torch.no_grad():
        ep = torch.export.export(step, inputs, dynamic_shapes=shapes, strict=False)
    return ep, collective_schedule(ep.graph_module)


def compile_graph(
    ep: torch.export.ExportedProgram, path: Path, *, wrapper_opt_level: str = "O1"
) -> float:
    """AOTInductor-compile ``ep`` into the package ``path`` (atomically); return seconds.

    ``wrapper_opt_level``: the C++ optimisation of the generated ``run_impl`` glue (torch's
    default ``O1``); ``O0`` about halves the compile of a small model (its kernels keep their
    own flags)."""
    start = time.perf_counter()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".pt2", dir=path.parent)
    os.close(fd)
    try:
        torch._inductor.aoti_compile_and_package(
            ep,
            package_path=tmp,
            inductor_configs={
                **_INDUCTOR_CONFIGS,
                "aot_inductor.compile_wrapper_opt_level": wrapper_opt_level,
            },
        )
        publish(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return time.perf_counter() - start


def _is_state(name: str) -> bool:
    return name.endswith(STATE_SUFFIXES)


def constants_of(model: Transformer) -> tuple[dict[str, Tensor], dict[str, list[int]]]:
    """The constants a step package needs, named as in the package (``model.`` prefix):
    saved tensors (weights, RoPE tables) and the zero-initialised state's shapes (the pools)."""
    step = StepModule(model)
    saved: dict[str, Tensor] = {}
    state: dict[str, list[int]] = {}
    for name, t in [*step.named_parameters(), *step.named_buffers()]:
        if _is_state(name):
            state[name] = list(t.shape)
        else:
            saved[name] = t.detach().contiguous()
    return saved, state


def unpacked(path: Path, sha256: str | None = None) -> Path | None:
    """The package unzipped beside it (``<stem>.<sha256[:16]>.d``, made by the first load),
    for the loader's directory mode; None where its folder cannot be written.

    Given the ``.pt2`` file itself, the loader extracts it into a fresh folder under the
    system's temporary directory on every load and removes it only when the loader is
    destroyed, which a rank ending through ``os._exit`` never does: each start from artifacts
    would leave a copy of every package behind. The name holds the package's hash, so a
    package replaced in place is never served from its predecessor's folder. ``sha256``: the
    file's hash where the caller has just verified it (the manifest's entry), else computed."""
    digest = (sha256 or sha256_file(path))[:16]
    target = path.with_name(f"{path.stem}.{digest}.d")
    if target.is_dir():
        return target
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.stem}.", suffix=".tmp", dir=path.parent))
    except OSError:  # a read-only artifact directory: the loader extracts it itself
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            archive.extractall(tmp)
        os.rename(tmp, target)
    except (OSError, zipfile.BadZipFile):  # a damaged file: the loader names what it finds
        shutil.rmtree(tmp, ignore_errors=True)
        if not target.is_dir():  # not a rank that unpacked it first: give up the folder
            return None
    return target


class Package:
    """One loaded AOTInductor package, called as a step: ``(*inputs) -> logits``.

    Uses the loader ``torch._inductor.aoti_load_package`` wraps (``torch._C._aoti``) directly:
    importing ``torch._inductor`` costs seconds that a cold start from artifacts should not
    pay. The step's inputs and its one output are flat tensors, so no call spec is needed.

    The loader's binding holds the GIL for the whole call, collectives included. A gloo
    thread of the package's process group that still holds a tensor Python has seen (an
    earlier collective issued from Python on that group) needs the GIL to release it, and
    the package's next collective waits behind it: a deadlock. Collectives from Python go on
    other groups (the server's control group; a reference model's own group in the tests).
    """

    def __init__(self, path: Path, device: torch.device, sha256: str | None = None) -> None:
        index = device.index if device.type == "cuda" and device.index is not None else -1
        self.path = path
        #: what the loader reads: the package unzipped beside it (see :func:`unpacked`)
        self.source = unpacked(path, sha256) or path
        self._loader = torch._C._aoti.AOTIModelPackageLoader(
            str(self.source), "model", False, 1, index
        )

    def constant_names(self) -> list[str]:
        return list(self._loader.get_constant_fqns())

    def share_constants(self, constants: Mapping[str, Tensor]) -> None:
        """Hand the package these tensors without a copy (the caller keeps them alive)."""
        self._loader.load_constants(dict(constants), False, True, True)

    def __call__(self, *inputs: Tensor) -> Tensor:
        out: list[Tensor] = self._loader.boxed_run(list(inputs))
        return out[0]


def load_graphs(
    paths: Mapping[str, Path],
    constants: Mapping[str, Tensor],
    device: torch.device,
    sha256: Mapping[str, str] | None = None,
) -> dict[str, StepFn]:
    """Load each package and hand it the shared constants (no copy: ``user_managed``); the
    caller keeps ``constants`` alive as long as the graphs. ``sha256``: each role's file hash
    as the caller verified it (not hashed again to name its folder)."""
    graphs: dict[str, StepFn] = {}
    for role, path in paths.items():
        try:
            package = Package(path, device, (sha256 or {}).get(role))
        except Exception as exc:  # torch raises RuntimeError or its own errors by version
            raise ArtifactError(
                f"{path} ({role}) does not load with this torch ({type(exc).__name__}: {exc}); "
                "recompile the artifacts here"
            ) from exc
        wanted = package.constant_names()
        missing = sorted(set(wanted) - set(constants))
        if missing:
            raise ArtifactError(
                f"{path} ({role}) needs constants the weight shard lacks: {missing[:4]}; the "
                "files come from different compiles: recompile"
            )
        package.share_constants({k: constants[k] for k in wanted})
        graphs[role] = package
    return graphs
