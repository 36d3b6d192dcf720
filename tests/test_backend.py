"""Backend settings and engine selection."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import torch_tensorrt_dist  # noqa: F401
from torch_tensorrt_dist.backend.settings import ENV_COLLECTIVE_IMPL, CompileSettings
from torch_tensorrt_dist.errors import ConfigError, EngineUnavailableError


def test_unknown_option_suggests_the_close_name() -> None:
    with pytest.raises(ConfigError, match=r"unknown torch_tensorrt_dist option 'engin'.*'engine'"):
        CompileSettings.from_options({"engin": "eager"})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"engine": "trt"}, "engine='trt' is not one of tensorrt, inductor, eager"),
        ({"collective_impl": "mpi"}, "collective_impl='mpi' is not one of auto, native, plugin"),
        ({"schedule_timeout_s": 0}, "schedule_timeout_s must be > 0"),
    ],
)
def test_bad_values_are_config_errors(options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        CompileSettings.from_options(options)


def test_environment_sets_the_collective_impl_unless_given(monkeypatch) -> None:
    monkeypatch.setenv(ENV_COLLECTIVE_IMPL, "Plugin")
    assert CompileSettings.from_options({}).collective_impl == "plugin"
    assert CompileSettings.from_options({"collective_impl": "native"}).collective_impl == "native"
    monkeypatch.setenv(ENV_COLLECTIVE_IMPL, "bogus")
    with pytest.raises(ConfigError, match="collective_impl='bogus'"):
        CompileSettings.from_options({})


@pytest.mark.skipif(
    importlib.util.find_spec("tensorrt") is not None, reason="TensorRT is installed here"
)
def test_tensorrt_engine_never_falls_back_silently() -> None:
    torch._dynamo.reset()
    compiled = torch.compile(
        torch.nn.Linear(4, 4), backend="torch_tensorrt_dist", options={"engine": "tensorrt"}
    )
    with pytest.raises(Exception, match=r"pip install 'torch_tensorrt_dist\[tensorrt\]'") as info:
        compiled(torch.randn(2, 4))
    chain = [info.value, getattr(info.value, "inner_exception", None)]  # Dynamo wraps it
    assert any(isinstance(e, EngineUnavailableError) for e in chain), chain


def test_eager_engine_on_a_model_without_collectives_matches_eager() -> None:
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x = torch.randn(3, 4)
    compiled = torch.compile(model, backend="torch_tensorrt_dist", options={"engine": "eager"})
    with torch.no_grad():
        assert torch.equal(compiled(x), model(x))
