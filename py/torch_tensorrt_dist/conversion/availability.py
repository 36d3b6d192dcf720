"""Whether ``engine="tensorrt"`` can run here (TensorRT and Torch-TensorRT import), and the
helpers each implementation's own availability check (``impl/<folder>/availability.py``)
uses. Imports TensorRT lazily.
"""

from __future__ import annotations

import importlib.util

from torch_tensorrt_dist.errors import EngineUnavailableError

__all__ = [
    "PIP_INSTALL",
    "first_line",
    "require_tensorrt_engine",
    "tensorrt_engine_missing",
]

PIP_INSTALL = "pip install 'torch_tensorrt_dist[tensorrt]'"


def first_line(exc: BaseException) -> str:
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
    fix = (
        f"{PIP_INSTALL} on a machine with an NVIDIA GPU and driver, or use --engine inductor/eager"
    )
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
        reason = first_line(exc)
        return f"engine='tensorrt' needs TensorRT, which cannot be imported ({reason}): {fix}"
    try:
        import torch_tensorrt  # noqa: F401
    except Exception as exc:  # a bare Exception where libnvinfer is missing
        return (
            "engine='tensorrt' needs Torch-TensorRT, which cannot be imported "
            f"({first_line(exc)}): {fix}"
        )
    return None


def require_tensorrt_engine(*, isolated: bool = False) -> None:
    """Raise :class:`EngineUnavailableError` (one line, what to install) unless
    ``engine="tensorrt"`` can run here (``isolated``: see :func:`tensorrt_engine_missing`; the
    commands check so before any rank starts)."""
    problem = tensorrt_engine_missing(isolated=isolated)
    if problem is not None:
        raise EngineUnavailableError(problem)
