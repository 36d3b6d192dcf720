"""How the package's C++ ops are built (``ops/_cpp_build.py``): the library's name, one build
per process, a failed build as False and why, an op loaded already, and its fake."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from torch_tensorrt_dist.ops import _cpp_build, cpu_attention, cpu_rows_mm
from torch_tensorrt_dist.ops._cpp_build import CppOp

NS = "tensorrt_dist_build_test"


def _fake(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0], 2 * x.shape[1]))


def test_the_name_holds_the_stem_and_a_hash_of_the_source(tmp_path: Path) -> None:
    src = tmp_path / "op.cpp"
    src.write_text("// one\n")
    op = CppOp("cpu_thing", src, NS, {"nothing": _fake}, "none")
    first = op.library_name()
    assert (
        first.startswith("torchtrt_dist_cpu_thing_")
        and len(first) == len("torchtrt_dist_cpu_thing_") + 16
    )
    assert op.library_name() == first
    src.write_text("// two\n")
    assert op.library_name() != first
    # the ops of the package keep their names (a library built before is found again)
    assert cpu_rows_mm.library_name().startswith("torchtrt_dist_cpu_rows_mm_")
    assert cpu_attention.library_name().startswith("torchtrt_dist_cpu_attention_")


def test_a_failed_build_is_tried_once_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import torch.utils.cpp_extension as ext

    calls: list[str] = []

    def load(*, name: str, **_: object) -> None:
        calls.append(name)
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(ext, "load", load)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))  # nothing left in ~/.cache
    src = tmp_path / "op.cpp"
    src.write_text("// never built\n")
    op = CppOp("cpu_missing", src, NS, {"missing": _fake}, "the reference stays")
    assert op.unavailable_reason() == ""
    results: list[bool] = []

    def ask() -> None:
        results.append(op.available())

    with caplog.at_level(logging.WARNING, logger=_cpp_build.__name__):
        threads = [threading.Thread(target=ask) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not op.available()
    assert results == [False] * 4
    assert calls == [op.library_name()]  # one try, whatever the threads
    assert op.unavailable_reason() == "RuntimeError: no compiler here"
    warned = [r.getMessage() for r in caplog.records]
    assert warned == [
        "the CPU missing op could not be built; the reference stays (RuntimeError: no compiler "
        "here)"
    ]


def test_an_op_loaded_already_is_not_built_and_gets_its_fake(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch.utils.cpp_extension as ext

    def load(**_: object) -> None:
        raise AssertionError("built although loaded")

    monkeypatch.setattr(ext, "load", load)
    lib = torch.library.Library(NS, "FRAGMENT")  # as a loaded library registers its op
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: torch.cat([x, x], dim=1), "CPU")
    src = tmp_path / "op.cpp"
    src.write_text("// loaded already\n")
    op = CppOp("cpu_twice", src, NS, {"twice": _fake}, "none")
    assert op.available() and op.available()
    x = torch.ones(3, 4)
    assert torch.equal(getattr(torch.ops, NS).twice(x), torch.ones(3, 8))
    with FakeTensorMode() as mode:  # tracing sees the fake's shape
        y = getattr(torch.ops, NS).twice(mode.from_tensor(x))
    assert tuple(y.shape) == (3, 8)


@pytest.mark.parametrize("loads", [True, False], ids=["built", "partial"])
def test_a_library_built_before_is_loaded_without_the_build_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loads: bool
) -> None:
    """A library of the op's name in torch's extension folder (built by any checkout: the
    name hashes the source, not its path) is loaded as it is; one that does not load (a
    killed build's) is built again by ``cpp_extension.load``."""
    import torch.utils.cpp_extension as ext

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    src = tmp_path / "op.cpp"
    src.write_text(f"// built before: {loads}\n")
    op = CppOp(f"cpu_before_{loads}", src, NS, {f"before_{loads}": _fake}, "none")
    name = op.library_name()
    (tmp_path / "ext" / name).mkdir(parents=True)
    (tmp_path / "ext" / name / f"{name}.so").write_bytes(b"")
    opened, built = [], []

    def register() -> None:
        lib = torch.library.Library(NS, "FRAGMENT")  # what the library registers
        lib.define(f"before_{loads}(Tensor x) -> Tensor")
        lib.impl(f"before_{loads}", lambda x: torch.cat([x, x], dim=1), "CPU")
        opened.append(lib)

    def load_library(path: str) -> None:
        assert path == str(tmp_path / "ext" / name / f"{name}.so")
        if not loads:
            raise OSError("file too short")
        register()

    def load(*, name: str, **_: object) -> None:
        built.append(name)
        register()

    monkeypatch.setattr(torch.ops, "load_library", load_library)
    monkeypatch.setattr(ext, "load", load)
    assert op.available()
    assert built == ([] if loads else [name])
    assert torch.equal(
        getattr(getattr(torch.ops, NS), f"before_{loads}")(torch.ones(1, 2)), torch.ones(1, 4)
    )
