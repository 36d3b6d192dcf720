"""Torch-TensorRT installed but unusable (no libnvinfer, no GPU): everything but
``engine="tensorrt"`` works, and that engine fails with one line naming what is missing.

``import torch_tensorrt_dist`` never imports Torch-TensorRT; our registration waits for it to be
imported (the import hook in ``conversion/_autoregister.py``). The stand-in packages below
reproduce the two behaviours the hook and the checks depend on (an importable package; a
package whose import raises a bare ``Exception``, as the real wheel does without libnvinfer).
The last test uses the real torch-tensorrt 2.14.0 wheel installed without TensorRT, where
``.ci/run`` (or the command in its skip reason) put it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ._serve import demo_with_layers

REPO = Path(__file__).resolve().parents[1]
_DEFAULT_NOLIB = REPO / ".ci" / "cache" / "torch_tensorrt_nolib"
NOLIB = Path(os.environ.get("TORCH_TENSORRT_NOLIB_DIR", _DEFAULT_NOLIB))


def _python(code: str, path: Path | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(path), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        check=False,
    )


def _package(root: Path, name: str, body: str) -> Path:
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text(textwrap.dedent(body))
    return root


def test_import_waits_for_torch_tensorrt_then_registers_once(tmp_path: Path) -> None:
    root = _package(tmp_path, "torch_tensorrt", "LOADED = True\n")
    proc = _python(
        """
        import sys
        import torch_tensorrt_dist
        from torch_tensorrt_dist.conversion import registration
        calls = []
        registration.register_with_torch_tensorrt = lambda strict=False: calls.append(
            "torch_tensorrt" in sys.modules and sys.modules["torch_tensorrt"].LOADED)
        assert "torch_tensorrt" not in sys.modules, "imported at our import"
        assert calls == []
        import torch_tensorrt
        import torch_tensorrt  # a second import registers nothing more
        print(calls)
        """,
        root,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[True]"  # once, after the package finished importing


def test_a_torch_tensorrt_that_raises_at_import_breaks_nothing_else(tmp_path: Path) -> None:
    root = _package(tmp_path, "tensorrt", "__version__ = '11.1.0'\n")
    _package(root, "torch_tensorrt", "raise Exception('Could not find libnvinfer.so.11')\n")
    proc = _python(
        """
        import torch, torch_tensorrt_dist
        from torch_tensorrt_dist.conversion.availability import tensorrt_engine_missing
        print(tensorrt_engine_missing())
        f = torch.compile(lambda x: x * 2, backend="torch_tensorrt_dist",
                          options={"engine": "eager"})
        assert f(torch.ones(2)).tolist() == [2.0, 2.0]
        try:
            torch.compile(lambda x: x * 3, backend="torch_tensorrt_dist",
                          options={"engine": "tensorrt"})(torch.ones(2))
        except Exception as exc:
            print(type(exc).__name__, "|", str(exc).replace("\\n", " "))
        """,
        root,
    )
    assert proc.returncode == 0, proc.stderr
    missing, compiled = proc.stdout.strip().splitlines()[:2]
    assert missing.startswith("engine='tensorrt' needs Torch-TensorRT, which cannot be imported")
    assert "Could not find libnvinfer.so.11" in missing
    assert "EngineUnavailableError" in compiled and "libnvinfer" in compiled


@pytest.mark.skipif(
    not (NOLIB / "torch_tensorrt").is_dir(),
    reason=f"the real torch-tensorrt wheel without TensorRT is not at {NOLIB}: run "
    f"`pip install --no-deps --target {NOLIB} torch-tensorrt==2.14.0` (.ci/run does)",
)
def test_real_torch_tensorrt_wheel_without_tensorrt_libraries(tmp_path: Path) -> None:
    cli = "import sys; from torch_tensorrt_dist.cli import main; sys.exit(main(sys.argv[1:]))"
    # first, in the same interpreter (one start less): our import leaves torch_tensorrt alone
    imported = "import torch_tensorrt_dist, sys; print('torch_tensorrt' in sys.modules)\n"
    trt = _python(imported + cli, NOLIB, "generate", "--tp", "2", "--engine", "tensorrt")
    assert trt.stdout.splitlines()[0] == "False", (trt.stdout, trt.stderr)
    assert trt.returncode == 2
    [line] = trt.stderr.strip().splitlines()
    assert line.startswith("error: engine='tensorrt' needs TensorRT") and "pip install" in line
    # the demo model cut to one layer: the eager engine compiles it in a third of the time
    model = str(demo_with_layers(tmp_path / "demo1", 1))
    generate = ("generate", "--model", model, "--engine", "eager", "--max-new-tokens", "2")
    ok = _python(cli, NOLIB, *generate, "--json")
    assert ok.returncode == 0, ok.stderr
    assert '"engine": "eager"' in ok.stdout
