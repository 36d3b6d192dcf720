"""``bench --section serve_clients``: what each client of a streamed completion sees.

    figures = client_view(streams)   # pure: gaps between events, first event, events per token

The serving benchmark's checkpoint (``serve_checkpoint.py``: 4096 positions, the demo model's
byte-level BPE, greedy runs to the token limit) is served at TP 1 and 2 as the issue served it
(``--max-seq-len 4096``, 32 rows); each client is a process of its own
(``stream_client.py``: no interpreter lock shared with the other clients; niceness +10, so
that on a machine of 2 cores the bench's own clients do not take the CPU from the server as
clients on other machines would not), and every client of a run sends at once. Runs per TP:

* C = 1, 8 and 32 streamed completions, long (1,500 tokens) then short (64 tokens): the wait
  from the request to its first event, the gaps between events (p50 / p99 / max over every
  stream's gaps), and events per token (below 1: pieces were merged for a slow reader, or text
  was held back by the detokenizer). Greedy text of random weights drifts into bytes that never
  form a character: the issue's freeze showed there.
* 7 and 31 long streams at once read by the official ``openai`` client, every stream a task
  of the bench's own process (the issue's second reader; the process is not niced).
* a hostile stream beside 7 plain ones: its ``logit_bias`` (+100 on every token made of UTF-8
  continuation bytes) makes its whole text bytes that never form a character. The plain
  streams' largest gap against the 8 plain streams' run; and the HTTP process's CPU per token
  (its event loop's thread: ``torchtrt_thread_cpu_seconds_total{thread="http"}``) for the
  hostile stream alone against a plain stream alone (the C = 1 long run).
* a client that stops reading (4 KiB receive buffer; its request 8 choices with 20 logprobs a
  token, so that its events outgrow the socket buffers) beside 7 plain ones, until the server
  counts a cut stream, the server's ``--write-timeout`` short
  (``ClientSizes.write_timeout_s``): the plain streams' largest gap against the 8 plain
  streams' run (the stalled request holds 8 rows more), and whether the stalled stream ended
  with the error event.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch_tensorrt_dist.bench.common import Figure
from torch_tensorrt_dist.bench.serve_control import PROMPTS
from torch_tensorrt_dist.bench.serve_load import ServerProcess, percentile
from torch_tensorrt_dist.bench.serve_streams import Stream

__all__ = [
    "ClientSizes",
    "client_view",
    "continuation_ids",
    "run_client_processes",
    "serve_clients",
]

SECTION = "serve_clients (CPU, gloo, bench checkpoint)"
#: the goal of the issue: no client waits longer than this for its next event
MAX_WAIT_S = 0.5
#: the plain streams' largest gap beside a hostile or stalled client: within this of without
SAME_GAP_S = 0.1
#: the HTTP process's CPU per token of a hostile stream: within this factor of a plain one's
CPU_RATIO = 2.0
#: the client processes' niceness: they yield the CPU to the server (``stream_client.py``)
NICE = 10
#: choices of the stalled client's request (each with 20 logprobs a token: its events are big)
STALLED_CHOICES = 8
CLIENT = Path(__file__).with_name("stream_client.py")
_CPU = 'torchtrt_thread_cpu_seconds_total{thread="http"}'
_CUT = 'torchtrt_requests_total{status="slow_client"}'
#: the server's memory may grow by at most this while a client stalls (MiB): its stream's
#: events (~3 MB a second at 8 choices of 20 logprobs) are cut, never queued
STALL_GROWTH_MIB = 32


@dataclass(frozen=True)
class ClientSizes:
    """The runs of the section."""

    clients: tuple[int, ...] = (1, 8, 32)
    long_tokens: int = 1500
    short_tokens: int = 64
    openai_clients: tuple[int, ...] = (7, 31)
    """Long streams read by the official ``openai`` client, every stream a task of one process
    (the issue's other reader), after the runs of separate client processes."""
    engine: str = "inductor"
    tp: tuple[int, ...] = (1, 2)
    max_seq_len: int = 4096
    write_timeout_s: float = 2.0
    """The server's ``--write-timeout`` (short: the stalled client's run stays short)."""
    others: bool = True
    """The hostile and the stalled client's runs."""

    @classmethod
    def quick(cls) -> ClientSizes:
        """Fewer runs, the eager model; the long streams stay 1,500 tokens (the stalled
        client's must outgrow the socket buffers)."""
        return cls(clients=(1, 8), short_tokens=16, engine="none", tp=(1,), openai_clients=(2,))


def client_view(streams: Sequence[Stream]) -> dict[str, float]:
    """The figures of one run's streams (seconds; pure): the first event's wait (p50, max),
    the gaps between events (p50, p99, max), and events per generated token."""
    gaps = [g for s in streams for g in s.gaps]
    tokens = sum(s.completion_tokens for s in streams)
    return {
        "first_p50": percentile([s.ttft for s in streams], 0.5),
        "first_max": max((s.ttft for s in streams), default=0.0),
        "gap_p50": percentile(gaps, 0.5),
        "gap_p99": percentile(gaps, 0.99),
        "gap_max": max(gaps, default=0.0),
        "events_per_token": sum(len(s.times) for s in streams) / tokens if tokens else 0.0,
    }


def continuation_ids(tokenizer_json: str | Path) -> list[int]:
    """The ids of a byte-level BPE tokenizer whose bytes are all UTF-8 continuation bytes
    (0x80-0xBF): text of them alone never forms a character."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    # GPT-2's byte <-> character table of byte-level BPE
    kept = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars = {chr(b): b for b in kept}
    chars.update({chr(256 + i): b for i, b in enumerate(b for b in range(256) if b not in kept)})
    out = []
    for token, i in tok.get_vocab().items():
        raw = [chars.get(c) for c in token]
        if raw and all(b is not None and 0x80 <= b <= 0xBF for b in raw):
            out.append(i)
    return sorted(out)


def _body(prompt: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": "bench",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }


def run_client_processes(
    url: str,
    bodies: Sequence[dict[str, Any]],
    *,
    stalled: int | None = None,
    resume_when: Callable[[], bool] = lambda: False,
) -> list[dict[str, Any]]:
    """Each body streamed by a client process of its own (``stream_client.py``), all sent at
    once; their records. ``stalled``: the index of a client that stops reading after its
    first event until ``resume_when()`` (asked every 0.5 s) or the others have ended."""
    start = time.monotonic() + 1.0 + 0.1 * len(bodies)  # every process started by then
    with tempfile.TemporaryDirectory() as tmp:
        resume = Path(tmp) / "resume"
        procs = []
        for i, body in enumerate(bodies):
            spec: dict[str, Any] = {"url": url, "body": body, "start": start, "nice": NICE}
            if i == stalled:
                spec.update(stall_s=3600.0, resume=str(resume))
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(CLIENT), json.dumps(spec)],
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        others = [p for i, p in enumerate(procs) if i != stalled]
        if stalled is not None:
            while any(p.poll() is None for p in others) and not resume_when():
                time.sleep(0.5)
            resume.touch()
        outs = {i: p.communicate(timeout=1800)[0] for i, p in enumerate(procs)}
    records = []
    for i, p in enumerate(procs):
        if p.returncode != 0:
            raise RuntimeError(f"a client process failed ({p.returncode}): {outs[i][-2000:]}")
        records.append(json.loads(outs[i].strip().splitlines()[-1]))
    return records


def _streams(records: Sequence[dict[str, Any]]) -> list[Stream]:
    for r in records:
        if "error" in r:
            raise RuntimeError(f"a stream ended with an error: {r['error']}")
    return [Stream(r["sent"], list(r["times"]), completion_tokens=r["tokens"]) for r in records]


def _plain(url: str, clients: int, tokens: int) -> list[Stream]:
    bodies = [_body(PROMPTS[i % len(PROMPTS)], tokens) for i in range(clients)]
    return _streams(run_client_processes(url, bodies))


def _openai(url: str, clients: int, sizes: ClientSizes) -> list[Stream]:
    """``clients`` long streams at once through one ``openai.AsyncOpenAI`` client, each a
    task of this process (not niced: the reader competes with the server for the cores)."""
    from torch_tensorrt_dist.bench.serve_streams import run_clients

    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(clients)]
    run = asyncio.run(
        run_clients(
            url,
            "bench",
            prompts,
            requests=clients,
            concurrency=clients,
            max_tokens=sizes.long_tokens,
        )
    )
    return run.streams


def _largest_wait(stream: Stream) -> float:
    return max([stream.ttft, *stream.gaps])


def serve_clients(sizes: ClientSizes | None = None) -> list[Figure]:
    from torch_tensorrt_dist.bench.serve_checkpoint import bench_checkpoint

    sizes = sizes or ClientSizes()
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = bench_checkpoint(tmp)
        hostile = {str(i): 100 for i in continuation_ids(path / "tokenizer.json")}
        args = ["--model", str(path), "--engine", sizes.engine, "--served-model-name", "bench"]
        rows = max(*sizes.clients, 7 + STALLED_CHOICES)  # every stream of a run has a row
        args += ["--max-batch-size", str(rows), "--max-seq-len"]
        args += [str(sizes.max_seq_len), "--write-timeout", str(sizes.write_timeout_s)]
        for tp in sizes.tp:
            with ServerProcess([*args, "--tp", str(tp)]) as server:
                _plain(server.url, 1, 4)  # warm-up
                views: dict[tuple[str, int], dict[str, float]] = {}
                cpu: dict[str, float] = {}
                for kind, tokens in (("long", sizes.long_tokens), ("short", sizes.short_tokens)):
                    for c in sizes.clients:
                        before = server.metrics().get(_CPU, 0.0)
                        streams = _plain(server.url, c, tokens)
                        if (kind, c) == ("long", 1):
                            cpu["plain"] = (server.metrics().get(_CPU, 0.0) - before) / tokens
                        views[kind, c] = view = client_view(streams)
                        figures += _figures(f"TP {tp}, C={c} {kind} ({tokens} tokens)", view)
                for c in sizes.openai_clients:
                    run = f"TP {tp}, C={c} long ({sizes.long_tokens} tokens), openai client"
                    figures += _figures(run, client_view(_openai(server.url, c, sizes)))
                if sizes.others:
                    base = views.get(("long", 8))
                    figures += _hostile(server, sizes, hostile, base, cpu.get("plain"), tp)
                    figures += _stalled(server, sizes, base, tp)
    return figures


def _hostile(
    server: ServerProcess,
    sizes: ClientSizes,
    bias: dict[str, int],
    base: dict[str, float] | None,
    plain_cpu: float | None,
    tp: int,
) -> list[Figure]:
    """7 plain streams and one whose ``logit_bias`` forces bytes that never form a character;
    then that stream alone, for the HTTP process's CPU per token."""
    n = sizes.long_tokens
    bodies = [_body(PROMPTS[i % len(PROMPTS)], n) for i in range(7)]
    bodies.append(_body(PROMPTS[0], n, logit_bias=bias))
    records = run_client_processes(server.url, bodies)
    streams = _streams(records)
    plain_gap = max(g for s in streams[:7] for g in s.gaps)
    run = f"TP {tp}, 7 plain + 1 logit_bias stream ({n} tokens)"
    out = [
        Figure(
            SECTION,
            f"{run}: hostile stream's largest wait; U+FFFD in its text",
            f"{_largest_wait(streams[7]):.3f}; {records[7]['fffd']} of {records[7]['chars']} chars",
            "s",
            goal=f"<= {MAX_WAIT_S} s",
            met=_largest_wait(streams[7]) <= MAX_WAIT_S,
        ),
        _beside(run, plain_gap, base),
    ]
    before = server.metrics().get(_CPU, 0.0)
    _streams(run_client_processes(server.url, [bodies[7]]))
    per_token = (server.metrics().get(_CPU, 0.0) - before) / n
    if plain_cpu:
        ratio = per_token / plain_cpu
        out.append(
            Figure(
                SECTION,
                f"TP {tp}: HTTP event loop CPU per token, logit_bias stream / plain stream "
                "(each alone)",
                f"{per_token * 1e6:.0f} / {plain_cpu * 1e6:.0f} us ({ratio:.2f}x)",
                goal=f"<= {CPU_RATIO}x",
                met=ratio <= CPU_RATIO,
            )
        )
    return out


def _stalled(
    server: ServerProcess, sizes: ClientSizes, base: dict[str, float] | None, tp: int
) -> list[Figure]:
    """7 plain streams and one whose client stops reading after its first event until the
    server counts a cut stream (``/metrics``; its error event waits ``CLOSE_AFTER`` write
    timeouts for the client), then reads what is left: the error event."""
    n, wt = sizes.long_tokens, sizes.write_timeout_s
    bodies = [_body(PROMPTS[i % len(PROMPTS)], n) for i in range(7)]
    # 8 choices of 20 logprobs a token: more than the socket buffers take (the kernel's send
    # buffer grows to 4 MiB; 2.9 MB had reached the client when a write blocked)
    bodies.append(_body(PROMPTS[0], n, logprobs=20, n=STALLED_CHOICES))
    before = server.metrics().get(_CUT, 0.0)
    rss = [server.memory()]

    def cut() -> bool:  # asked every 0.5 s while the client stalls: the memory sampled too
        rss.append(server.memory())
        return server.metrics().get(_CUT, 0.0) > before

    records = run_client_processes(server.url, bodies, stalled=7, resume_when=cut)
    streams = _streams(records[:7])
    plain_gap = max(g for s in streams for g in s.gaps)
    run = f"TP {tp}, 7 plain + 1 client that stops reading ({n} tokens, --write-timeout {wt:g} s)"
    error = records[7].get("error", "")
    return [
        _beside(run, plain_gap, base),
        Figure(
            SECTION,
            f"{run}: the stalled stream's end",
            f"error event after {len(records[7]['times'])} text events, {records[7]['bytes']} B"
            if error
            else f"no error event ({records[7]['bytes']} B read)",
            goal="an error event once its write deadline passed",
            met="did not read" in error,
            note=error[:120],
        ),
        Figure(
            SECTION,
            f"{run}: the server's processes' memory (all ranks and HTTP) while it stalls: "
            "largest growth over the run's start",
            f"{(max(rss) - rss[0]) / 2**20:.1f} MiB ({len(rss)} samples, 0.5 s apart)",
            goal=f"<= {STALL_GROWTH_MIB} MiB (the stalled stream's text is not held)",
            met=max(rss) - rss[0] <= STALL_GROWTH_MIB * 2**20,
        ),
    ]


def _beside(run: str, plain_gap: float, base: dict[str, float] | None) -> Figure:
    ref = base["gap_max"] if base else float("nan")
    return Figure(
        SECTION,
        f"{run}: plain streams' largest gap / 8 plain streams' largest gap",
        f"{plain_gap:.3f} / {ref:.3f}",
        "s",
        goal=f"within {SAME_GAP_S} s",
        met=None if base is None else plain_gap <= ref + SAME_GAP_S,
    )


def _figures(run: str, view: dict[str, float]) -> list[Figure]:
    waits = max(view["first_max"], view["gap_max"])
    return [
        Figure(SECTION, f"{run}: first event p50 / max", _pair(view, "first"), "s"),
        Figure(
            SECTION,
            f"{run}: gap between events p50 / p99 / max",
            f"{view['gap_p50']:.3f} / {view['gap_p99']:.3f} / {view['gap_max']:.3f}",
            "s",
            goal=f"largest wait <= {MAX_WAIT_S} s",
            met=waits <= MAX_WAIT_S,
        ),
        Figure(SECTION, f"{run}: events per token", round(view["events_per_token"], 3)),
    ]


def _pair(view: dict[str, float], name: str) -> str:
    return f"{view[f'{name}_p50']:.3f} / {view[f'{name}_max']:.3f}"
