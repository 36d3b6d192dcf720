"""Per-block compile with our backend: each transformer block compiled on its own.

    torch_tensorrt_dist.compile_blocks(model, options={"engine": "inductor"})

What torchtitan's ``apply_compile`` does (``block.compile(backend=..., fullgraph=True)`` for each
child of ``model.layers``), with the ``torch_tensorrt_dist`` backend and its options. Blocks of
one kind share one compiled graph (Dynamo caches it on the code, not the module), so a model of
32 blocks compiles about one graph, not 32; the code between blocks (embedding, final norm,
output) runs eagerly, collectives included. ``explain`` on such a model explains each block
and counts the runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from torch_tensorrt_dist._registration import BACKEND_NAME
from torch_tensorrt_dist.backend.settings import CompileSettings
from torch_tensorrt_dist.errors import ConfigError

__all__ = ["compile_blocks"]


def compile_blocks(
    model: torch.nn.Module,
    *,
    blocks: str = "layers",
    options: Mapping[str, Any] | None = None,
    fullgraph: bool = True,
    dynamic: bool | None = None,
) -> list[str]:
    """Compile each child of ``model.<blocks>`` with the ``torch_tensorrt_dist`` backend.

    ``blocks`` names the module that holds the blocks (torchtitan, gpt-fast and our models:
    ``layers``; HF transformers: ``model.layers``). ``options`` are the backend's options
    (checked now, not at the first call). Returns the names of the compiled blocks.
    """
    CompileSettings.from_options(options)
    try:
        container = model.get_submodule(blocks)
    except AttributeError as exc:
        raise ConfigError(
            f"{type(model).__name__} has no submodule {blocks!r}; pass blocks= the name of the "
            "module that holds the transformer blocks (torchtitan: 'layers', HF transformers: "
            "'model.layers')"
        ) from exc
    children = list(container.named_children())
    if not children:
        raise ConfigError(
            f"{blocks!r} ({type(container).__name__}) has no child modules to compile; pass "
            "blocks= the ModuleList or ModuleDict of transformer blocks"
        )
    for _, block in children:
        block.compile(
            backend=BACKEND_NAME, options=dict(options or {}), fullgraph=fullgraph, dynamic=dynamic
        )
    return [f"{blocks}.{name}" for name, _ in children]
