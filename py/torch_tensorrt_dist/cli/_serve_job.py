"""``serve``'s job in a rank: a generator of ``--max-batch-size`` rows over this rank's shard,
the control channel, then the server until SIGTERM (rank 0 also serves HTTP)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, cast

from torch_tensorrt_dist.cli._failures import reported_by_launcher
from torch_tensorrt_dist.cli._rank import RankJob
from torch_tensorrt_dist.config.jobs import ServeJob
from torch_tensorrt_dist.config.run import RunConfig
from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.families import ModelPlan, ModelSpec, Rank, check_kv_cache
from torch_tensorrt_dist.families.draft import draft_model
from torch_tensorrt_dist.generation.generate import Generator
from torch_tensorrt_dist.models.tokenizer import Tokenizer

if TYPE_CHECKING:
    import socket

    from torch_tensorrt_dist.serving.signals import StopSignals

__all__ = ["API_KEY_ENV", "DEFAULT_MAX_SEQ", "DEFAULT_ROWS", "ServeRankJob"]

DEFAULT_MAX_SEQ = 2048
DEFAULT_ROWS = 8
#: the environment variable --api-key defaults to (and the printed curl line reads)
API_KEY_ENV = "TORCHTRT_API_KEY"


def shape(config: RunConfig, plan: ModelPlan) -> tuple[int, int]:
    """(rows, tokens per row): the artifacts', else ``--max-batch-size`` (default 8) and
    ``--max-seq-len`` (default: the model's positions, at most 2048)."""
    if plan.manifest is not None:
        return int(plan.manifest.max_batch_size), int(plan.manifest.cache_len)
    rows = config.cache.max_batch_size or DEFAULT_ROWS
    cache_len = config.cache.max_seq_len or min(plan.args.max_seq_len, DEFAULT_MAX_SEQ)
    if cache_len < 2:
        raise ConfigError(f"--max-seq-len {cache_len} leaves no room: give at least 2")
    return rows, cache_len


@dataclass
class Built:
    generator: Generator
    tokenizer: Tokenizer
    rows: int
    cache_len: int
    signals: StopSignals
    """The rank's stop signals, installed before loading."""
    sock: socket.socket | None
    """Rank 0's listening socket, bound before loading (a busy port fails first); None on the
    other ranks."""


class ServeRankJob(RankJob[Built]):
    """``serve``'s job in a rank (``start(ns, job_of, ServeRankJob())``)."""

    #: in one process, a core for the HTTP process: on 2 cores, the rank's 2 threads left it
    #: none between steps (``runtime/threads.py``)
    reserve_cores = 1

    def check(self, config: RunConfig, spec: ModelSpec, plan: ModelPlan) -> None:
        rows, cache_len = shape(config, plan)
        if plan.manifest is None:  # artifacts hold the KV cache they were compiled for
            check_kv_cache(config, plan, rows, cache_len)

    def build(self, rank: Rank) -> Built:
        from torch_tensorrt_dist.serving.http import bind_socket
        from torch_tensorrt_dist.serving.signals import StopSignals

        # first: a SIGTERM while loading or warming up is noted (and answered once warm), instead
        # of ending this rank while its peers wait for it in a collective
        signals = StopSignals()
        job = cast(ServeJob, rank.config.job)
        sock = bind_socket(job.host, job.port) if rank.index == 0 else None
        rows, cache_len = shape(rank.config, rank.plan)
        gen = rank.generator(rows=rows, cache_len=cache_len, draft=draft_model(rank))
        return Built(gen, rank.tokenizer(), rows, cache_len, signals, sock)

    def run(self, rank: Rank, built: Built) -> int:
        """Serve until stopped. In a rank our launcher started, a failure leaves through
        ``SystemExit`` (the launcher prints its error) and a drained rank ends by the signal it was
        sent (the launcher waits for that)."""
        import torch.distributed as dist

        from torch_tensorrt_dist.serving.chat import load_chat_template
        from torch_tensorrt_dist.serving.server import serve_rank

        job = cast(ServeJob, rank.config.job)
        control: dist.ProcessGroup | None = None
        if rank.world > 1:
            # the control channel's own gloo group, on every rank in the same order, after the
            # model's groups (artifacts find theirs by name, and names follow creation order)
            group = dist.new_group(backend="gloo")
            if not isinstance(group, dist.ProcessGroup):
                raise ConfigError(
                    f"rank {rank.index} is not in the world group; relaunch every rank"
                )
            control = group
        name = job.served_model_name or rank.plan.name
        result = serve_rank(
            built.generator,
            tokenizer=built.tokenizer,
            chat=load_chat_template(rank.plan.tokenizer_dir),
            stop_ids=tuple(built.tokenizer.eos_ids or rank.plan.args.eos_token_ids),
            config=replace(job, served_model_name=name),
            control=control,
            on_ready=lambda url, s, loop: _ready(rank, built, name, url, s, loop),
            signals=built.signals,
            sock=built.sock,
        )
        print(result.summary, file=sys.stderr, flush=True)
        launched_by_us = reported_by_launcher()
        if result.code:
            if launched_by_us:
                raise SystemExit(result.code) from result.error
            return result.code
        if job.drain_dir:
            Path(job.drain_dir, f"rank-{rank.index}.drained").touch()
        if launched_by_us and result.signal is not None:
            # the launcher forwarded a SIGTERM (or SIGINT) and now waits for this process to end:
            # the drain has finished, so end by that signal, as asked
            from torch_tensorrt_dist.runtime import end_by_signal

            if dist.is_initialized():
                dist.destroy_process_group()
            end_by_signal(result.signal)
        return 0


def _ready(rank: Rank, built: Built, name: str, url: str, warm_s: float, loop: str) -> None:
    job, p = cast(ServeJob, rank.config.job), rank.plan.parallel
    body = json.dumps({"model": name, "prompt": "The return statement", "max_tokens": 32})
    auth = f' -H "Authorization: Bearer ${API_KEY_ENV}"' if job.api_key else ""
    stages = f"pp={p.pp} " if p.pp > 1 else ""
    print(
        f"serving {name} at {url}/v1 ({stages}tp={p.tp} ep={p.ep}, engine "
        f"{built.generator.runner.engine}, "
        f"{built.rows} rows x {built.cache_len} tokens, HTTP on {loop}, "
        f"warm-up {warm_s:.1f} s)",
        flush=True,
    )
    print(
        f"curl {url}/v1/completions -H 'Content-Type: application/json'{auth} -d '{body}'",
        flush=True,
    )
