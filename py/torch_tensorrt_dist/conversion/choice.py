"""Which implementation the converters use: the request (settings, else environment), then
``auto``'s order over what is usable here. The code names no implementation: it asks each
registered one (``impl/__init__.py``) through the interface.

    requested_impl("auto", env={ENV_COLLECTIVE_IMPL: "plugin"})       # "plugin"
    current_impl()        # ImplChoice(impl=None, reason="no TensorRT collective ...")

``auto`` takes the usable implementation of lowest ``auto_rank``; with the three registered
now: native DistCollective where the engine's collectives use one group, then our torch_nccl
plugins, then native for the group it binds, then the TensorRT-LLM plugins. An explicit
request is never swapped for another implementation.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from torch_tensorrt_dist.conversion.impl import implementation, implementations
from torch_tensorrt_dist.conversion.interface import CollectiveImpl, ImplChoice
from torch_tensorrt_dist.conversion.settings import current_settings
from torch_tensorrt_dist.errors import ConfigError

__all__ = [
    "ENV_COLLECTIVE_IMPL",
    "REQUESTABLE_IMPLS",
    "choose",
    "current_impl",
    "requested_impl",
    "select_impl",
]

#: environment variable read when the settings leave ``collective_impl`` at "auto"
ENV_COLLECTIVE_IMPL = "TORCH_TENSORRT_DIST_COLLECTIVE_IMPL"
REQUESTABLE_IMPLS: tuple[str, ...] = ("auto", *(impl.name for impl in implementations()))
#: the reason of an implementation nobody asked about (it is left out of the reasons)
NOT_CHECKED = "not checked"


def requested_impl(setting: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The requested implementation: the setting unless it is "auto"/None, else the env var."""
    env = os.environ if env is None else env
    value = (setting or "auto").strip().lower()
    source = "collective_impl"
    if value == "auto" and env.get(ENV_COLLECTIVE_IMPL, "").strip():
        value = env[ENV_COLLECTIVE_IMPL].strip().lower()
        source = ENV_COLLECTIVE_IMPL
    if value not in REQUESTABLE_IMPLS:
        each = ", ".join(f"{impl.name!r} ({impl.description})" for impl in implementations())
        raise ConfigError(
            f"{source}={value!r} is not one of {', '.join(REQUESTABLE_IMPLS)}; "
            f"set it to {each} or 'auto'"
        )
    return value


def choose(
    requested: str, missing: Callable[[CollectiveImpl], str | None], *, one_group: bool = True
) -> ImplChoice:
    """Pick the implementation for ``requested`` ("auto" or a name).

    ``missing(impl)`` is None when ``impl`` is usable, else the reason it is not; it is asked
    lazily, in ``auto_rank`` order, and always for auto's first choice (whose reason the
    others' choices quote). ``one_group`` is False when the engine's collectives use more than
    one group.
    """
    if requested != "auto":
        impl = implementation(requested)
        if impl is None:
            raise ConfigError(f"collective_impl={requested!r} is not one of {REQUESTABLE_IMPLS}")
        why = missing(impl)
        if why is None:
            return ImplChoice(impl.name, f"collective_impl={requested!r} (requested)")
        return ImplChoice(None, f"collective_impl={requested!r} was requested but {why}")
    found: dict[str, str | None] = {}

    def usable(impl: CollectiveImpl) -> bool:
        if impl.name not in found:
            found[impl.name] = missing(impl)
        return found[impl.name] is None

    first = min(implementations(), key=lambda impl: impl.auto_rank(one_group=True))
    usable(first)
    for impl in sorted(implementations(), key=lambda impl: impl.auto_rank(one_group=one_group)):
        if not usable(impl):
            continue
        if impl is first:
            return ImplChoice(impl.name, f"{impl.description} is available (auto)")
        why = found[first.name] or "the engine's collectives use more than one group"
        return ImplChoice(impl.name, f"{impl.description} (auto; {first.label}: {why})")
    reasons = "; ".join(
        f"{impl.label}: {found[impl.name]}"
        for impl in implementations()
        if found.get(impl.name, NOT_CHECKED) != NOT_CHECKED
    )
    return ImplChoice(None, f"no TensorRT collective implementation is usable: {reasons}")


def select_impl(
    requested: str, *, native_takes_all: bool = True, **missing: str | None
) -> ImplChoice:
    """:func:`choose` from given reasons (pure): ``<name>_missing=`` for each implementation
    (None: usable; else why not; left out: not checked). ``native_takes_all`` is False when
    the engine's collectives use more than one group."""
    names = {f"{impl.name}_missing" for impl in implementations()}
    unknown = sorted(set(missing) - names)
    if unknown:
        raise TypeError(f"select_impl() got {unknown}; it takes {sorted(names)}")
    return choose(
        requested,
        lambda impl: missing.get(f"{impl.name}_missing", NOT_CHECKED),
        one_group=native_takes_all,
    )


def current_impl(*, native_takes_all: bool = True) -> ImplChoice:
    """The implementation the converters use now (settings block, else environment).

    ``native_takes_all`` False (an engine with collectives on several groups) lets "auto"
    prefer an implementation that takes every group to one that binds one communicator."""
    setting, plugin_path = current_settings()
    return choose(
        requested_impl(setting),
        lambda impl: impl.missing(plugin_path),
        one_group=native_takes_all,
    )
