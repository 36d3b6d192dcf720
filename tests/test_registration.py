"""The backend is reachable by name whether the package is installed (entry point, Dynamo
loaded lazily) or used from a source tree (registered on import)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from torch_tensorrt_dist._registration import backend_entry_point_installed

COMPILE = """
import torch
model = torch.nn.Linear(4, 3)
x = torch.randn(2, 4)
out = torch.compile(model, backend="torch_tensorrt_dist", options={"engine": "eager"})(x)
assert torch.allclose(out, model(x))
print("compiled")
"""


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=240
    )


@pytest.mark.skipif(not backend_entry_point_installed(), reason="package not pip-installed")
def test_installed_import_does_not_load_dynamo_and_the_backend_resolves() -> None:
    proc = _python(
        "import sys, torch_tensorrt_dist\n"
        "assert 'torch._dynamo' not in sys.modules, 'import pulled in Dynamo'\n" + COMPILE
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "compiled" in proc.stdout


def test_source_tree_import_registers_the_backend() -> None:
    # hide the installed entry points, as in a plain checkout on PYTHONPATH
    proc = _python(
        "import importlib.metadata as md\n"
        "real = md.entry_points\n"
        "def hide(**kw):\n"
        "    group = kw.get('group')\n"
        "    return md.EntryPoints(()) if group == 'torch_dynamo_backends' else real(**kw)\n"
        "md.entry_points = hide\n"
        "import sys, torch_tensorrt_dist\n"
        "assert 'torch._dynamo' in sys.modules\n" + COMPILE
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "compiled" in proc.stdout
