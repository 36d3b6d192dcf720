"""Collective timeouts: one configurable limit, and errors that say what a timeout means.

    timeout = resolve_timeout(None, os.environ)      # TORCH_TENSORRT_DIST_TIMEOUT or 600 s
    with collective_timeouts_explained():
        dist.all_reduce(x)                           # a gloo timeout -> CollectiveTimeoutError

The limit is handed to ``init_process_group``: a rank waiting in a collective that another
rank never joins fails after it. With gloo the waiting rank raises; with NCCL the watchdog
aborts the process after the limit (``TORCH_NCCL_ASYNC_ERROR_HANDLING``), and the launcher
then stops the job and names the rank.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta

from torch_tensorrt_dist.errors import ConfigError, TensorRTDistError

__all__ = [
    "DEFAULT_TIMEOUT",
    "TIMEOUT_ENV",
    "CollectiveTimeoutError",
    "collective_timeouts_explained",
    "resolve_timeout",
]

logger = logging.getLogger(__name__)

TIMEOUT_ENV = "TORCH_TENSORRT_DIST_TIMEOUT"
#: torch's own default for gloo and NCCL process groups.
DEFAULT_TIMEOUT = timedelta(minutes=10)

# Texts c10d backends use when a collective ran past the process-group timeout.
_TIMEOUT_RE = re.compile(r"timed out|timeout|watchdog caught collective operation", re.I)


class CollectiveTimeoutError(TensorRTDistError, TimeoutError):
    """A collective did not complete within the configured timeout (a rank did not join)."""


def _to_timedelta(value: object, origin: str) -> timedelta:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        try:
            seconds = float(value.strip())
        except ValueError:
            raise ConfigError(
                f"{origin}={value!r} is not a number of seconds; set it to e.g. 120 or 7.5"
            ) from None
    else:
        raise ConfigError(
            f"{origin} must be a datetime.timedelta or a number of seconds, got "
            f"{type(value).__name__}"
        )
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"{origin}={value!r}: the collective timeout must be a positive time")
    return timedelta(seconds=seconds)


def resolve_timeout(
    timeout: timedelta | float | int | str | None, env: Mapping[str, str]
) -> timedelta:
    """The collective timeout: ``timeout`` if given, else ``$TORCH_TENSORRT_DIST_TIMEOUT``
    (seconds), else torch's default of 10 minutes. Raises :class:`ConfigError` if malformed."""
    if timeout is not None:
        return _to_timedelta(timeout, "timeout")
    raw = env.get(TIMEOUT_ENV)
    if raw is not None and raw.strip():
        return _to_timedelta(raw, TIMEOUT_ENV)
    return DEFAULT_TIMEOUT


_configured: dict[str, timedelta | None] = {}


def note_configured_timeout(timeout: timedelta | None) -> None:
    """Record the collective timeout the process group was created with (None: unknown,
    another caller initialised torch.distributed). :func:`init_distributed` calls this."""
    _configured["timeout"] = timeout


def configured_timeout() -> timedelta | None:
    """The collective timeout :func:`init_distributed` passed to the process group, if any."""
    return _configured.get("timeout")


def _explain(exc: BaseException, timeout: timedelta | None, waited: float) -> str:
    limit = f"{timeout.total_seconds():g} s" if timeout is not None else "the configured limit"
    rank = ""
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            rank = f"rank {dist.get_rank()} of {dist.get_world_size()}: "
    except (ImportError, RuntimeError):  # pragma: no cover - torch without distributed
        pass
    return (
        f"{rank}a collective did not complete within the collective timeout ({limit}; waited "
        f"{waited:.1f} s): another rank of its group never joined it. That rank crashed, hangs, "
        "or issues a different sequence of collectives (a schedule mismatch). Check the other "
        f"ranks' logs; if a step is legitimately slow, raise the limit with "
        f"init_distributed(timeout=...) or {TIMEOUT_ENV}=<seconds>. Backend error: {exc}"
    )


@contextmanager
def collective_timeouts_explained(timeout: timedelta | None = None) -> Iterator[None]:
    """Turn a c10d timeout raised inside the block into :class:`CollectiveTimeoutError`.

    ``timeout`` is only used in the message; by default the one :func:`init_distributed`
    configured. Other errors pass through unchanged.
    """
    if timeout is None:
        timeout = configured_timeout()
    start = time.monotonic()
    try:
        yield
    except RuntimeError as exc:
        if isinstance(exc, TensorRTDistError) or not _TIMEOUT_RE.search(str(exc)):
            raise
        waited = time.monotonic() - start
        message = _explain(exc, timeout, waited)
        logger.error("%s", message)
        raise CollectiveTimeoutError(message) from exc
