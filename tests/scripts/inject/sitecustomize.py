"""Test-only fault injection into launched ranks: put this folder first on PYTHONPATH and set

    TORCH_TENSORRT_DIST_TEST_FAULT="RANK:MODULE:ATTRIBUTE:EXCEPTION:MESSAGE"

e.g. ``1:torch_tensorrt_dist.models.safetensors_io:SafetensorsReader.read_into:OSError:disk``.
Once MODULE is imported, ATTRIBUTE (a function, or ``Class.method``) raises
``EXCEPTION(MESSAGE)`` when called in the process whose ``RANK`` is RANK (read at call time:
torchrun's function entries get their variables after start). EXCEPTION is a builtin or a
class of ``torch_tensorrt_dist.errors``. Python imports this file at start-up in every process
that has the folder on its path, so it works in ranks the CLI starts itself.
"""

from __future__ import annotations

import builtins
import functools
import importlib.abc
import importlib.machinery
import os
import sys
from typing import Any

_SPEC = os.environ.get("TORCH_TENSORRT_DIST_TEST_FAULT")


def _exception(name: str) -> type[BaseException]:
    found = getattr(builtins, name, None)
    if found is None:
        from torch_tensorrt_dist import errors

        found = getattr(errors, name)
    return found  # type: ignore[no-any-return]


def _patch(module: Any, rank: str, attribute: str, exc_name: str, message: str) -> None:
    owner_name, _, name = attribute.rpartition(".")
    owner = getattr(module, owner_name) if owner_name else module
    original = getattr(owner, name)

    @functools.wraps(original)
    def faulty(*args: Any, **kwargs: Any) -> Any:
        if os.environ.get("RANK") == rank:
            raise _exception(exc_name)(message)
        return original(*args, **kwargs)

    setattr(owner, name, faulty)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, rank: str, target: str, attribute: str, exc: str, message: str) -> None:
        self.args = (rank, attribute, exc, message)
        self.target = target

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != self.target:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader, args = spec.loader, self.args
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _patch(module, *args)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if _SPEC:
    _rank, _module, _attribute, _exc, _message = _SPEC.split(":", 4)
    sys.meta_path.insert(0, _Finder(_rank, _module, _attribute, _exc, _message))
