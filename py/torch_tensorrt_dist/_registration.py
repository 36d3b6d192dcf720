"""How the ``"torch_tensorrt_dist"`` Dynamo backend gets registered.

Installed (``pip install``), the package declares it as a ``torch_dynamo_backends`` entry
point: Dynamo loads it the first time ``torch.compile(backend="torch_tensorrt_dist")`` looks it
up, so ``import torch_tensorrt_dist`` need not import Dynamo (about 2 s per process). Used from
a source tree that is not installed, the package registers it on import instead.
"""

from __future__ import annotations

import functools
from importlib.metadata import entry_points

__all__ = ["BACKEND_NAME", "ENTRY_POINT_GROUP", "backend_entry_point_installed"]

BACKEND_NAME = "torch_tensorrt_dist"
ENTRY_POINT_GROUP = "torch_dynamo_backends"


@functools.cache
def backend_entry_point_installed() -> bool:
    """True when an installed distribution declares our backend as a Dynamo entry point."""
    return any(
        ep.name == BACKEND_NAME and ep.value.startswith("torch_tensorrt_dist.")
        for ep in entry_points(group=ENTRY_POINT_GROUP)
    )
