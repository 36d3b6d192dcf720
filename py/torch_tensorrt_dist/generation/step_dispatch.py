"""The step's compiled code, called directly once it is known: no guard evaluation per step.

    step = StepDispatch(fn, route, version=lambda: model.paged_version)
    step(*inputs)     # route(inputs) -> (shape class, the torch.compile'd fn): Dynamo's path
                      # until the class's code is confirmed, then that code directly

Before every call of a compiled function Dynamo runs its frame hook and evaluates the guards
of its cache entries (about 950 for a step of the bench checkpoint, most of them the model's
tensors): 0.15-0.19 ms of a 1.3-4 ms decode step there, 5-11 % (docs/performance.md). A
step's shape classes are few and known (``step_inputs``: one row or several, one token or
several, packed or not; and which compile, ``compile_paged_step``), and its model does not
change after its first call. So, as vLLM does with its compiled models, the code Dynamo
generates for a class (bytecode that gathers the model's tensors and the call's and calls the
compiled graph) is taken from Dynamo's bytecode hook and called directly from then on.

What makes that safe is checked, not assumed:

* a class is called directly only after its first :data:`CONFIRM` calls went through Dynamo
  and compiled exactly one code; a class that compiles a second one (its guards tell apart
  inputs that the class does not) stays on Dynamo's path for good, with a warning;
* the class includes the grad mode and the model's ``version()`` (``Transformer``'s
  ``paged_version``, raised by every ``setup_paged``: new pools, maybe new weight layouts);
* a direct call first checks the global state Dynamo guards (grad mode, autocast, threads,
  default dtype, ...: torch's ``GlobalStateGuard``, 0.5 us) against the confirmed call's;
* every :data:`RECHECK`-th call of a class goes through Dynamo again, so a class whose
  guards fail later (a weight rebound with another shape) is found and dropped there (the
  code reads the model's tensors at each call: a rebound weight of the same layout is used).
"""

from __future__ import annotations

import logging
import threading
import types
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["CONFIRM", "RECHECK", "StepDispatch", "shape_class"]

logger = logging.getLogger(__name__)

#: calls of a shape class through Dynamo before it is called directly
CONFIRM = 2
#: every RECHECK-th call of a directly called class goes through Dynamo's guards
RECHECK = 256

_local = threading.local()  # .current: (dispatch, class) of the call inside Dynamo now
_hook: list[Any] = []  # Dynamo's hook handle, registered once per process
_hook_lock = threading.Lock()


def shape_class(inputs: tuple[Tensor, ...]) -> tuple[int, bool, bool, int]:
    """A step call's class: its first input's rank (tokens, or a stage's hidden states), more
    than one row, more than one token, and its input count (a packed step has six)."""
    first = inputs[0]
    return first.dim(), first.shape[0] > 1, first.shape[1] > 1, len(inputs)


def _on_bytecode(code: types.CodeType, new_code: types.CodeType) -> types.CodeType | None:
    current = getattr(_local, "current", None)
    if current is not None and code is current[0].code:
        current[0].compiled(current[1], new_code)
    return None  # the code as Dynamo made it


def _register_hook() -> bool:
    """Dynamo's bytecode hook, once per process; False where this torch lacks it or torch's
    global-state guard (written against torch 2.14): every call then goes through Dynamo."""
    with _hook_lock:
        if _hook:
            return bool(_hook[0])
        try:
            from torch._dynamo.convert_frame import register_bytecode_hook

            torch._C._dynamo.guards.GlobalStateGuard  # noqa: B018  (present, or AttributeError)
            _hook.append(register_bytecode_hook(_on_bytecode))
        except (ImportError, AttributeError):
            logger.info(
                "this torch has no bytecode hook or global-state guard: the step's "
                "calls all go through Dynamo's guards"
            )
            _hook.append(None)
        return bool(_hook[0])


@dataclass
class _Class:
    code: types.CodeType | None = None
    direct: Callable[..., Tensor] | None = None
    state: Any = None  # torch's GlobalStateGuard of the confirmed call
    through_dynamo: int = 0
    calls: int = 0
    dropped: bool = False


class StepDispatch:
    """``fn`` (the step before ``torch.compile``) called through ``route(inputs)``'s compiled
    function, or directly by the code Dynamo compiled for the call's class (module docstring).
    """

    def __init__(
        self,
        fn: Callable[..., Tensor],
        route: Callable[[tuple[Tensor, ...]], tuple[Hashable, Callable[..., Tensor]]],
        *,
        version: Callable[[], Hashable] = lambda: 0,
    ) -> None:
        self.fn, self.route, self.version, self.code = fn, route, version, fn.__code__
        self.enabled = _register_hook()
        self.classes: dict[tuple[Hashable, bool, Hashable], _Class] = {}

    def __call__(self, *inputs: Tensor) -> Tensor:
        shape, compiled = self.route(inputs)
        key = (shape, torch.is_grad_enabled(), self.version())
        c = self.classes.get(key)
        if c is not None and c.direct is not None and c.state.check():
            c.calls += 1
            if c.calls % RECHECK:
                return c.direct(*inputs)
        return self._through_dynamo(key, compiled, inputs)

    @property
    def direct(self) -> list[Hashable]:
        """The shape classes called directly now (under their grad mode and model version)."""
        return [k[0] for k, c in self.classes.items() if c.direct is not None]

    def _through_dynamo(
        self,
        key: tuple[Hashable, bool, Hashable],
        compiled: Callable[..., Tensor],
        inputs: tuple[Tensor, ...],
    ) -> Tensor:
        c = self.classes.setdefault(key, _Class())
        _local.current = (self, key)
        try:
            out = compiled(*inputs)
        finally:
            _local.current = None
        c.through_dynamo += 1
        code, fn = c.code, self.fn
        ready = code is not None and not c.dropped and c.through_dynamo >= CONFIRM
        if self.enabled and ready and c.direct is None and code is not None:
            c.state = torch._C._dynamo.guards.GlobalStateGuard()  # this call's, as confirmed
            c.direct = types.FunctionType(
                code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
            )
        return out

    def compiled(self, key: tuple[Hashable, bool, Hashable], code: types.CodeType) -> None:
        """Dynamo compiled ``code`` for a call of class ``key`` (its bytecode hook)."""
        c = self.classes.setdefault(key, _Class())
        if c.code is None and not c.dropped:
            c.code = code
            return
        if not c.dropped:
            logger.warning(
                "the step's shape class %s compiled a second time (its guards tell apart "
                "inputs the class does not): its calls go through Dynamo's guards from now on",
                key,
            )
        c.dropped, c.code, c.direct = True, None, None
