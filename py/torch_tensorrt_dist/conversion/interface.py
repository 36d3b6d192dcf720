"""What every TensorRT implementation of a collective layer provides, and the types it speaks.

The core (choosing an implementation, the capability validators, the one emitter, the engine
build) reaches an implementation only through :class:`CollectiveImpl`. The implementations
live in ``impl/<folder>/`` and are registered in ``impl/__init__.py``;
``tests/test_conversion_interface.py`` holds each of them to this interface. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch

from torch_tensorrt_dist.conversion.node_args import CollectiveCall

__all__ = ["CollectiveImpl", "CollectiveQuery", "Decision", "ImplChoice", "PluginSpec"]


class Decision(NamedTuple):
    """Whether one collective converts to a TensorRT layer, and why (or why not)."""

    convertible: bool
    reason: str


class ImplChoice(NamedTuple):
    """The implementation the converters use (None: none can be used), and why."""

    impl: str | None
    reason: str


@dataclass(frozen=True)
class CollectiveQuery:
    """One collective as an implementation's rules see it, after the checks every
    implementation shares (``rules.decide``): a known op, a group of two or more distinct
    ranks, a broadcast source inside it, a torch dtype, a known reduce op."""

    op: str
    dtype: torch.dtype
    ranks: list[int]  # global ranks of the op's group, in group order
    reduce_op: str | None  # normalised ("sum" when the op reduces and none was given)
    dim0: int | None = None  # the input's dim 0 where known at build time
    output_split_sizes: Sequence[int] | None = None  # all_to_all; None/empty: even splits
    input_split_sizes: Sequence[int] | None = None
    #: global ranks of the communicator the engine binds (an implementation that binds one
    #: communicator per engine); None: the op's own group
    comm_ranks: Sequence[int] | None = None
    #: ``CollectiveOperation.X`` / ``ReduceOperation.X`` members the installed TensorRT has
    #: (None: not checked)
    native_members: frozenset[str] | None = None


@dataclass(frozen=True)
class PluginSpec:
    """One plugin layer: creator name/version/namespace and its fields."""

    name: str
    version: str
    namespace: str
    fields: dict[str, np.ndarray]


class CollectiveImpl(Protocol):
    """One TensorRT implementation of a collective layer (``collective_impl=<name>``).

    What it is: ``name``, ``label``, ``description``, ``one_communicator_per_engine``,
    ``auto_rank``. Whether it can be used here: ``missing``, ``facts``, ``check_launch``.
    Its decision and spec, pure: ``decide``, ``spec``. The TensorRT shell: ``install``,
    ``prepare``, ``emit``. A hook an implementation does not need returns None.
    """

    #: the ``collective_impl`` value that requests it
    name: str
    #: how a reason names it beside the others ("native DistCollective: TensorRT is not ...")
    label: str
    #: what it is ("TensorRT DistCollective"): in a choice's reason and a ConfigError
    description: str
    #: it binds one NCCL communicator per engine (Torch-TensorRT's, to a multi-device engine)
    one_communicator_per_engine: bool

    def auto_rank(self, *, one_group: bool) -> int:
        """Its place in ``auto``'s order (lower first), given whether the engine's collectives
        use one group."""
        ...

    def missing(self, plugin_path: str | None = None) -> str | None:
        """None if it can be used in this process, else why not (one line).
        ``plugin_path``: the settings' library path, for an implementation that loads one."""
        ...

    def facts(self, engine_ranks: Sequence[int] | None) -> dict[str, Any]:
        """The ``conversion_decision`` keywords about this process that its rules read
        (``engine_ranks``: global ranks of the communicator the engine binds, or None)."""
        ...

    def decide(self, query: CollectiveQuery) -> Decision:
        """Can it do this collective exactly? Pure; the reason names what refuses it."""
        ...

    def spec(self, call: CollectiveCall, dtype: torch.dtype, **facts: Any) -> Any:
        """The exact plugin fields or layer arguments for ``call`` (pure); raises
        ``UnsupportedCollectiveError`` where ``decide`` refuses it."""
        ...

    def check_launch(self, groups: Sequence[Sequence[int]]) -> None:
        """Raise ``DistributedSetupError`` if this process's launch cannot run these groups."""
        ...

    def install(self) -> None:
        """Once, when we register with Torch-TensorRT (Torch-TensorRT is imported)."""
        ...

    def prepare(self, calls: Sequence[CollectiveCall], plugin_path: str | None) -> None:
        """Before our backend builds an engine whose multi-rank collectives are ``calls``."""
        ...

    def emit(
        self, trt: Any, ctx: Any, x: Any, call: CollectiveCall, dtype: torch.dtype, name: str
    ) -> Any:
        """Add its layer for ``call`` on the ITensor ``x`` (``dtype``: its torch dtype) to
        ``ctx.net``; returns the layer (TensorRT calls)."""
        ...
