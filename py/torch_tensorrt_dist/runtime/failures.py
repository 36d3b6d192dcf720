"""Which rank failed first, and the one line a launcher prints about it (torchrun and mpirun)."""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

__all__ = [
    "FailedRank",
    "LaunchInterrupted",
    "exit_status",
    "format_failure",
    "parse_mpirun_failure",
    "pick_first_failure",
    "read_failure_records",
    "with_detail",
]


class LaunchInterrupted(Exception):
    """The launcher itself got a signal (Ctrl-C, SIGTERM) and stopped the ranks."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by signal {signum}")
        self.signum = signum


@dataclass(frozen=True)
class FailedRank:
    """The first rank that failed: its global rank, and how it ended."""

    rank: int | None
    exit_code: int | None = None
    signal: int | None = None
    host: str | None = None
    pid: int | None = None
    detail: str | None = None

    def how(self) -> str:
        if self.signal is not None:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = f"signal {self.signal}"
            return f"was killed by {name} (signal {self.signal})"
        if self.exit_code is not None:
            return f"exited with code {self.exit_code}"
        return "failed"


def exit_status(failure: FailedRank | None, returncode: int) -> int:
    """The launcher's own exit status: the failed rank's code, ``128 + signal`` for a signal."""
    if failure is not None and failure.signal is not None:
        return 128 + failure.signal
    if failure is not None and failure.exit_code:
        return failure.exit_code
    return returncode if returncode > 0 else (128 - returncode if returncode < 0 else 1)


def format_failure(launcher: str, failure: FailedRank | None, world_size: int) -> str:
    """One line for stderr naming the failed rank, how it ended, and that the others stopped."""
    if failure is None or failure.rank is None:
        head = f"torchtrt-dist run ({launcher}): a rank of {world_size} failed"
        how = f" ({failure.how()})" if failure is not None else ""
        return f"{head}{how}; the job was stopped. See the ranks' output above."
    where = []
    if failure.host:
        where.append(f"on {failure.host}")
    if failure.pid:
        where.append(f"pid {failure.pid}")
    place = f" ({', '.join(where)})" if where else ""
    line = (
        f"torchtrt-dist run ({launcher}): rank {failure.rank} of {world_size}{place} "
        f"{failure.how()}; the other ranks were stopped."
    )
    if failure.detail:
        line += f" Error: {failure.detail}"
    return line


# Open MPI 4 ("[[jobid,1],rank]") and PRRTE / Open MPI 5 ("[prterun-host-1@1,rank]").
_EXIT_RE = re.compile(
    r"Process name:\s*\[(?:\[[^\]]*\]|[^\]\[,]*),(?P<rank>\d+)\]"
    r"(?:\s*Exit code:\s*(?P<code>-?\d+))?"
)
_SIGNAL_RE = re.compile(
    r"process rank (?P<rank>\d+) with PID (?P<pid>\d+) on node (?P<host>\S+?)"
    r" exited on signal (?P<sig>\d+)"
)


def parse_mpirun_failure(text: str) -> FailedRank | None:
    """Find the first failed rank in ``mpirun``'s output (None if it names none)."""
    sig = _SIGNAL_RE.search(text)
    ext = _EXIT_RE.search(text)
    if sig is not None and (ext is None or sig.start() < ext.start()):
        pid = int(sig["pid"]) or None  # mpirun prints PID 0 when it no longer knows it
        return FailedRank(int(sig["rank"]), signal=int(sig["sig"]), host=sig["host"], pid=pid)
    if ext is not None:
        code = int(ext["code"]) if ext["code"] is not None else None
        return FailedRank(int(ext["rank"]), exit_code=code)
    return None


def read_failure_records(folder: str | None) -> dict[int, dict[str, Any]]:
    """The records ranks left in ``folder`` (see ``_rank_entry.py``), by global rank."""
    records: dict[int, dict[str, Any]] = {}
    if not folder or not os.path.isdir(folder):
        return records
    for name in sorted(os.listdir(folder)):
        if not (name.startswith("rank-") and name.endswith(".json")):
            continue
        try:
            with open(os.path.join(folder, name)) as fh:
                data = json.load(fh)
            records[int(data["rank"])] = data
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a half-written or foreign file: the exit codes still tell
    return records


def pick_first_failure(
    failed: Mapping[int, FailedRank], records: Mapping[int, Mapping[str, Any]]
) -> FailedRank | None:
    """The rank that failed first, from what the launcher saw and what ranks recorded (pure).

    A failed rank without a record died abruptly (a signal, ``os._exit``, a crash in native
    code): its peers only fail later, when their connection to it breaks, so it is the root
    cause. Otherwise the earliest recorded failure wins. ``failed`` may be empty (mpirun named
    nobody); then the records alone decide.

    Among several abrupt ranks, one ended by SIGTERM or SIGINT comes last: that is how a
    launcher stops the survivors once a rank has failed (torchrun may then list them as failed
    too), and Python leaves no record when it dies of SIGTERM.
    """
    stop_signals = (signal.SIGTERM, signal.SIGINT)
    abrupt = sorted(
        (r for r in failed if r not in records),
        key=lambda r: (failed[r].signal in stop_signals, r),
    )
    if abrupt:
        return failed[abrupt[0]]
    if not records:
        return None
    rank = min(records, key=lambda r: (float(records[r].get("time", 0.0)), r))
    rec = records[rank]
    base = failed.get(rank, FailedRank(rank))
    code = rec.get("exit_code")
    return replace(
        base,
        exit_code=base.exit_code if base.exit_code is not None else code,
        detail=base.detail or rec.get("error"),
    )


def with_detail(failure: FailedRank, records: Mapping[int, Mapping[str, Any]]) -> FailedRank:
    """``failure`` with the error text its rank recorded, if any."""
    rec = records.get(failure.rank) if failure.rank is not None else None
    if rec is None or failure.detail or not rec.get("error"):
        return failure
    return replace(failure, detail=str(rec["error"]))
