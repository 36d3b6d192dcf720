"""``torchtrt-dist serve``: an OpenAI-compatible HTTP server over tensor / expert-parallel ranks
(and pipeline stages of them).

    torchtrt-dist serve --tp 2                              # the demo model, 2 ranks, port 8000
    torchtrt-dist serve --model PATH --tp 2 --engine inductor --max-batch-size 8
    torchtrt-dist serve --pp 2 --tp 2                       # 2 pipeline stages of 2 TP ranks
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
import logging
import os
import shutil
import signal
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from torch_tensorrt_dist.cli._options import (
    add_engine,
    add_kv_cache,
    add_layout,
    add_model,
    add_quantize,
    add_speculative,
    add_threads,
)
from torch_tensorrt_dist.cli._rank import start
from torch_tensorrt_dist.cli._serve_job import API_KEY_ENV, ServeRankJob
from torch_tensorrt_dist.config.jobs import (
    DEFAULT_STEP_TIMEOUT_S,
    DEFAULT_WRITE_TIMEOUT_S,
    MAX_DRAIN_S,
    ServeJob,
)
from torch_tensorrt_dist.config.run import RunConfig
from torch_tensorrt_dist.errors import ConfigError

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve a model over OpenAI's HTTP API, batching concurrent requests",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model(p, artifacts="serve `torchtrt-dist compile` artifacts (no checkpoint, no compile)")
    add_layout(
        p,
        pp="pipeline stages (default 1); the server has pp x tp (x ep) ranks, TP inner",
        ep=True,
        pipeline=True,
    )
    add_engine(p, default="auto")
    add_kv_cache(
        p,
        max_batch_size="rows decoded together: requests running at once (default 8, or the "
        "artifacts')",
        max_seq_len="the longest request: prompt + generated tokens (default: the model's "
        "positions, at most 2048; more than the model's positions is refused)",
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
    p.add_argument(
        "--write-timeout",
        type=float,
        default=DEFAULT_WRITE_TIMEOUT_S,
        help="seconds a stream's client may take no write (it stopped reading); then its "
        f"stream ends with an error event and its request is cancelled (default "
        f"{DEFAULT_WRITE_TIMEOUT_S:g})",
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
    from torch_tensorrt_dist.serving.reasoning import PARSERS
    from torch_tensorrt_dist.serving.tools import FORMATS

    p.add_argument(
        "--tool-call-parser",
        default=None,
        choices=list(FORMATS),
        help='how tool_choice "auto" reads the model\'s tool calls (default: the format the chat '
        "template asks for, where recognised)",
    )
    p.add_argument(
        "--reasoning-parser",
        default=None,
        choices=list(PARSERS),
        help="split <think>...</think> into reasoning_content (default: off)",
    )
    add_quantize(p)
    add_speculative(p)
    add_threads(p)
    p.set_defaults(func=run)


def _job(ns: argparse.Namespace) -> ServeJob:
    """The server's options (ConfigError, with the fix); the ``serve`` extra must be there."""
    job = ServeJob(
        ns.host,
        ns.port,
        ns.api_key,
        ns.max_queue,
        ns.drain_timeout,
        ns.served_model_name,
        step_timeout=ns.step_timeout,
        tool_call_parser=ns.tool_call_parser,
        reasoning_parser=ns.reasoning_parser,
        write_timeout=ns.write_timeout,
    )
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            f"serve needs the 'serve' extra ({exc.name} is missing): pip install -e '.[serve]'"
        ) from exc
    from torch_tensorrt_dist.runtime import is_launched
    from torch_tensorrt_dist.serving.http import bind_socket

    if not is_launched(os.environ):  # a busy port is refused before any rank starts
        bind_socket(job.host, job.port).close()
    return job


def run(ns: argparse.Namespace) -> int:
    rank_job = ServeRankJob()
    return start(
        ns,
        _job,
        rank_job,
        launch_ranks=lambda config: _launch(config, rank_job, verbose=ns.verbose),
    )


def _launch(config: RunConfig, rank_job: ServeRankJob, *, verbose: int) -> int:
    """The server's ranks: a drained rank ends by the signal the launcher forwarded
    (``_serve_job``), which is a clean end here, not a failure."""
    from torch_tensorrt_dist.cli._failures import print_launch_failure, rank_entry
    from torch_tensorrt_dist.runtime import launch
    from torch_tensorrt_dist.runtime.huge_pages import rank_env

    world = config.parallel.world
    drain_dir = tempfile.mkdtemp(prefix="torchtrt-serve-")
    job = config.job
    stop_timeout = None
    if isinstance(job, ServeJob):
        stop_timeout = job.stop_timeout
        config = config.with_(job=replace(job, drain_dir=drain_dir))
    # the launcher's multiprocessing resource tracker would warn about the queues' semaphores
    # that drained ranks, ended by a signal, held
    warnings = os.environ.get("PYTHONWARNINGS")
    os.environ["PYTHONWARNINGS"] = ",".join(
        filter(None, [warnings, "ignore:resource_tracker:UserWarning"])
    )
    try:
        result = launch(
            rank_entry,
            world,
            [
                rank_job.rank_main,
                config,
                logging.getLogger().getEffectiveLevel(),
            ],  # -v reaches ranks
            stop_timeout=stop_timeout,
            env=rank_env(os.environ),  # runtime/huge_pages.py
        )
        drained = all((Path(drain_dir) / f"rank-{r}.drained").is_file() for r in range(world))
    finally:
        shutil.rmtree(drain_dir, ignore_errors=True)
    stopped = result.failure is None or result.failure.signal in (signal.SIGTERM, signal.SIGINT)
    if result.ok or (drained and stopped):
        return 0  # a signal to the launcher, forwarded to the ranks, drained them cleanly
    print_launch_failure(result, verbose=verbose)
    return int(result.returncode)
