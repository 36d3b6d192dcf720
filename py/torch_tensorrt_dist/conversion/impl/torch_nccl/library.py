"""Find and load our collective plugin library (``csrc/``) with ctypes, beside torch.

    lib = load_torch_nccl_plugins()      # or load_torch_nccl_plugins("/path/to/the/.so")
    lib.path, lib.found_by, lib.nccl_version()   # (2, 30, 7): the NCCL torch loaded

Search order: the explicit argument, ``$TORCH_TENSORRT_DIST_PLUGINS_LIB`` (a file or its
folder), then the folder ``torchtrt-dist build-plugins`` builds into (``default_build_dir()``:
``$XDG_CACHE_HOME/torch_tensorrt_dist/plugins``, else ``~/.cache/torch_tensorrt_dist/plugins``).
An explicit argument or variable that names a missing file is an error, never skipped.

The library resolves NCCL itself at run time: the ``libnccl.so.2`` torch already loaded
(``dlopen(..., RTLD_NOLOAD)``), else the ``nvidia-nccl`` wheel's copy that
``nccl_library.find_torch_nccl`` names, so torch, TensorRT and the plugins share one NCCL.
Registering communicators is ``comms.py``'s job; this module is the ctypes shell.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from torch_tensorrt_dist.errors import ConfigError, EngineUnavailableError

__all__ = [
    "ABI_VERSION",
    "ENV_PLUGINS_LIB",
    "LIB_NAME",
    "OP_NUMBER",
    "TorchNcclPlugins",
    "default_build_dir",
    "find_torch_nccl_library",
    "load_torch_nccl_plugins",
]

logger = logging.getLogger(__name__)

LIB_NAME = "libtorchtrt_dist_plugins.so"
ENV_PLUGINS_LIB = "TORCH_TENSORRT_DIST_PLUGINS_LIB"
#: the C API version this module speaks (``ttd_abi_version`` in ``csrc/exports.cpp``)
ABI_VERSION = 1
#: ``CollectiveOp`` numbers of ``csrc/collective_config.h``
OP_NUMBER: dict[str, int] = {
    "all_reduce": 0,
    "all_gather": 1,
    "reduce_scatter": 2,
    "all_to_all": 3,
    "broadcast": 4,
}
_BUILD = "build it with `torchtrt-dist build-plugins` (needs TensorRT, CUDA and NCCL headers)"

_lock = threading.Lock()
_loaded: dict[str, TorchNcclPlugins] = {}


def default_build_dir(env: Mapping[str, str] | None = None) -> str:
    """The folder ``torchtrt-dist build-plugins`` builds into (and the loader looks in)."""
    env = os.environ if env is None else env
    cache = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "torch_tensorrt_dist", "plugins")


def _as_library(path: str) -> str:
    return os.path.join(path, LIB_NAME) if os.path.isdir(path) else path


def find_torch_nccl_library(
    path: str | None = None, env: Mapping[str, str] | None = None
) -> tuple[str, str] | None:
    """``(library path, how it was found)``, or None where no library is built.

    Raises :class:`ConfigError` when the argument or ``$TORCH_TENSORRT_DIST_PLUGINS_LIB``
    names a file that does not exist."""
    env = os.environ if env is None else env
    for found_by, value in (("argument", path), (ENV_PLUGINS_LIB, env.get(ENV_PLUGINS_LIB))):
        if value:
            library = _as_library(os.path.expanduser(value))
            if not os.path.isfile(library):
                raise ConfigError(f"{found_by} names {library}, which does not exist; {_BUILD}")
            return library, found_by
    library = os.path.join(default_build_dir(env), LIB_NAME)
    return (library, "build-plugins") if os.path.isfile(library) else None


class TorchNcclPlugins:
    """The loaded library: its communicator registry and NCCL, through its C API."""

    def __init__(self, path: str, found_by: str, handle: Any) -> None:
        self.path = path
        self.found_by = found_by
        self._lib = handle
        lib = handle
        lib.ttd_abi_version.restype = ctypes.c_int32
        lib.ttd_last_error.restype = ctypes.c_char_p
        lib.ttd_register_communicator.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p]
        lib.ttd_register_communicator.restype = ctypes.c_int32
        lib.ttd_unregister_communicator.argtypes = [ctypes.c_void_p, ctypes.c_int32]
        lib.ttd_unregister_communicator.restype = ctypes.c_int32
        lib.ttd_find_communicator.argtypes = [ctypes.c_void_p, ctypes.c_int32]
        lib.ttd_find_communicator.restype = ctypes.c_void_p
        lib.ttd_communicator_count.restype = ctypes.c_int32
        lib.ttd_set_nccl_library.argtypes = [ctypes.c_char_p]
        lib.ttd_set_nccl_library.restype = ctypes.c_int32
        lib.ttd_nccl_version.restype = ctypes.c_int32
        lib.ttd_nccl_path.restype = ctypes.c_char_p
        lib.ttd_run_plugin.argtypes = [
            ctypes.c_int32,
            ctypes.c_void_p,
            ctypes.c_int32,
            ctypes.c_int32,
            ctypes.c_int32,
            ctypes.c_int32,
            ctypes.c_void_p,
            ctypes.c_int32,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        lib.ttd_run_plugin.restype = ctypes.c_int32
        abi = int(lib.ttd_abi_version())
        if abi != ABI_VERSION:
            raise EngineUnavailableError(
                f"{path} speaks C API {abi}, this package speaks {ABI_VERSION}; rebuild it with "
                "`torchtrt-dist build-plugins`"
            )

    def last_error(self) -> str:
        return (self._lib.ttd_last_error() or b"").decode(errors="replace")

    @staticmethod
    def _ranks(group_ranks: Sequence[int]) -> tuple[Any, int]:
        ranks = [int(r) for r in group_ranks]
        return (ctypes.c_int32 * len(ranks))(*ranks), len(ranks)

    # ---- the communicator registry (keyed by the group's ordered global ranks) ----------
    def register(self, group_ranks: Sequence[int], comm_ptr: int) -> None:
        array, n = self._ranks(group_ranks)
        if self._lib.ttd_register_communicator(array, n, ctypes.c_void_p(comm_ptr)) != 0:
            raise ConfigError(
                f"cannot register communicator {comm_ptr:#x} for group {list(group_ranks)}: "
                f"{self.last_error()}"
            )

    def unregister(self, group_ranks: Sequence[int]) -> bool:
        array, n = self._ranks(group_ranks)
        return bool(self._lib.ttd_unregister_communicator(array, n))

    def lookup(self, group_ranks: Sequence[int]) -> int | None:
        array, n = self._ranks(group_ranks)
        return self._lib.ttd_find_communicator(array, n) or None

    def count(self) -> int:
        return int(self._lib.ttd_communicator_count())

    def clear(self) -> None:
        self._lib.ttd_clear_communicators()

    # ---- NCCL ---------------------------------------------------------------------------
    def nccl_version(self) -> tuple[int, int, int]:
        """``ncclGetVersion`` of the NCCL the plugins use (no GPU needed)."""
        code = int(self._lib.ttd_nccl_version())
        if code < 0:
            from torch_tensorrt_dist.conversion.nccl_library import find_torch_nccl

            wheel = find_torch_nccl()
            if wheel is None or self._lib.ttd_set_nccl_library(wheel.encode()) != 0:
                raise EngineUnavailableError(f"the plugins found no NCCL: {self.last_error()}")
            code = int(self._lib.ttd_nccl_version())
        # NCCL >= 2.9 codes are major*10000 + minor*100 + patch
        return code // 10000, code % 10000 // 100, code % 100

    def nccl_path(self) -> str:
        return (self._lib.ttd_nccl_path() or b"").decode(errors="replace")

    def use_nccl(self, path: str) -> None:
        """Use the NCCL at ``path`` (call before the first collective)."""
        if self._lib.ttd_set_nccl_library(path.encode()) != 0:
            raise EngineUnavailableError(f"cannot use NCCL at {path}: {self.last_error()}")

    def run_plugin(
        self,
        op: str,
        group_ranks: Sequence[int],
        type_id: int,
        shape: Sequence[int],
        input_ptr: int,
        output_ptr: int,
        stream: int,
        *,
        reduce_op: int = 0,
        root: int = 0,
    ) -> int:
        """Create the runtime plugin for ``op`` through its creator and run its enqueue on
        device pointers (what an engine does; for tests without TensorRT). Returns its status."""
        array, n = self._ranks(group_ranks)
        dims = (ctypes.c_int64 * len(shape))(*[int(s) for s in shape])
        return int(
            self._lib.ttd_run_plugin(
                OP_NUMBER[op],
                array,
                n,
                type_id,
                reduce_op,
                root,
                dims,
                len(shape),
                ctypes.c_void_p(input_ptr),
                ctypes.c_void_p(output_ptr),
                ctypes.c_void_p(stream),
            )
        )


def load_torch_nccl_plugins(
    path: str | None = None, env: Mapping[str, str] | None = None
) -> TorchNcclPlugins:
    """Load the plugin library once per path (``RTLD_LOCAL``: only TensorRT and we see it)."""
    found = find_torch_nccl_library(path, env)
    if found is None:
        raise EngineUnavailableError(
            f"our collective plugin library ({LIB_NAME}) is not built: not in "
            f"{default_build_dir(env)} and ${ENV_PLUGINS_LIB} is unset; {_BUILD}"
        )
    library, found_by = found
    with _lock:
        key = os.path.realpath(library)
        if key not in _loaded:
            import torch  # noqa: F401  # loads libnccl.so.2, which the library then shares

            try:
                handle = ctypes.CDLL(library, mode=ctypes.RTLD_LOCAL)
            except OSError as exc:
                raise EngineUnavailableError(f"cannot load {library}: {exc}; {_BUILD}") from exc
            _loaded[key] = TorchNcclPlugins(library, found_by, handle)
            logger.debug("loaded %s (found by %s)", library, found_by)
        return _loaded[key]
