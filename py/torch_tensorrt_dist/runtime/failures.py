"""Which rank failed first, and the lines a launcher prints about it (torchrun and mpirun)."""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

__all__ = [
    "STOP_SIGNALS",
    "FailedRank",
    "LaunchInterrupted",
    "cause_record",
    "exit_status",
    "format_failure",
    "parse_mpirun_failure",
    "pick_first_failure",
    "read_failure_records",
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
    """What to print on stderr: the failed rank's own error in one line (when it left one),
    then one line naming the rank, how it ended, and that the others were stopped."""
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
        return f"rank {failure.rank}: {failure.detail}\n{line}"
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


#: Signals a launcher sends to stop the ranks that are left once one has failed.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _from_record(rank: int, rec: Mapping[str, Any], base: FailedRank | None) -> FailedRank:
    base = base or FailedRank(rank)
    code = rec.get("exit_code")
    return replace(
        base,
        exit_code=base.exit_code if base.exit_code is not None else code,
        host=base.host or rec.get("host"),
        pid=base.pid or rec.get("pid"),
        detail=base.detail or rec.get("error"),
    )


def pick_first_failure(
    failed: Mapping[int, FailedRank], records: Mapping[int, Mapping[str, Any]]
) -> FailedRank | None:
    """The rank whose failure caused the others, from what the launcher saw (``failed``: exit
    codes and signals) and what the ranks recorded (``records``) (pure).

    1. A rank that died abruptly (a signal other than a launcher's stop, ``os._exit``, a crash
       in native code: no record) is the cause: its peers fail only later, when their
       connection to it breaks, and leave records then.
    2. Else the earliest record of a rank that failed on its own account. A record that
       ``follows`` another rank (that rank's failure, repeated by ``runtime.agree`` on every
       rank) is not a cause; the rank it follows is.
    3. Else a rank ended by SIGTERM, SIGINT or SIGHUP: that is how a launcher stops the ranks
       left once one has failed (Python leaves no record then), so it is the cause only when
       nothing else failed (someone stopped that rank from outside).

    ``failed`` may be empty or name one rank only (mpirun, torchrun's function entries); the
    records decide then.
    """
    abrupt = sorted(r for r in failed if r not in records and failed[r].signal not in STOP_SIGNALS)
    if abrupt:
        return failed[abrupt[0]]
    own = {r: rec for r, rec in records.items() if rec.get("follows") is None}
    if own:
        rank = min(own, key=lambda r: (float(own[r].get("time") or 0.0), r))
        return _from_record(rank, own[rank], failed.get(rank))
    if records:  # every record follows another rank: that rank's own record is lost
        first = min(records, key=lambda r: (float(records[r].get("time") or 0.0), r))
        cause = int(records[first]["follows"])
        rec = {**records[first], "host": None, "pid": None}
        return _from_record(cause, rec, failed.get(cause))
    stopped = sorted(failed)
    return failed[stopped[0]] if stopped else None


def cause_record(
    failure: FailedRank | None, records: Mapping[int, Mapping[str, Any]]
) -> Mapping[str, Any] | None:
    """The record the chosen failure comes from (its traceback), if it left one."""
    if failure is None or failure.rank is None:
        return None
    rec = records.get(failure.rank)
    return rec if rec is not None and rec.get("follows") is None else None
