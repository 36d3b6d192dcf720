"""Load the TensorRT-LLM plugin library with ctypes and register its NCCL plugins, once.

    lib = load_trtllm_plugins()          # or load_trtllm_plugins("/opt/trtllm/lib")
    lib.path, lib.found_by               # where it came from

Search order: the explicit argument, ``$TRTLLM_PLUGINS_PATH`` (a file or its folder), the
installed ``tensorrt_llm`` package (``tensorrt_llm/libs/``), the system loader path
(``LD_LIBRARY_PATH``, ``ld.so.cache``). An explicit argument or variable that names a missing
file is an error (it is never skipped for another library). Before loading, the ``libnccl.so.2``
torch uses is preloaded globally so the plugins share it. ``initTrtLlmPlugins(NULL,
"tensorrt_llm")`` runs once per process, under a lock.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch_tensorrt_dist.errors import ConfigError, EngineUnavailableError

__all__ = [
    "ENV_PLUGINS_PATH",
    "INIT_SYMBOL",
    "LIB_NAME",
    "Candidate",
    "LoadedPlugins",
    "PluginLoader",
    "load_trtllm_plugins",
    "plugin_candidates",
]

logger = logging.getLogger(__name__)

LIB_NAME = "libnvinfer_plugin_tensorrt_llm.so"
ENV_PLUGINS_PATH = "TRTLLM_PLUGINS_PATH"
INIT_SYMBOL = "initTrtLlmPlugins"
_NAMESPACE = b"tensorrt_llm"
_INSTALL = (
    "install TensorRT-LLM built for your TensorRT (`pip install tensorrt_llm`, or NVIDIA's "
    f"container), or point {ENV_PLUGINS_PATH} (or settings plugin_path) at {LIB_NAME}; or use "
    "collective_impl='native' with TensorRT >= 10.16"
)


@dataclass(frozen=True)
class Candidate:
    """One place searched: how it was found, the path to try (None: nothing there), a note."""

    found_by: str
    path: str | None
    note: str
    explicit: bool = False


@dataclass(frozen=True)
class LoadedPlugins:
    path: str
    found_by: str
    handle: Any  # ctypes.CDLL


def _as_library(path: str) -> str:
    return os.path.join(path, LIB_NAME) if os.path.isdir(path) else path


def plugin_candidates(
    path: str | None = None,
    env: Mapping[str, str] | None = None,
    find_spec: Callable[[str], Any] = importlib.util.find_spec,
) -> list[Candidate]:
    """Every place searched, in order (pure apart from ``os.path`` checks)."""
    env = os.environ if env is None else env
    out: list[Candidate] = []
    for found_by, value in (("argument", path), (ENV_PLUGINS_PATH, env.get(ENV_PLUGINS_PATH))):
        if not value:
            note = "not given" if found_by == "argument" else "not set"
            out.append(Candidate(found_by, None, note))
            continue
        lib = _as_library(value)
        note = "exists" if os.path.isfile(lib) else "no such file"
        out.append(Candidate(found_by, lib, note, explicit=True))
    spec = find_spec("tensorrt_llm")
    if spec is None or not spec.submodule_search_locations:
        out.append(Candidate("tensorrt_llm package", None, "not installed"))
    else:
        lib = os.path.join(next(iter(spec.submodule_search_locations)), "libs", LIB_NAME)
        note = "exists" if os.path.isfile(lib) else "no such file"
        out.append(Candidate("tensorrt_llm package", lib, note))
    out.append(Candidate("system loader", LIB_NAME, "dlopen search (LD_LIBRARY_PATH, ld.so.cache)"))
    return out


def _looked(cands: list[Candidate], extra: dict[str, str]) -> str:
    lines = []
    for c in cands:
        note = extra.get(c.found_by, c.note)
        lines.append(f"  - {c.found_by}: {c.path or '-'} ({note})")
    return "\n".join(lines)


def _open(path: str) -> Any:
    return ctypes.CDLL(path)


class PluginLoader:
    """Thread-safe, idempotent loader (one library per process)."""

    def __init__(self, preload_nccl: bool = True) -> None:
        self._lock = threading.Lock()
        self._loaded: LoadedPlugins | None = None
        self._preload_nccl = preload_nccl

    @property
    def loaded(self) -> LoadedPlugins | None:
        return self._loaded

    def load(self, path: str | None = None, env: Mapping[str, str] | None = None) -> LoadedPlugins:
        with self._lock:
            if self._loaded is not None:
                if path and os.path.realpath(_as_library(path)) != os.path.realpath(
                    self._loaded.path
                ):
                    raise ConfigError(
                        f"the TensorRT-LLM plugins are already loaded from {self._loaded.path} "
                        f"({self._loaded.found_by}); a second library ({path}) cannot be loaded "
                        "into the same process. Use one plugin_path per process"
                    )
                return self._loaded
            if self._preload_nccl:
                from torch_tensorrt_dist.conversion.nccl_library import preload_torch_nccl

                preload_torch_nccl()
            self._loaded = self._load(plugin_candidates(path, env))
            return self._loaded

    def _load(self, cands: list[Candidate]) -> LoadedPlugins:
        failures: dict[str, str] = {}
        for cand in cands:
            if cand.path is None:
                continue
            if cand.explicit and cand.note == "no such file":
                raise EngineUnavailableError(
                    f"{cand.found_by} names {cand.path}, which does not exist. Fix the path, or "
                    f"unset it to search elsewhere. Searched:\n{_looked(cands, failures)}"
                )
            if cand.note == "no such file":
                continue
            try:
                handle = _open(cand.path)
            except OSError as exc:
                if cand.found_by == "system loader" and "No such file" in str(exc):
                    failures[cand.found_by] = "not on the loader path"
                    continue
                raise EngineUnavailableError(
                    f"{cand.path} ({cand.found_by}) could not be loaded: {exc}. "
                    + _load_hint(str(exc))
                ) from exc
            return LoadedPlugins(cand.path, cand.found_by, _initialise(handle, cand))
        raise EngineUnavailableError(
            f"{LIB_NAME} (the TensorRT-LLM NCCL plugins) was not found. Searched:\n"
            f"{_looked(cands, failures)}\nTo fix: {_INSTALL}"
        )


def _load_hint(message: str) -> str:
    if "libmpi" in message:
        return "It needs MPI: install Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
    if "libnvinfer" in message or "undefined symbol" in message or "version" in message:
        return (
            "It was built against another TensorRT/CUDA (wrong ABI): install the TensorRT-LLM "
            "release that matches the installed TensorRT"
        )
    return f"Check that it is a {LIB_NAME} for this platform and its dependencies are installed"


def _initialise(handle: Any, cand: Candidate) -> Any:
    try:
        init = getattr(handle, INIT_SYMBOL)
    except AttributeError as exc:
        raise EngineUnavailableError(
            f"{cand.path} ({cand.found_by}) has no symbol {INIT_SYMBOL}: it is not a TensorRT-LLM "
            "plugin library, or one of a release with another ABI. Point "
            f"{ENV_PLUGINS_PATH} at the {LIB_NAME} of a TensorRT-LLM built for this TensorRT"
        ) from exc
    init.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    init.restype = ctypes.c_bool
    if not init(None, _NAMESPACE):
        raise EngineUnavailableError(
            f"{INIT_SYMBOL}(NULL, 'tensorrt_llm') in {cand.path} returned false: the plugins did "
            "not register (usually a TensorRT version the library was not built for, or "
            "creators already registered by another copy). Use a TensorRT-LLM built for the "
            "installed TensorRT"
        )
    logger.info("TensorRT-LLM plugins registered from %s (%s)", cand.path, cand.found_by)
    return handle


_DEFAULT = PluginLoader()


def load_trtllm_plugins(path: str | None = None) -> LoadedPlugins:
    """Load and register the TensorRT-LLM plugins (once per process); see the module doc."""
    return _DEFAULT.load(path)
