"""Register with Torch-TensorRT when (and only when) Torch-TensorRT itself gets imported.

``import torch_tensorrt_dist`` never imports Torch-TensorRT: where it is installed but cannot
load (no libnvinfer: a bare ``Exception``; no GPU: ``torch.cuda.get_device_capability()`` at its
import, which also creates a CUDA context on GPU 0 in every rank) our import, the inductor and
eager engines, the CLI and the launcher must still work. Instead an import hook waits for
``torch_tensorrt``: the user's ``import torch_tensorrt`` (which ``backend="torch_tensorrt"``
needs: Torch-TensorRT registers that backend when imported, it declares no entry point) or our
``engine="tensorrt"``. Right after its package finishes
importing, our lowering pass and converters are registered with it, so
``torch.compile(model, backend="torch_tensorrt")`` after ``import torch_tensorrt_dist`` still
takes sharded models. If Torch-TensorRT is already imported, registration happens now.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

__all__ = ["TARGET", "AfterImportHook", "install"]

logger = logging.getLogger(__name__)

TARGET = "torch_tensorrt"
_lock = threading.Lock()


class _ThenLoader(importlib.abc.Loader):
    """Runs the real loader, then ``then()`` (errors there are logged, never raised)."""

    def __init__(self, loader: Any, then: Callable[[], None]) -> None:
        self._loader = loader
        self._then = then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        result: ModuleType | None = self._loader.create_module(spec)
        return result

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)  # a failing Torch-TensorRT import raises here, as usual
        self.exec_after()

    def exec_after(self) -> None:
        try:
            self._then()
        except Exception as exc:  # never break the user's own import of torch_tensorrt
            logger.warning("torch_tensorrt_dist could not register with Torch-TensorRT: %s", exc)

    def __getattr__(self, name: str) -> Any:  # is_package, get_code, get_resource_reader...
        return getattr(self._loader, name)


class AfterImportHook(importlib.abc.MetaPathFinder):
    """A ``sys.meta_path`` entry that calls ``then()`` once ``name`` has been imported."""

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name = name
        self.then = then

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        with _lock:
            if self in sys.meta_path:
                sys.meta_path.remove(self)  # once; and the search below must not find us
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _ThenLoader(spec.loader, self.then)
        return spec


def _register() -> None:
    from torch_tensorrt_dist.conversion.registration import register_with_torch_tensorrt

    register_with_torch_tensorrt()


def install(name: str = TARGET, then: Callable[[], None] = _register) -> AfterImportHook | None:
    """Call ``then`` after ``name`` is imported (now, if it already is); returns the hook."""
    if name in sys.modules:
        _ThenLoader(None, then).exec_after()
        return None
    if importlib.util.find_spec(name) is None:  # not installed: nothing to wait for
        return None
    hook = AfterImportHook(name, then)
    with _lock:
        sys.meta_path.insert(0, hook)
    return hook


install()
