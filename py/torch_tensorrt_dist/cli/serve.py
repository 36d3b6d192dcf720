"""``torchtrt-dist serve``: an OpenAI-compatible HTTP server over tensor / expert-parallel ranks.

    torchtrt-dist serve --tp 2                              # the demo model, 2 ranks, port 8000
    torchtrt-dist serve --model PATH --tp 2 --engine inductor --max-batch-size 8
    torchtrt-dist serve --model MIXTRAL --ep 2 --tp 1       # mixture of experts
    torchtrt-dist serve --tp 2 --quantize int8              # weight-only int8 (or int4)
    torchtrt-dist serve --artifacts DIR                     # from `torchtrt-dist compile`

Concurrent requests share the compiled graphs: each owns a KV-cache row (slot) from its
prefill to its last token, and every step decodes all running rows at once. Rank 0 serves
``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``, ``/health`` and ``/metrics`` on
127.0.0.1 unless told otherwise, and prints the URL and a curl line once warm. SIGTERM drains
(running requests finish, at most --drain-timeout s) and exits 0. Needs the ``serve`` extra.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any

from torch_tensorrt_dist.cli._quantize import add_quantize_args
from torch_tensorrt_dist.cli._serve_rank import API_KEY_ENV
from torch_tensorrt_dist.cli.generate import DTYPES, ENGINE_CHOICES
from torch_tensorrt_dist.errors import ConfigError, TensorRTDistError
from torch_tensorrt_dist.runtime.timeouts import TIMEOUT_ENV

__all__ = ["register", "run"]

#: The launcher's agent kills ranks 30 s after forwarding SIGTERM: drains must end before.
MAX_DRAIN_S = 25.0
#: ``serving.server.DEFAULT_STEP_TIMEOUT_S`` (that module needs the serve extra)
DEFAULT_STEP_TIMEOUT_S = 60.0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve a model over OpenAI's HTTP API, batching concurrent requests",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model",
        default=None,
        help="HF checkpoint directory or preset name (default: the demo checkpoint)",
    )
    p.add_argument(
        "--tp",
        type=int,
        default=None,
        help="tensor-parallel ranks (default: WORLD_SIZE / ep under a launcher, else 1)",
    )
    p.add_argument("--ep", type=int, default=1, help="expert-parallel ranks (MoE checkpoints)")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages: only 1 is served yet")
    p.add_argument(
        "--engine",
        choices=ENGINE_CHOICES,
        default="eager",
        help="tensorrt | inductor | eager (default) | none (plain PyTorch)",
    )
    p.add_argument(
        "--verify",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="check each graph's first call against eager (default: tensorrt only)",
    )
    p.add_argument("--dtype", choices=tuple(DTYPES), default="fp32")
    p.add_argument(
        "--max-batch-size",
        type=int,
        default=None,
        help="KV-cache rows: requests decoded together (default 8, or the artifacts')",
    )
    p.add_argument(
        "--max-seq-len",
        type=int,
        default=None,
        help="KV-cache length per row: prompt + generated tokens (default: the "
        "model's, at most 2048)",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=64,
        help="requests that may wait for a free row; more get 429 (default 64)",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=20.0,
        help=f"seconds SIGTERM lets running requests finish (<= {MAX_DRAIN_S:g})",
    )
    p.add_argument(
        "--step-timeout",
        type=float,
        default=DEFAULT_STEP_TIMEOUT_S,
        help="seconds a step may run; a longer one fails the server, naming the rank that did "
        f"not answer (default {DEFAULT_STEP_TIMEOUT_S:g}; below the collective timeout)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: a free one)")
    p.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV),
        help=f"require 'Authorization: Bearer KEY' (default: ${API_KEY_ENV})",
    )
    p.add_argument(
        "--served-model-name",
        default=None,
        help="the model name clients send (default: the checkpoint folder's name)",
    )
    p.add_argument(
        "--artifacts",
        default=None,
        metavar="DIR",
        help="serve `torchtrt-dist compile` artifacts (no checkpoint, no compile)",
    )
    for part in ("lm-head", "embedding"):
        p.add_argument(
            f"--{part}",
            choices=("vocab_parallel", "replicated"),
            default="vocab_parallel",
            help=f"TP sharding of the {part}",
        )
    add_quantize_args(p)
    p.set_defaults(func=run)


def check_options(ns: argparse.Namespace) -> None:
    """Refuse bad options before any rank starts (ConfigError, with the fix)."""
    if ns.pp != 1:
        raise ConfigError(
            f"serve --pp {ns.pp}: pipeline parallel serving is not supported yet; "
            "serve with --tp (and --ep for MoE)"
        )
    if (ns.tp is not None and ns.tp < 1) or ns.ep < 1:
        raise ConfigError(f"--tp and --ep must be >= 1, got tp={ns.tp} ep={ns.ep}")
    if (ns.max_batch_size is not None and ns.max_batch_size < 1) or ns.max_queue < 1:
        raise ConfigError(
            f"--max-batch-size and --max-queue must be >= 1, got "
            f"{ns.max_batch_size} and {ns.max_queue}"
        )
    if not 0 <= ns.drain_timeout <= MAX_DRAIN_S:
        raise ConfigError(
            f"--drain-timeout {ns.drain_timeout:g} must be in [0, {MAX_DRAIN_S:g}] "
            "(the launcher stops ranks 30 s after SIGTERM)"
        )
    if not 0 <= ns.port <= 65535:
        raise ConfigError(f"--port {ns.port} is not a TCP port (0-65535)")
    if ns.api_key is not None and not ns.api_key.strip():
        raise ConfigError("--api-key is empty; give a key or leave it unset")
    if ns.api_key is not None and not all("!" <= c <= "~" for c in ns.api_key):
        raise ConfigError(
            "--api-key must be printable ASCII without spaces: clients send it in an HTTP "
            "header, which carries nothing else"
        )
    check_step_timeout(ns.step_timeout, collective_timeout_s())
    if ns.verify and ns.engine == "none":
        raise ConfigError("--verify checks a compiled engine; --engine none compiles nothing")
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            f"serve needs the 'serve' extra ({exc.name} is missing): pip install -e '.[serve]'"
        ) from exc


def collective_timeout_s() -> float:
    """The collective timeout the ranks will get (``TORCH_TENSORRT_DIST_TIMEOUT`` or 600 s)."""
    from torch_tensorrt_dist.runtime.timeouts import resolve_timeout

    return resolve_timeout(None, os.environ).total_seconds()


def check_step_timeout(step_timeout: float, collective_s: float) -> None:
    """--step-timeout must end a stuck step before the collective timeout does: then the
    watchdog, which names the rank that did not answer, speaks first (pure)."""
    if not (math.isfinite(step_timeout) and 0 < step_timeout < collective_s):
        raise ConfigError(
            f"--step-timeout {step_timeout:g} must be in (0, {collective_s:g}): below the "
            f"collective timeout ({collective_s:g} s, {TIMEOUT_ENV}), so that a stuck step "
            "names the rank that did not answer"
        )


def run(ns: argparse.Namespace) -> int:
    from torch_tensorrt_dist.cli import _serve_rank
    from torch_tensorrt_dist.cli._failures import alike_on_every_rank, print_launch_failure, refuse
    from torch_tensorrt_dist.runtime import is_launched, launch

    launched = is_launched(os.environ)
    if ns.tp is None and not ns.artifacts:  # artifacts: the manifest's
        ns.tp = max(1, int(os.environ.get("WORLD_SIZE", "1")) // ns.ep) if launched else 1
    try:
        with alike_on_every_rank():
            check_options(ns)
            _serve_rank.plan(ns)  # the model, layout and cache: bad input fails here
            if not launched:  # a busy port is refused before any rank starts
                from torch_tensorrt_dist.serving.http import bind_socket

                bind_socket(ns.host, ns.port).close()
        if ns.engine == "tensorrt":
            from torch_tensorrt_dist.cli.generate import _check_engine

            _check_engine(ns.engine, isolated=not launched)
        if ns.tp * ns.ep == 1 or launched:
            return _serve_rank.rank_main(ns)
    except TensorRTDistError as exc:
        return refuse(exc, 2)
    world = ns.tp * ns.ep
    ns.func = None  # the ranks get a plain, picklable namespace
    ns.drain_dir = tempfile.mkdtemp(prefix="torchtrt-serve-")
    # drained ranks end by the signal the launcher forwarded (rank_entry); the launcher's
    # multiprocessing resource tracker would then warn about the queues' semaphores they held
    warnings = os.environ.get("PYTHONWARNINGS")
    os.environ["PYTHONWARNINGS"] = ",".join(
        filter(None, [warnings, "ignore:resource_tracker:UserWarning"])
    )
    try:
        result = launch(_serve_rank.rank_entry, world, [ns])
        drained = all((Path(ns.drain_dir) / f"rank-{r}.drained").is_file() for r in range(world))
    finally:
        shutil.rmtree(ns.drain_dir, ignore_errors=True)
    stopped = result.failure is None or result.failure.signal in (signal.SIGTERM, signal.SIGINT)
    if result.ok or (drained and stopped):
        return 0  # a signal to the launcher, forwarded to the ranks, drained them cleanly
    print_launch_failure(result, verbose=getattr(ns, "verbose", 0))
    return int(result.returncode)
