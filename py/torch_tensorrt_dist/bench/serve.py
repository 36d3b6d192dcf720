"""``bench --section serve``: our server against ``transformers serve`` on one checkpoint.

    torchtrt-dist bench --section serve            # the issues' sizes (about 15 min on 2 cores)
    torchtrt-dist bench --section serve --quick    # fewer and shorter requests

One run, one random-weight checkpoint written to a temporary directory (``serve_checkpoint``),
loopback only, every request streamed through the official ``openai`` client:

1. ``torchtrt-dist serve`` (TP 1, one thread, an empty Inductor cache: the cold warm-up), then
   1, 8 and 32 concurrent clients;
2. our server again (the cache now filled: the warm warm-up) and ``transformers serve
   --continuous-batching`` on the same checkpoint (one thread) beside it: half of ``rounds``
   rounds of the same clients, each client count on one server then the other, the order
   swapped each round (the ratio is the median of those pairs: this machine's load drifts
   within a run);
3. transformers serve stops; on ours, 32 requests at once in the KV memory of 8 rows x 512
   tokens, 7 streams that a 2,000-token prompt joins, and two requests sharing a 1,500-token
   prefix (issue 28); then the other half of the rounds, transformers serve started first
   and ours beside it (a server started before another runs slower: ``_halves``);
4. both servers once more, neither told how many threads to use (what a user who starts each
   as it comes gets), up at once: 1 and 8 clients, alternated as in steps 2 and 3;
5. in this process: a generator of the server's shape, built between steps 1 and 2 (its
   graphs), whose ``generate`` is timed after each round of step 2 (the one-client figure is
   the median of those pairs), and at the end the decode step at several cache lengths
   (``serve_step``).

Figures and goals: ``serve_report``. Every figure is a ratio or a time of this run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import tempfile
from collections.abc import Callable, Coroutine, Iterator
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from torch_tensorrt_dist.bench.common import Figure
from torch_tensorrt_dist.bench.serve_checkpoint import CHECKPOINT, bench_checkpoint
from torch_tensorrt_dist.bench.serve_control import PROMPTS
from torch_tensorrt_dist.bench.serve_hf import (
    HF_ENV,
    HF_READY,
    hf_serve_command,
    hf_serve_unavailable,
)
from torch_tensorrt_dist.bench.serve_load import ServerProcess
from torch_tensorrt_dist.bench.serve_report import (
    ServeMeasured,
    ThreadCPU,
    serve_report,
)
from torch_tensorrt_dist.bench.serve_scenarios import join_during_streams, random_ids, shared_prefix
from torch_tensorrt_dist.bench.serve_sizes import ServeSizes
from torch_tensorrt_dist.bench.serve_streams import ClientRun, run_clients
from torch_tensorrt_dist.errors import ConfigError

__all__ = ["our_server_args", "serve_figures"]

logger = logging.getLogger(__name__)

MODEL = "bench"
#: the longest any part of the run may take (seconds)
RUN_TIMEOUT_S = 900
T = TypeVar("T")


def _run(coro: Coroutine[Any, Any, T]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, RUN_TIMEOUT_S)

    return asyncio.run(bounded())


@contextlib.contextmanager
def _env(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def our_server_args(path: str | Path, sizes: ServeSizes, kv_bytes: int) -> list[str]:
    """``torchtrt-dist serve`` options of the run (TP 1; the port is added by ServerProcess)."""
    return [
        "--model",
        str(path),
        "--engine",
        sizes.engine,
        "--max-batch-size",
        str(sizes.max_batch_size),
        "--max-seq-len",
        str(sizes.max_seq_len),
        "--kv-cache-memory",
        str(kv_bytes),
        "--served-model-name",
        MODEL,
    ]


def warmup_seconds(output: str) -> float:
    """The warm-up our server reports in its ``serving ... at URL`` line."""
    match = re.search(r"warm-up ([\d.]+) s\)", output)
    if match is None:
        raise ConfigError(f"no warm-up in the server's output:\n{output[-2000:]}")
    return float(match.group(1))


def http_loop(output: str) -> str:
    """The HTTP event loop our server names in its ``serving ... at URL`` line ("" if none)."""
    match = re.search(r"HTTP on (\w+)", output)
    return match.group(1) if match else ""


def _round(
    url: str, model: str, sizes: ServeSizes, c: int, server: ServerProcess | None = None
) -> tuple[ClientRun, ThreadCPU | None]:
    """One timed round of ``c`` concurrent clients; with ``server`` (ours), also the CPU its
    rank 0's step and HTTP threads used over it (``/metrics``)."""
    # a short round first: the connections are open and the prompts seen before timing
    _run(run_clients(url, model, PROMPTS, requests=c, concurrency=c, max_tokens=2))
    before = _thread_cpu(server)
    run = _run(
        run_clients(
            url,
            model,
            PROMPTS,
            requests=max(c * sizes.requests_per_client, sizes.min_requests),
            concurrency=c,
            max_tokens=sizes.max_tokens,
        )
    )
    after = _thread_cpu(server)
    if before is None or after is None:
        return run, None
    return run, ThreadCPU(after[0] - before[0], after[1] - before[1])


def _alternated(
    ours: ServerProcess,
    hf: ServerProcess | None,
    hf_model: str,
    s: ServeSizes,
    m: ServeMeasured,
    generate: Callable[[], float],
    rounds: range,
    first: str,
) -> None:
    """The warm rounds ``rounds`` of ours, each client count run beside the same count on
    ``hf`` (when it runs), the order swapped every round, and ``generate`` timed once a round
    (after the client counts: the one-client figure's pair); appended to ``m``, with the
    server started first (``first``)."""
    for r in rounds:
        runs: dict[int, ClientRun] = {}
        cpu: dict[int, ThreadCPU] = {}
        theirs: dict[int, ClientRun] = {}
        for c in s.clients:
            for side in ("ours", "hf") if r % 2 == 0 else ("hf", "ours"):
                if side == "ours":
                    runs[c], used = _round(ours.url, MODEL, s, c, ours)
                    if used is not None:
                        cpu[c] = used
                elif hf is not None:
                    theirs[c] = _round(hf.url, hf_model, s, c)[0]
        m.ours.append(runs)
        m.threads.append(cpu)
        if hf is not None:
            m.hf.append(theirs)
            m.first.append(first)
        m.generate.append(generate())


def _halves(rounds: int) -> tuple[range, range]:
    """The rounds run with our server started first, and those with transformers serve first:
    a server started before another ran 3-11 % slower than the same server started after it
    (two of ours up at once, 2026-12-05), so each order gets half the pairs."""
    half = (rounds + 1) // 2
    return range(half), range(half, rounds)


def _hf_server(path: Path, threads: int | None = 1) -> ServerProcess:
    return ServerProcess(
        [],
        command=hf_serve_command(path),
        ready=HF_READY,
        env=HF_ENV,
        threads=threads,
        start_timeout_s=RUN_TIMEOUT_S,
    )


def _at_defaults(
    path: Path, args: list[str], env: dict[str, str], s: ServeSizes, m: ServeMeasured
) -> None:
    """Both servers again, neither given ``OMP_NUM_THREADS`` (each picks its own threads), up
    at once: ``s.rounds`` rounds of the ``s.defaults`` client counts, alternated as above;
    appended to ``m.defaults`` (a server that does not start: ``m.defaults_reason``); half
    the rounds with ours started first, half with transformers serve first (``_halves``)."""
    from torch_tensorrt_dist.runtime.threads import cores_given

    m.default_threads = cores_given()
    try:
        for first, rounds in zip(("ours", "hf"), _halves(s.rounds), strict=True):
            with contextlib.ExitStack() as stack:
                servers = {
                    "ours": ServerProcess(args, env=env, threads=None),
                    "hf": _hf_server(path, threads=None),
                }  # started (entered) in this half's order: ``first``, then the other
                url = {
                    side: stack.enter_context(servers[side]).url
                    for side in sorted(servers, key=lambda side: side != first)
                }
                sides = {"ours": (url["ours"], MODEL), "hf": (url["hf"], str(path))}
                for r in rounds:
                    got: dict[int, tuple[float, float]] = {}
                    for c in s.defaults:
                        tps = {}
                        for side in ("ours", "hf") if r % 2 == 0 else ("hf", "ours"):
                            tps[side] = _round(*sides[side], s, c)[0].tokens_per_s
                        got[c] = (tps["ours"], tps["hf"])
                    m.defaults.append(got)
    except Exception as exc:  # a server did not start or a round failed: say why, go on
        m.defaults_reason = f"{type(exc).__name__}: {str(exc)[-600:]}"


def _thread_cpu(server: ServerProcess | None) -> tuple[float, float] | None:
    """CPU seconds of rank 0's step and HTTP threads so far (None: not reported there)."""
    if server is None:
        return None
    values = server.metrics()
    keys = [f'torchtrt_thread_cpu_seconds_total{{thread="{t}"}}' for t in ("step", "http")]
    if not all(k in values for k in keys):
        return None
    return values[keys[0]], values[keys[1]]


def _scenarios(url: str, sizes: ServeSizes, vocab: int, special: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["burst"] = _run(
        run_clients(
            url,
            MODEL,
            PROMPTS,
            requests=sizes.burst_requests,
            concurrency=sizes.burst_requests,
            max_tokens=sizes.burst_tokens,
        )
    )
    long_ids = random_ids(sizes.join_prompt, vocab=vocab, seed=1, avoid=special)
    streams = [PROMPTS[i % len(PROMPTS)] for i in range(sizes.join_streams)]
    out["join"] = _run(
        join_during_streams(url, MODEL, streams, long_ids, stream_tokens=sizes.stream_tokens)
    )
    prefix = random_ids(sizes.prefix, vocab=vocab, seed=2, avoid=special)
    a = random_ids(sizes.suffix, vocab=vocab, seed=3, avoid=special)
    b = random_ids(sizes.suffix, vocab=vocab, seed=4, avoid=special)
    out["prefix"] = _run(shared_prefix(url, MODEL, prefix, a, b))
    return out


def serve_figures(sizes: ServeSizes | None = None) -> list[Figure]:
    import json

    import torch

    from torch_tensorrt_dist.bench.serve_step import (
        decode_step_times,
        generate_speed,
        kv_bytes_per_live_token,
        server_generator,
    )
    from torch_tensorrt_dist.generation.kv_memory import kv_layout_for
    from torch_tensorrt_dist.models.llama_args import read_config
    from torch_tensorrt_dist.models.tokenizer import load_tokenizer

    s = sizes or ServeSizes.full()
    s.check(CHECKPOINT["max_position_embeddings"])
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="torchtrt-bench-serve-") as tmp:
        path = bench_checkpoint(Path(tmp) / "model")
        cache = {"TORCHINDUCTOR_CACHE_DIR": str(Path(tmp) / "inductor")}
        args = read_config(path)
        layout = kv_layout_for(args, tp=1, dtype=torch.float32, block_size=16)
        kv_bytes = s.kv_cache_tokens * layout.bytes_per_token
        config = json.loads((path / "config.json").read_text())
        special = [int(config["bos_token_id"]), int(config["eos_token_id"])]
        m = ServeMeasured(ours=[], block_size=layout.block_size)
        server_args = our_server_args(path, s, kv_bytes)

        logger.info("serve bench: our server, cold")
        with ServerProcess(server_args, env=cache) as ours:
            cold = warmup_seconds(ours.output())
            rounds = [_round(ours.url, MODEL, s, c, ours) for c in s.clients]
            m.ours.append({c: run for c, (run, _) in zip(s.clients, rounds)})
            m.threads.append({c: cpu for c, (_, cpu) in zip(s.clients, rounds) if cpu})

        logger.info("serve bench: a generator of the server's shape, in this process")
        prompt = load_tokenizer(path, vocab_size=args.vocab_size).encode(PROMPTS[0])
        with _env(**cache):
            gen, m.graphs = server_generator(
                path,
                engine=s.engine,
                max_batch_size=s.max_batch_size,
                cache_len=s.max_seq_len,
                kv_cache_memory=kv_bytes,
            )
        generate_speed(gen, prompt, max_new_tokens=s.max_tokens)  # untimed: caches, allocator

        m.hf_reason = "" if s.baseline else "not run (baseline off)"
        m.hf_reason = m.hf_reason or hf_serve_unavailable()
        logger.info("serve bench: our server, warm (then transformers serve beside it)")
        ours_first, hf_first = _halves(s.rounds)
        # the generator's graphs are all compiled: timing it compiles nothing
        timed = partial(generate_speed, gen, prompt, max_new_tokens=s.max_tokens)
        with ServerProcess(server_args, env=cache) as ours, contextlib.ExitStack() as stack:
            warm, m.loop = warmup_seconds(ours.output()), http_loop(ours.output())
            hf = None
            if not m.hf_reason:
                try:
                    hf = stack.enter_context(_hf_server(path))
                except ConfigError as exc:  # it did not start: say why, keep our figures
                    m.hf_reason = f"transformers serve did not run: {str(exc)[-600:]}"
            _alternated(ours, hf, str(path), s, m, timed, ours_first, "ours")
            stack.close()  # transformers serve stops before the scenarios
            scenes = _scenarios(ours.url, s, args.vocab_size, special)
        if m.hf and hf_first:  # transformers serve ran: the pairs with it started first
            logger.info("serve bench: transformers serve first, then our server beside it")
            try:
                with _hf_server(path) as hf, ServerProcess(server_args, env=cache) as ours:
                    _alternated(ours, hf, str(path), s, m, timed, hf_first, "hf")
            except ConfigError as exc:  # the first half's pairs stand; say why there are few
                m.order_reason = f"the pairs with transformers serve first: {str(exc)[-600:]}"
        del gen, timed  # its KV pool and compiled graphs, before the decode steps' generators
        if s.defaults and not m.hf_reason:
            logger.info("serve bench: both servers at their default threads, alternated")
            _at_defaults(path, server_args, cache, s, m)
        m.warmup_s = (cold, warm)
        m.burst, m.join, m.prefix = scenes["burst"], scenes["join"], scenes["prefix"]

        logger.info("serve bench: decode steps by cache length, in this process")
        with _env(**cache):
            steps = decode_step_times(
                path,
                caches=s.caches,
                rows=(s.step_rows,),
                live=s.live,
                engine=s.engine,
            )
        m.step_s = {c: t for (c, _), t in steps.items()}
        paged, static = kv_bytes_per_live_token(layout, live=s.live, cache_len=max(s.caches))
        m.kv_bytes = (paged, static, layout.bytes_per_token)
    m.load = f"{load_start:.1f} / {os.getloadavg()[0]:.1f}"
    return serve_report(m, s)
