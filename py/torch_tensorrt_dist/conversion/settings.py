"""The collective settings of the conversion in progress (a context variable).

    with collective_settings("plugin", plugin_path="/opt/trtllm/lib"):
        current_impl()          # ImplChoice(impl="plugin", reason=...)   (choice.py)

Outside a ``collective_settings`` block (plain ``torch.compile(backend="torch_tensorrt")``)
the request comes from ``$TORCH_TENSORRT_DIST_COLLECTIVE_IMPL`` (default "auto") and a plugin
library from where each implementation searches for it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

__all__ = ["collective_settings", "current_settings", "plugin_path_setting"]

_settings: ContextVar[tuple[str, str | None] | None] = ContextVar(
    "torch_tensorrt_dist_collective_settings", default=None
)


@contextlib.contextmanager
def collective_settings(
    collective_impl: str = "auto", plugin_path: str | None = None
) -> Iterator[None]:
    """Use these settings (instead of the environment) for conversions inside the block."""
    token = _settings.set((collective_impl, plugin_path))
    try:
        yield
    finally:
        _settings.reset(token)


def current_settings() -> tuple[str, str | None]:
    """``(collective_impl, plugin_path)`` of the enclosing block, else ``("auto", None)``."""
    return _settings.get() or ("auto", None)


def plugin_path_setting() -> str | None:
    """The plugin library path of the enclosing ``collective_settings`` block (or None)."""
    current = _settings.get()
    return None if current is None else current[1]
