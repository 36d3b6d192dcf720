"""Freeze marked weights into an aten graph as constants (for the TensorRT engine).

TensorRT dequantizes per channel or per block only a build-time constant: a weight that is an
engine input cannot feed ``IDequantizeLayer`` that way. Dynamo hands our backend the real
tensors of the module's parameters and buffers as graph inputs, and AOTAutograd keeps them as
placeholders, in the same order. Tensors the quantization marks (:func:`mark_frozen`: codes
and scales), and the inputs the caller names (``also``: the expert weights of an op that
becomes IMoELayer), are turned into ``get_attr`` constants of the graph, and the compiled
callable drops those inputs (:func:`drop_frozen`), as Inductor's freezing does::

    keep = freeze_inputs(aten_gm, fake_inputs, real_inputs)     # indices of remaining inputs
    run = drop_frozen(compiled, keep)                           # called with every input

Memory: the graph's constant is the module's own tensor (no copy here), but TensorRT copies
every constant into the engine it builds, and each compiled graph (every prefill bucket, the
decode step) is its own engine. A frozen weight of ``b`` bytes therefore costs ``b`` in the
module plus ``b`` per engine that uses it (``QuantReport.engine_bytes``; docs/quantization.md).

Pure FX; nothing here imports TensorRT.
"""

from __future__ import annotations

import logging
import operator
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

__all__ = [
    "drop_frozen",
    "freeze_inputs",
    "frozen_indices",
    "is_frozen",
    "mark_frozen",
]

logger = logging.getLogger(__name__)

_ATTR = "_tensorrt_dist_frozen"


def mark_frozen(*tensors: torch.Tensor) -> None:
    """Mark tensors (quantized codes, their scales) to become constants of TensorRT graphs."""
    for t in tensors:
        setattr(t, _ATTR, True)


def is_frozen(t: object) -> bool:
    return isinstance(t, torch.Tensor) and bool(getattr(t, _ATTR, False))


def frozen_indices(real_inputs: Sequence[Any]) -> list[int]:
    """Positions of the marked tensors among a graph's (real) example inputs."""
    return [i for i, t in enumerate(real_inputs) if is_frozen(t)]


def freeze_inputs(
    gm: fx.GraphModule,
    inputs: Sequence[Any],
    real_inputs: Sequence[Any],
    *,
    also: Sequence[int] = (),
) -> list[int] | None:
    """Replace the placeholders of marked inputs (and of the positions in ``also``) by
    constants (buffers of ``gm``); return the indices of the inputs that remain, or None
    (nothing changed) when there is nothing to freeze or the graph's inputs do not line up one
    to one with ``real_inputs`` (then the weights stay inputs and the converters leave those
    ops to PyTorch, saying why)."""
    frozen = sorted(set(frozen_indices(real_inputs)) | set(also))
    if not frozen:
        return None
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    if len(placeholders) != len(real_inputs) or len(inputs) != len(real_inputs):
        logger.warning(
            "cannot freeze %d weights: the graph has %d inputs, Dynamo gave %d",
            len(frozen),
            len(placeholders),
            len(real_inputs),
        )
        return None
    for i in frozen:
        fake, real = inputs[i], real_inputs[i]
        if not isinstance(real, torch.Tensor) or not isinstance(fake, torch.Tensor):
            logger.warning("cannot freeze input %d: it is not a tensor", i)
            return None
        if tuple(fake.shape) != tuple(real.shape) or fake.dtype != real.dtype:
            logger.warning(
                "cannot freeze weights: input %d is %s%s in the graph but %s%s in the module",
                i,
                fake.dtype,
                list(fake.shape),
                real.dtype,
                list(real.shape),
            )
            return None
    for n, i in enumerate(frozen):
        node = placeholders[i]
        name = f"_frozen_weight_{n}"
        gm.register_buffer(name, real_inputs[i])  # the module's own tensor, not a copy
        with gm.graph.inserting_before(node):
            const = gm.graph.get_attr(name)
        const.meta = dict(node.meta)
        node.replace_all_uses_with(const)
        gm.graph.erase_node(node)
    gm.recompile()
    return [i for i in range(len(real_inputs)) if i not in set(frozen)]


def drop_frozen(
    fn: Callable[..., Any],
    keep: Sequence[int],
    held: Sequence[Any] = (),
    rebuild: Callable[[list[Any]], Callable[..., Any]] | None = None,
) -> Callable[..., Any]:
    """A boxed callable over all inputs that calls the frozen graph's ``fn`` with the kept.

    ``held``: every input (the real tensors) the graph was built with; ``rebuild(args)``:
    what ``fn`` is (a callable over the kept inputs), built for the tensors in ``args``.
    A frozen graph holds the values its weights had when it was built, and Dynamo guards a
    parameter by its shape, dtype and strides only: a second module of the same class (a
    second generator of the same model shapes) passes the guards of a graph that froze the
    first module's weights, and a weight written in place (``load_state_dict``) keeps its
    guards too. Either would silently run with the old values. So each call checks that the
    frozen inputs are the tensors the graph was built for (``is``, through weak references:
    a build never keeps a module's weights alive, and one whose tensors died is dropped, so a
    new tensor at a freed address never finds it) at the versions it read (``_version``,
    raised by every in-place write except one through ``.data``; an inference tensor has
    none: identity only), and otherwise runs the graph built for the tensors it was given:
    built on first use (one log line), kept per set of weights as Dynamo keeps its graphs,
    dropped once its weights are written or gone. Without ``rebuild`` such a call raises."""
    keep = list(keep)
    positions = [i for i in range(len(held)) if i not in set(keep)]
    if not positions:
        return _dropping(fn, keep)
    return _FrozenDispatch(fn, keep, positions, held, rebuild)


class _Build:
    """A callable built for some tensors: weak references to them, their versions."""

    def __init__(self, call: Callable[..., Any], tensors: tuple[Any, ...], positions: list[int]):
        self.call = call
        self.refs = tuple(weakref.ref(t) for t in tensors)
        at: dict[int, Any] = dict(zip(positions, tensors))
        counted = [i for i in positions if _version(at[i]) is not None]
        # the inputs with a version counter (a tuple whatever their count), their versions
        self.counted = operator.itemgetter(*counted, counted[0]) if counted else None
        self.versions = tuple(map(_VERSION, self.counted(at))) if self.counted else ()

    def holds(self, now: tuple[Any, ...]) -> bool:
        """Built for these very tensors (alive: a dead reference matches nothing)."""
        return all(map(operator.is_, now, map(operator.call, self.refs)))

    def matches(self, now: tuple[Any, ...], args: list[Any]) -> bool:
        """Built for these tensors, and none written since."""
        if not self.holds(now):
            return False
        return self.counted is None or tuple(map(_VERSION, self.counted(args))) == self.versions


class _FrozenDispatch:
    """:func:`drop_frozen`'s callable (boxed: it takes the list of inputs and clears it)."""

    _boxed_call = True

    def __init__(
        self,
        fn: Callable[..., Any],
        keep: list[int],
        positions: list[int],
        held: Sequence[Any],
        rebuild: Callable[[list[Any]], Callable[..., Any]] | None,
    ) -> None:
        self.keep, self.positions, self.rebuild = keep, positions, rebuild
        self.pick = operator.itemgetter(*positions, positions[0])  # a tuple, whatever their count
        self.builds: list[_Build] = []
        self.lock = threading.RLock()  # a finalizer may run inside _switch (a collection)
        self.current = self._add(fn, self.pick(held))

    def __call__(self, args: list[Any]) -> Any:
        build = self.current
        if not build.matches(self.pick(args), args):
            build = self._switch(args)
        kept = [args[i] for i in self.keep]
        args.clear()  # boxed calling convention: the callee owns the list
        return build.call(kept)

    def _add(self, call: Callable[..., Any], tensors: tuple[Any, ...]) -> _Build:
        build = _Build(call, tensors, self.positions)
        self.builds.append(build)
        owner, built = weakref.ref(self), weakref.ref(build)
        for t in {id(x): x for x in tensors}.values():  # drop the build when one dies
            weakref.finalize(t, _dropped, owner, built)
        return build

    def drop(self, build: _Build | None) -> None:
        with self.lock:
            self.builds = [b for b in self.builds if b is not build]

    def _switch(self, args: list[Any]) -> _Build:
        with self.lock:
            now = self.pick(args)
            build = next((b for b in self.builds if b.matches(now, args)), None)
            if build is None:
                if self.rebuild is None:
                    raise RuntimeError(
                        f"a compiled graph froze {len(self.positions)} weights as constants "
                        "and was called with other tensors in their place, or with new values "
                        "in them; compile again (torch._dynamo.reset()) or each module apart"
                    )
                logger.warning(
                    "a compiled graph holds %d weights as constants and was called with other "
                    "tensors in their place (another module of the same code, or rebound "
                    "parameters), or with values written into them since: building it again",
                    len(self.positions),
                )
                # a build for these tensors at older versions never matches again
                self.builds = [b for b in self.builds if not b.holds(now)]
                build = self._add(self.rebuild(list(args)), now)
            self.current = build
            return build


def _dropped(owner: weakref.ref[_FrozenDispatch], build: weakref.ref[_Build]) -> None:
    """A tensor of ``build`` died: its owner forgets it (weak both: a finalizer keeps
    neither the dispatch nor the build alive)."""
    dispatch = owner()
    if dispatch is not None:
        dispatch.drop(build())


def _dropping(fn: Callable[..., Any], keep: list[int]) -> Callable[..., Any]:
    def run(args: list[Any]) -> Any:
        kept = [args[i] for i in keep]
        args.clear()  # boxed calling convention: the callee owns the list
        return fn(kept)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


_VERSION = operator.attrgetter("_version")


def _version(t: Any) -> int | None:
    """``t``'s version counter (raised by each in-place write), or None where it has none."""
    try:
        return int(t._version)
    except (AttributeError, RuntimeError):  # an inference tensor, not a tensor
        return None
