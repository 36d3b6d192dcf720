"""The package's C++ ops on the CPU, built at first use: one library per source file.

    OP = CppOp("cpu_rows_mm", SOURCE, NAMESPACE, {"rows_mm": fake},
               "products of few rows stay Inductor's reductions")
    if OP.available():                     # built once per machine (about 10 s), then loaded
        torch.ops.tensorrt_dist_gemm.rows_mm(x, w)

:meth:`CppOp.available` builds the library (torch's ``cpp_extension``, under its lock: ranks
share one build) and loads it, once per process; where it cannot (no C++ compiler, a failed
build) it says False, with a warning saying why, and the caller keeps its reference path. The
library's name holds a hash of its source, the compile flags, torch's version and the CPU's
instruction-set flags (it is built with ``-march=native``): a cache shared by other machines or
other torch builds never loads a library built for another, and a library built before (by
any checkout of the package) is loaded as it is, without the build step. Each op gets its fake
implementation (for tracing) once it is loaded.
"""

from __future__ import annotations

import hashlib
import logging
import platform
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

__all__ = ["CFLAGS", "CppOp", "cpu_flags"]

logger = logging.getLogger(__name__)

CFLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math"]


def cpu_flags() -> str:
    """The CPU's instruction-set flags (Linux), else the machine's name."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return platform.machine() + platform.processor()


class CppOp:
    """The library of one C++ source and the ops it registers in ``namespace``.

    ``stem``: the library's name before its hash; ``fakes``: each op's fake implementation
    (its output's shape and dtype from its inputs'); ``fallback``: what the caller does where
    the library cannot be built (the warning's end)."""

    def __init__(
        self,
        stem: str,
        source: Path,
        namespace: str,
        fakes: Mapping[str, Callable[..., torch.Tensor]],
        fallback: str,
    ) -> None:
        self.stem, self.source, self.namespace = stem, source, namespace
        self.fakes, self.fallback = dict(fakes), fallback
        self.what = ", ".join(fakes)  # the ops' names, for the log
        self._lock = threading.Lock()
        self._ok: bool | None = None  # None: not tried yet
        self._reason = ""
        self._faked = False

    def library_name(self) -> str:
        """The library's name: a hash of what the built library depends on."""
        h = hashlib.sha256()
        h.update(self.source.read_bytes())
        for part in (" ".join(CFLAGS), torch.__version__, cpu_flags()):
            h.update(part.encode())
        return f"torchtrt_dist_{self.stem}_{h.hexdigest()[:16]}"

    def available(self) -> bool:
        """Build (once per machine and source) and load the library; False, with a warning
        saying why, where it cannot be built. Safe from several threads."""
        with self._lock:
            if self._ok is None:
                self._ok = self._load()
            return self._ok

    def unavailable_reason(self) -> str:
        """Why :meth:`available` said False ("" when it did not, or was not asked)."""
        return self._reason

    def _loaded(self) -> bool:
        ns = getattr(torch.ops, self.namespace)
        return all(hasattr(ns, op) for op in self.fakes)

    def _load(self) -> bool:
        if not self._loaded():  # else loaded by someone else in this process (a test)
            start = time.perf_counter()
            if not torch.cuda.is_available():  # its import warns that no CUDA runtime is found
                logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
            try:
                from torch.utils.cpp_extension import load

                name = self.library_name()
                logger.info("CPU %s op: building or loading %s", self.what, name)
                if not _load_built(name):
                    load(
                        name=name,
                        sources=[str(self.source)],
                        extra_cflags=CFLAGS,
                        is_python_module=False,
                        verbose=False,
                    )
            except Exception as exc:  # no compiler, a failed build: the caller's reference path
                self._reason = f"{type(exc).__name__}: {str(exc).strip()[-800:]}"
                logger.warning(
                    "the CPU %s op could not be built; %s (%s)",
                    self.what,
                    self.fallback,
                    self._reason,
                )
                return False
            logger.info("CPU %s op ready in %.1f s", self.what, time.perf_counter() - start)
        if not self._faked:
            for op, fake in self.fakes.items():
                torch.library.register_fake(f"{self.namespace}::{op}", fake)
            self._faked = True
        return True


def _load_built(name: str) -> bool:
    """Load the library ``name`` where a process built it before, without ``cpp_extension``'s
    build step; False where it is not built (or does not load). The name's hash says what it
    was built from, wherever the source lay: ``load`` would run ninja over a build file naming
    the source's path, and rebuild the same library where another checkout of the package
    loaded it last (10-30 s). Under the build's lock: a build under way finishes first."""
    from torch.utils._filelock import FileLock
    from torch.utils.cpp_extension import _get_build_directory

    build = Path(_get_build_directory(name, verbose=False))
    library = build / f"{name}.so"
    if not library.is_file():
        return False
    with FileLock(str(build / "lock")):
        try:
            torch.ops.load_library(str(library))
        except OSError as exc:  # a partial library (a killed build): build it again
            logger.info("CPU op library %s did not load (%s): building it", library, exc)
            return False
    return True
