"""What a run checks against the manifest of the artifacts it loads (pure): its layout, the
software the compiled packages pin, the quantization, the device and the request's length; each
refusal names what differs and the fix.

    check_layout(manifest, world_size=2, tp=None, pp=None)
    check_length(manifest, longest_prompt, max_new_tokens)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch_tensorrt_dist.artifacts.manifest import Manifest
from torch_tensorrt_dist.errors import ArtifactError

__all__ = [
    "check_device",
    "check_layout",
    "check_length",
    "check_quantization",
    "check_versions",
    "describe_run",
]

#: Versions that must equal the running software's for an engine's packages to load.
PINNED_VERSIONS = {"inductor": ("torch",)}


def describe_run(world_size: int, tp: int | None, pp: int | None) -> str:
    """``world size W (pp P x tp T)`` of a run: the sizes asked for, the others derived from
    the world size (pure)."""
    if pp is None and tp is None:
        pp = 1
    if tp is None and pp is not None and world_size % pp == 0:
        tp = world_size // pp
    if pp is None and tp is not None and world_size % tp == 0:
        pp = world_size // tp
    if tp is not None and pp is not None and tp * pp == world_size:
        return f"world size {world_size} (pp {pp} x tp {tp})"
    asked = " ".join(f"--{n} {v}" for n, v in (("tp", tp), ("pp", pp)) if v is not None)
    return f"world size {world_size}, which {asked} does not divide"


def check_layout(manifest: Manifest, *, world_size: int, tp: int | None, pp: int | None) -> None:
    """The run's world size and layout are the compiled ones (``None``: not asked for; the
    message then derives it from the world size, as the run would)."""
    want = (manifest.world_size, manifest.tp, manifest.pp)
    got = (world_size, manifest.tp if tp is None else tp, manifest.pp if pp is None else pp)
    if got != want:
        raise ArtifactError(
            f"the artifacts were compiled for world size {want[0]} (pp {want[2]} x tp "
            f"{want[1]}), but this run has {describe_run(world_size, tp, pp)}; "
            f"start {want[0]} ranks with --tp {want[1]} --pp {want[2]}, or recompile"
        )


def check_versions(manifest: Manifest, running: Mapping[str, str | None]) -> None:
    """The software that must match for this engine's packages matches."""
    pinned = PINNED_VERSIONS.get(manifest.engine)
    if pinned is None:
        raise ArtifactError(
            f"artifacts for engine {manifest.engine!r}, which this version cannot load "
            f"(engines: {', '.join(PINNED_VERSIONS)})"
        )
    for name in pinned:
        built, here = manifest.versions.get(name), running.get(name)
        if built != here:
            raise ArtifactError(
                f"the {manifest.engine} artifacts were compiled with {name} {built}, but this "
                f"process has {name} {here}; install {name}=={built} or recompile here"
            )


def check_quantization(manifest: Manifest, requested: Mapping[str, Any] | None) -> None:
    """A ``--quantize`` request matches the compiled weights (None: take what was compiled)."""
    if requested is None or dict(requested) == manifest.quantization:
        return
    want = requested.get("scheme")
    if manifest.quantization is None:
        raise ArtifactError(
            f"--quantize {want}: the artifacts were compiled without --quantize (their weights "
            f"are {manifest.dtype}); drop --quantize, or recompile with `torchtrt-dist compile "
            f"--quantize {want}`"
        )
    raise ArtifactError(
        f"--quantize {want} (group size {requested.get('group_size')}, embeddings "
        f"{requested.get('embeddings')}) differs from the compiled {manifest.quantization}; "
        "drop --quantize to use the compiled weights, or recompile with the scheme you want"
    )


def check_device(manifest: Manifest, device_type: str) -> None:
    """The graphs were compiled for this kind of device."""
    if manifest.device != device_type:
        raise ArtifactError(
            f"the artifacts were compiled for {manifest.device}, but this rank runs on "
            f"{device_type}; recompile on a {device_type} machine"
        )


def check_length(manifest: Manifest, longest: int, max_new_tokens: int) -> None:
    """The longest prompt and its new tokens fit the compiled sequence length, else
    :class:`ArtifactError` naming it. (More prompts than rows queue: no limit on their count.)"""
    if longest + max_new_tokens > manifest.cache_len:
        raise ArtifactError(
            f"prompt ({longest} tokens) + max_new_tokens ({max_new_tokens}) = "
            f"{longest + max_new_tokens} exceeds the compiled sequence length "
            f"{manifest.cache_len}; use max_new_tokens <= {max(manifest.cache_len - longest, 0)}, "
            "or recompile with a larger --max-seq-len"
        )
