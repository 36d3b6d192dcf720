"""torchrun's agent inside our launcher, quiet and leaving the caller as it was.

    env = {**env, **torchrun_env(opts.nproc_per_node, os.environ, cores=cores_given())}
    with caller_signal_handlers(), quiet_agent():
        elastic_launch(config, target)(*args)

What torchrun would set with a banner is set silently (:func:`torchrun_env`), its agent's
loggers are silenced for the launch (:func:`quiet_agent`; ``-vv`` keeps them), and the signal
handlers its process context installs (they raise ``SignalException``) are replaced by the
caller's once the launch returns (:func:`caller_signal_handlers`).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator, Mapping

from torch_tensorrt_dist.runtime.threads import threads_for

__all__ = ["caller_signal_handlers", "quiet_agent", "torchrun_env"]

#: this package's launcher logger: at DEBUG (``-vv``) the agent's loggers stay as they are
logger = logging.getLogger("torch_tensorrt_dist.runtime.launcher")

#: Loggers of torchrun's agent: its banners (OMP_NUM_THREADS), rendezvous notes and its own
#: failure table are hidden; the launcher reports a failure itself, naming the rank.
_TORCHRUN_LOGGERS = (
    "torch.distributed.run",
    "torch.distributed.elastic",
    "torch.distributed.launcher",
    "torch.multiprocessing",  # "Terminating process N via signal SIGTERM" (function entries)
)


@contextlib.contextmanager
def quiet_agent() -> Iterator[None]:
    """Silence torchrun's agent loggers (unless this package logs at DEBUG: ``-vv``)."""
    if logger.isEnabledFor(logging.DEBUG):
        yield
        return
    names = [n for n in logging.root.manager.loggerDict if n.startswith(_TORCHRUN_LOGGERS)]
    loggers = [logging.getLogger(n) for n in (*_TORCHRUN_LOGGERS, *names)]
    saved = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for lg, level in zip(loggers, saved):
            lg.setLevel(level)


def torchrun_env(nproc_per_node: int, environ: Mapping[str, str], *, cores: int) -> dict[str, str]:
    """What torchrun would set with a banner, set silently (pure): for several ranks per node
    when the user did not choose, ``OMP_NUM_THREADS`` = each rank's share of the ``cores``
    given (``runtime/threads.py``; torchrun's own default is 1)."""
    if "OMP_NUM_THREADS" in environ or nproc_per_node <= 1:
        return {}
    return {"OMP_NUM_THREADS": str(threads_for(cores, nproc_per_node, None, None))}


#: The signals torchelastic's process context handles (it installs its handlers and leaves them)
_AGENT_SIGNALS = tuple(
    getattr(signal, name)
    for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
    if hasattr(signal, name)
)


@contextlib.contextmanager
def caller_signal_handlers() -> Iterator[None]:
    """The caller's handlers of SIGTERM, SIGINT, SIGHUP and SIGQUIT, as they were before the
    launch, once it returns: torchelastic installs its own (which raise ``SignalException``)
    and leaves them, so a Ctrl-C after the launch would not be a ``KeyboardInterrupt``. Only
    the main thread sets handlers (elsewhere torchelastic installs none)."""
    saved = {sig: signal.getsignal(sig) for sig in _AGENT_SIGNALS}
    try:
        yield
    finally:
        if threading.current_thread() is threading.main_thread():
            for sig, handler in saved.items():
                if handler is not None:  # None: set outside Python, cannot be restored
                    signal.signal(sig, handler)
