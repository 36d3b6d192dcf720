"""One NCCL library for torch and TensorRT.

TensorRT's collective layers ``dlopen("libnccl.so.2")`` themselves, while torch links the copy
its ``nvidia-nccl`` wheel ships. Two different copies in one process means two NCCL runtimes and
communicators that cannot be shared. The launcher therefore gives every rank an environment
in which ``libnccl.so.2`` resolves to torch's copy:

    additions = nccl_env_additions(os.environ, find_nccl_library(os.environ))
    # {"LD_LIBRARY_PATH": ".../nvidia/nccl/lib:...", "TORCH_TENSORRT_DIST_NCCL_LIBRARY": ...}

``LD_LIBRARY_PATH`` is read when a process starts, so it only helps child processes: that is
why the launcher computes it. Inside a running process, :func:`load_nccl_library` loads the
library with ``RTLD_GLOBAL`` so a later ``dlopen`` by TensorRT finds the same one.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
from collections.abc import Mapping

from torch_tensorrt_dist.errors import ConfigError

__all__ = [
    "NCCL_LIBRARY_ENV",
    "find_nccl_library",
    "load_nccl_library",
    "nccl_env_additions",
]

logger = logging.getLogger(__name__)

#: Set by the user to force a libnccl.so.2, or by the launcher to record the one it chose.
NCCL_LIBRARY_ENV = "TORCH_TENSORRT_DIST_NCCL_LIBRARY"
_SONAME = "libnccl.so.2"


def find_nccl_library(env: Mapping[str, str]) -> str | None:
    """Path of the ``libnccl.so.2`` to use: ``$TORCH_TENSORRT_DIST_NCCL_LIBRARY`` if set, else
    the one in torch's ``nvidia-nccl`` wheel, else None (a CPU-only install has none)."""
    forced = env.get(NCCL_LIBRARY_ENV)
    if forced:
        if not os.path.isfile(forced):
            raise ConfigError(
                f"{NCCL_LIBRARY_ENV}={forced!r} is not a file; point it at a libnccl.so.2 or "
                "unset it to use the copy that ships with torch (pip package nvidia-nccl-cu*)"
            )
        return os.path.abspath(forced)
    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        candidate = os.path.join(root, "lib", _SONAME)
        if os.path.isfile(candidate):
            return os.path.abspath(candidate)
    return None


def _prepend(value: str | None, item: str) -> str:
    parts = [p for p in (value or "").split(":") if p and p != item]
    return ":".join([item, *parts])


def nccl_env_additions(
    env: Mapping[str, str], library: str | None, *, preload: bool = False
) -> dict[str, str]:
    """Variables to add to ``env`` so ranks load ``library`` as their ``libnccl.so.2``.

    Pure: returns only the changed variables (empty when ``library`` is None). The library's
    folder goes first on ``LD_LIBRARY_PATH``; ``preload=True`` also puts the library first on
    ``LD_PRELOAD`` (for programs that load TensorRT before torch).
    """
    if library is None:
        return {}
    folder = os.path.dirname(library)
    out = {NCCL_LIBRARY_ENV: library}
    current = env.get("LD_LIBRARY_PATH")
    updated = _prepend(current, folder)
    if updated != current:
        out["LD_LIBRARY_PATH"] = updated
    if preload:
        current = env.get("LD_PRELOAD")
        # glibc accepts spaces or colons between LD_PRELOAD entries.
        entries = (current or "").replace(" ", ":")
        updated = _prepend(entries, library)
        if updated != current:
            out["LD_PRELOAD"] = updated
    return out


def load_nccl_library(library: str) -> None:
    """Load ``library`` into this process with ``RTLD_GLOBAL`` (before TensorRT dlopens NCCL)."""
    try:
        ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        raise ConfigError(
            f"cannot load the NCCL library {library}: {exc}. Reinstall torch's NCCL "
            f"(pip install --force-reinstall nvidia-nccl-cu13) or set {NCCL_LIBRARY_ENV}"
        ) from exc
    logger.debug("loaded %s with RTLD_GLOBAL", library)
