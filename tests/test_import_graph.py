"""The package's import graph, read from the source (every ``import``, at module level or inside
a function): no import circle anywhere in the package, the core names no implementation, the
implementations do not import each other."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "py" / "torch_tensorrt_dist"
CONVERSION = "torch_tensorrt_dist.conversion"
REGISTRY = f"{CONVERSION}.impl"


def modules(package: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``package`` (itself a package)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (a ``from pkg import name`` edge goes to
    ``pkg.name`` when that is a module, else to ``pkg``)."""
    found = modules(package)
    top = package.name

    def owner(name: str) -> str | None:
        while name and name not in found:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in found}
    for name, path in found.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: Iterable[str] = ()
            if isinstance(node, ast.Import):
                targets = (alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = (
                    f"{base}.{a.name}" if f"{base}.{a.name}" in found else base for a in node.names
                )
            for target in targets:
                if target.split(".")[0] == top:
                    resolved = owner(target)
                    if resolved is not None and resolved != name:
                        graph[name].add(resolved)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: strongly connected components of two or more modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(PACKAGE)


def test_the_reader_finds_a_circle_made_by_a_lazy_import(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub.b import f\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import a\n")  # lazy, relative
    (pkg / "c.py").write_text("import pkg.a\n")
    found = import_graph(pkg)
    assert found["pkg.sub.b"] == {"pkg.a"} and found["pkg.c"] == {"pkg.a"}
    assert cycles(found) == [["pkg.a", "pkg.sub.b"]]


def test_no_import_circle_in_the_package(graph: dict[str, set[str]]) -> None:
    assert len(graph) > 100 and f"{CONVERSION}.choice" in graph[f"{CONVERSION}.capability"]
    assert cycles(graph) == []


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The same graph between the package's folders (``models``, ``parallel``...; a module at
    the top is a folder of its own, the package's ``__init__`` is left out): an edge where
    some module of one imports some module of the other."""
    top = PACKAGE.name

    def folder(module: str) -> str | None:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else None

    out: dict[str, set[str]] = {}
    for name, targets in graph.items():
        here = folder(name)
        if here is None:
            continue
        out.setdefault(here, set())
        for target in targets:
            there = folder(target)
            if there is not None and there != here and target.startswith(f"{top}."):
                out[here].add(there)
                out.setdefault(there, set())
    return out


def test_no_folder_imports_a_folder_that_imports_it_back(graph: dict[str, set[str]]) -> None:
    """The folders stand in floors: ``families`` (a spec per model family, compiled artifacts
    among them) above ``artifacts`` (their files) and ``parallel``, ``models`` below
    ``parallel`` (the loaders live beside the plans they apply), ``backend`` above
    ``conversion``; no folder reaches back up."""
    folders = folder_graph(graph)
    assert "artifacts" in folders["families"] and "parallel" in folders["families"]
    assert "models" in folders["parallel"] and "backend" in folders["generation"]
    assert cycles(folders) == []
    assert "parallel" not in folders["models"] and "backend" not in folders["conversion"]


def wrong_edges(graph: dict[str, set[str]]) -> list[str]:
    """A core module reaches the implementations only through the registry; an
    implementation imports the core and its own folder, never another folder or the registry
    (``conversion/__init__.py`` re-exports public names and is exempt)."""
    wrong = []
    for name, targets in sorted(graph.items()):
        if not name.startswith(f"{CONVERSION}."):
            continue
        folder = name.split(".")[3] if name.startswith(f"{REGISTRY}.") else None
        for target in sorted(targets):
            if not target.startswith(f"{REGISTRY}."):
                if folder is not None and target in (REGISTRY, CONVERSION):
                    wrong.append(f"{name} -> {target}")
                continue
            if name != REGISTRY and target.split(".")[3] != folder:
                wrong.append(f"{name} -> {target}")
    return wrong


def test_the_core_names_no_implementation(graph: dict[str, set[str]]) -> None:
    assert wrong_edges(graph) == []
    broken = {name: set(targets) for name, targets in graph.items()}
    for name, target in (
        ("converters", "impl.native.spec"),
        ("impl.trtllm.spec", "impl.torch_nccl.rules"),
        ("impl.native.rules", "impl"),
    ):
        broken[f"{CONVERSION}.{name}"].add(f"{CONVERSION}.{target}")
    assert [edge.replace(f"{CONVERSION}.", "") for edge in wrong_edges(broken)] == [
        "converters -> impl.native.spec",
        "impl.native.rules -> impl",
        "impl.trtllm.spec -> impl.torch_nccl.rules",
    ]
