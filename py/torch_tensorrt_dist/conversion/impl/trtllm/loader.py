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
from struct import error as struct_error
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
    "loaded_tensorrt_major",
    "loaded_trtllm_plugins",
    "plugin_candidates",
    "tensorrt_abi_mismatch",
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
            mismatch = tensorrt_abi_mismatch(_resolve(cand.path), loaded_tensorrt_major())
            if mismatch:
                raise EngineUnavailableError(f"{cand.path} ({cand.found_by}): {mismatch}")
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
            handle = _initialise(handle, cand)
            _check_registry(cand)
            return LoadedPlugins(cand.path, cand.found_by, handle)
        raise EngineUnavailableError(
            f"{LIB_NAME} (the TensorRT-LLM NCCL plugins) was not found. Searched:\n"
            f"{_looked(cands, failures)}\nTo fix: {_INSTALL}"
        )


def loaded_tensorrt_major() -> int | None:
    """The major version of the TensorRT this process runs (None where it cannot import)."""
    try:
        import tensorrt as trt
    except Exception:  # not installed or not loadable: nothing to compare against
        return None
    try:
        return int(str(trt.__version__).split(".")[0])
    except ValueError:
        return None


def _resolve(path: str) -> str | None:
    """The file the dynamic loader would open for ``path`` (a bare name: LD_LIBRARY_PATH)."""
    if os.sep in path:
        return path if os.path.isfile(path) else None
    for folder in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep):
        candidate = os.path.join(folder, path)
        if folder and os.path.isfile(candidate):
            return candidate
    return None  # found through ld.so.cache, if at all: the registry check still applies


def tensorrt_abi_mismatch(path: str | None, tensorrt_major: int | None) -> str | None:
    """Why the plugin library at ``path`` cannot load beside TensorRT ``tensorrt_major`` (its
    ``DT_NEEDED`` names another ``libnvinfer.so.N``), or None."""
    if path is None or tensorrt_major is None:
        return None
    from torch_tensorrt_dist.conversion.impl.trtllm.elf import (
        ElfError,
        needed_libraries,
        nvinfer_major,
    )

    try:
        built_for = nvinfer_major(needed_libraries(path))
    except (OSError, ElfError, struct_error) as exc:
        return f"is not a readable shared library ({exc})"
    if built_for is not None and built_for != tensorrt_major:
        return (
            f"is built for TensorRT {built_for} (it links libnvinfer.so.{built_for}), but this "
            f"process runs TensorRT {tensorrt_major}; loading it would map a second TensorRT. "
            f"Install the TensorRT-LLM release built for TensorRT {tensorrt_major}, or use "
            "collective_impl='native' (or our own plugins, see docs/conversion.md)"
        )
    return None


def _check_registry(cand: Candidate) -> None:
    """The plugins must be in *this* TensorRT's registry, or no layer can be built from them
    (where TensorRT cannot be imported there is no registry to check, nor anything to build)."""
    try:
        import tensorrt as trt
    except Exception:
        return

    registry = trt.get_plugin_registry()
    get = getattr(registry, "get_creator", None) or registry.get_plugin_creator
    if get("AllReduce", "1", _NAMESPACE.decode()) is None:
        raise EngineUnavailableError(
            f"{INIT_SYMBOL} in {cand.path} ({cand.found_by}) succeeded, but this TensorRT "
            f"{trt.__version__}'s plugin registry has no tensorrt_llm::AllReduce v1 creator: "
            "the library registered into another TensorRT. Use a TensorRT-LLM built for the "
            "installed TensorRT"
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


def loaded_trtllm_plugins() -> LoadedPlugins | None:
    """The TensorRT-LLM plugin library this process loaded, if any (loads nothing)."""
    return _DEFAULT.loaded


def load_trtllm_plugins(path: str | None = None) -> LoadedPlugins:
    """Load and register the TensorRT-LLM plugins (once per process); see the module doc."""
    return _DEFAULT.load(path)
