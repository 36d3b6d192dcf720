"""Which collective implementation this process can use (imports TensorRT lazily).

    with collective_settings("plugin", plugin_path="/opt/trtllm/lib"):
        current_impl()          # ImplChoice(impl="plugin", reason=...)

Outside a ``collective_settings`` block (plain ``torch.compile(backend="torch_tensorrt")``)
the request comes from ``$TORCH_TENSORRT_DIST_COLLECTIVE_IMPL`` (default "auto") and the plugin
library from ``$TRTLLM_PLUGINS_PATH`` or the search in ``plugin_loader``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from collections.abc import Iterator
from contextvars import ContextVar

from torch_tensorrt_dist.conversion.capability import ImplChoice, requested_impl, select_impl
from torch_tensorrt_dist.errors import ConfigError, EngineUnavailableError

__all__ = [
    "bound_communicator_ranks",
    "collective_settings",
    "current_impl",
    "native_members",
    "native_missing",
    "plugin_missing",
    "plugin_path_setting",
    "require_tensorrt_engine",
    "tensorrt_engine_missing",
]

_settings: ContextVar[tuple[str, str | None] | None] = ContextVar(
    "torch_tensorrt_dist_collective_settings", default=None
)
_PIP = "pip install 'torch_tensorrt_dist[tensorrt]'"


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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


_IMPORT_CHECK = "import tensorrt, torch_tensorrt"


def tensorrt_engine_missing(*, isolated: bool = False) -> str | None:
    """None if ``engine="tensorrt"`` can run here (TensorRT and Torch-TensorRT import), else
    one line saying what is missing and how to fix it.

    Torch-TensorRT without TensorRT's libraries raises a bare ``Exception`` at import, and may
    touch CUDA; ``isolated=True`` tries the import in a child process (for a launcher that must
    stay free of CUDA state) instead of this one.
    """
    fix = f"{_PIP} on a machine with an NVIDIA GPU and driver, or use --engine inductor/eager"
    if importlib.util.find_spec("tensorrt") is None:
        return f"engine='tensorrt' needs TensorRT, which is not installed: {fix}"
    if importlib.util.find_spec("torch_tensorrt") is None:
        return (
            "engine='tensorrt' needs Torch-TensorRT (torch-tensorrt>=2.14,<2.15), which is not "
            f"installed: {fix}"
        )
    if isolated:
        import subprocess
        import sys

        proc = subprocess.run(
            [sys.executable, "-c", _IMPORT_CHECK], capture_output=True, text=True, check=False
        )
        if proc.returncode == 0:
            return None
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        found = next((ln for ln in reversed(lines) if "Error" in ln or "Exception" in ln), "")
        return (
            "engine='tensorrt' needs TensorRT and Torch-TensorRT, but they cannot be imported "
            f"here ({found.strip() or f'exit code {proc.returncode}'}): {fix}"
        )
    try:
        import tensorrt  # noqa: F401
    except Exception as exc:
        reason = _first_line(exc)
        return f"engine='tensorrt' needs TensorRT, which cannot be imported ({reason}): {fix}"
    try:
        import torch_tensorrt  # noqa: F401
    except Exception as exc:  # a bare Exception where libnvinfer is missing
        return (
            "engine='tensorrt' needs Torch-TensorRT, which cannot be imported "
            f"({_first_line(exc)}): {fix}"
        )
    return None


def require_tensorrt_engine() -> None:
    """Raise :class:`EngineUnavailableError` (one line, what to install) unless
    ``engine="tensorrt"`` can run here."""
    problem = tensorrt_engine_missing()
    if problem is not None:
        raise EngineUnavailableError(problem)


@functools.lru_cache(maxsize=1)
def native_members() -> frozenset[str] | None:
    """``CollectiveOperation.X`` / ``ReduceOperation.X`` members the installed TensorRT has
    (ALL_TO_ALL only from 11.0); None where TensorRT cannot be imported (nothing to check)."""
    if importlib.util.find_spec("tensorrt") is None:
        return None
    try:
        import tensorrt as trt
    except Exception:
        return None
    members: set[str] = set()
    for enum in ("CollectiveOperation", "ReduceOperation"):
        values = getattr(trt, enum, None)
        if values is not None:
            members.update(f"{enum}.{m}" for m in dir(values) if m.isupper())
    return frozenset(members)


@functools.lru_cache(maxsize=1)
def native_missing() -> str | None:
    """None if native DistCollective layers can be built and bound here, else why not."""
    if importlib.util.find_spec("tensorrt") is None:
        return f"TensorRT is not installed ({_PIP})"
    try:
        import tensorrt as trt
    except Exception as exc:
        return f"TensorRT cannot be imported ({_first_line(exc)})"
    if not hasattr(trt.INetworkDefinition, "add_dist_collective"):
        return f"TensorRT {trt.__version__} has no DistCollective layer (needs TensorRT >= 10.16)"
    if importlib.util.find_spec("torch_tensorrt") is None:
        return f"Torch-TensorRT is not installed ({_PIP})"
    try:
        from torch_tensorrt._features import ENABLED_FEATURES
    except Exception as exc:  # a bare Exception where libnvinfer is missing
        return f"Torch-TensorRT cannot be imported ({_first_line(exc)})"
    if not getattr(ENABLED_FEATURES, "native_trt_collectives", False):
        return (
            "the installed Torch-TensorRT runtime was built without NCCL collectives "
            "(ENABLED_FEATURES.native_trt_collectives is False), so it cannot bind a "
            "communicator to an engine"
        )
    return None


def plugin_missing(plugin_path: str | None = None) -> str | None:
    """None if the TensorRT-LLM plugins are registered (loading them if needed), else why not."""
    if importlib.util.find_spec("tensorrt") is None:
        return f"TensorRT is not installed ({_PIP})"
    from torch_tensorrt_dist.conversion.plugin_loader import load_trtllm_plugins

    try:
        load_trtllm_plugins(plugin_path)
    except (EngineUnavailableError, ConfigError) as exc:
        return str(exc)
    return None


def plugin_path_setting() -> str | None:
    """The plugin library path of the enclosing ``collective_settings`` block (or None)."""
    current = _settings.get()
    return None if current is None else current[1]


def current_impl(*, native_takes_all: bool = True) -> ImplChoice:
    """The implementation the converters use now (settings block, else environment).

    ``native_takes_all`` False (an engine with collectives on several groups) makes "auto"
    prefer our torch_nccl plugins over native DistCollective."""
    setting, plugin_path = _settings.get() or ("auto", None)
    requested = requested_impl(setting)
    native = native_missing() if requested in ("auto", "native") else "not requested"
    # --- torch_nccl (our csrc/ plugins) ---
    from torch_tensorrt_dist.conversion.torch_nccl_plugins import torch_nccl_missing

    ours = torch_nccl_missing() if requested in ("auto", "torch_nccl") else "not requested"
    auto_needs_plugin = native is not None and ours is not None
    # --- end torch_nccl ---
    wants_plugin = requested == "plugin" or (requested == "auto" and auto_needs_plugin)
    plugin = plugin_missing(plugin_path) if wants_plugin else "not requested"
    return select_impl(
        requested,
        native_missing=native,
        plugin_missing=plugin,
        torch_nccl_missing=ours,
        native_takes_all=native_takes_all,
    )


def bound_communicator_ranks() -> list[int] | None:
    """Global ranks of the process group Torch-TensorRT binds to engines here (its active
    ``distributed_context`` group, else the world); None where none is active."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    try:
        from torch_tensorrt.distributed._distributed import get_active_group
    except ImportError:
        return None
    group = get_active_group()
    return None if group is None else list(dist.get_process_group_ranks(group))
