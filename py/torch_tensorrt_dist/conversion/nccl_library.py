"""One NCCL library for torch, TensorRT and the TensorRT-LLM plugins.

TensorRT dlopens ``libnccl.so.2`` itself and the plugin library links against it. If each
found a different copy, a communicator made by one could not be used by another (and two
copies in one process can deadlock). Preloading the copy torch uses with ``RTLD_GLOBAL``
makes every later ``dlopen("libnccl.so.2")`` return that same handle.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["NCCL_SONAME", "find_torch_nccl", "preload_torch_nccl"]

logger = logging.getLogger(__name__)

NCCL_SONAME = "libnccl.so.2"
_lock = threading.Lock()
_preloaded: list[str] = []


def _loaded_from_maps(maps_lines: Iterable[str]) -> str | None:
    for line in maps_lines:
        path = line.rsplit(" ", 1)[-1].strip()
        if os.path.basename(path) == NCCL_SONAME:
            return path
    return None


def _package_nccl(find_spec: Callable[[str], Any]) -> str | None:
    try:
        spec = find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        return None
    for folder in list(getattr(spec, "submodule_search_locations", None) or []):
        lib = os.path.join(folder, "lib", NCCL_SONAME)
        if os.path.isfile(lib):
            return lib
    return None


def find_torch_nccl(
    maps_lines: Iterable[str] | None = None,
    find_spec: Callable[[str], Any] = importlib.util.find_spec,
) -> str | None:
    """Path of the ``libnccl.so.2`` torch uses: the one already mapped into this process
    (``/proc/self/maps``), else the ``nvidia-nccl`` wheel's; None where neither exists
    (a system NCCL, found by the loader, is then shared anyway)."""
    if maps_lines is None:
        try:
            with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
                maps_lines = fh.readlines()
        except OSError:
            maps_lines = []
    return _loaded_from_maps(maps_lines) or _package_nccl(find_spec)


def preload_torch_nccl() -> str | None:
    """Load torch's ``libnccl.so.2`` with ``RTLD_GLOBAL`` (once); returns its path or None."""
    with _lock:
        if _preloaded:
            return _preloaded[0]
        path = find_torch_nccl()
        if path is None:
            logger.debug("no %s next to torch; the system loader will pick one", NCCL_SONAME)
            return None
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:  # a CPU-only torch may ship no usable NCCL: nothing to share
            logger.warning("could not preload %s (%s); TensorRT may load another NCCL", path, exc)
            return None
        _preloaded.append(path)
        logger.debug("preloaded %s with RTLD_GLOBAL", path)
        return path
