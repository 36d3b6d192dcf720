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
    "ExitEvent",
    "FailedRank",
    "LaunchInterrupted",
    "cause_record",
    "exit_status",
    "format_failure",
    "is_peer_loss",
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

#: A broken connection in the operating system's words. In the error's own line these tell of
#: a peer that had gone only when another rank is known to have ended before (a checkpoint or
#: hub fetch says "Connection refused" too); with the name of a transport (below) they always
#: do, in the error's line or in the line of an error it came from. Lower case.
PEER_LOSS_MARKS = (
    "connection reset by peer",
    "connection closed by peer",
    "broken pipe",
    "connection refused",
)
#: What only torch.distributed's transports (gloo, NCCL, the c10d store) say when a peer has
#: gone: a lost peer wherever it stands in an exception line. Lower case.
TRANSPORT_LOSS_MARKS = (
    "connection was likely closed",
    "remote process exited",
    "ncclremoteerror",
    "communicator was aborted",
)
#: Names that make an operating system's broken connection a transport's. Lower case.
TRANSPORT_NAMES = ("gloo", "nccl", "c10d", "distnetworkerror", "distbackenderror", "diststoreerror")
#: The same, in the error's own line only: a compiled graph's collective wait that failed
#: (AOTInductor hides the cause behind "aoti_torch_cpu__c10d_functional_wait_tensor(...) API
#: call failed"; the peer's exit is what makes it fail).
PEER_LOSS_ERROR_MARKS = ("wait_tensor",)
#: How much later than a record a rank's death by a signal other than a launcher's stop (or
#: an ``os._exit`` with no word) may be seen and still come first, in seconds. The record's
#: time is when its rank failed; a death's is when the launcher's exit watch woke up to it,
#: which runs late under load, and a peer's error then follows the death within milliseconds.
ABRUPT_DEATH_GRACE_S = 0.25

# an exception line of a traceback ("ValueError: ...", "torch.distributed.DistNetworkError"),
# not a source line
_EXCEPTION_LINE = re.compile(r"^\s*[\w.]+(?:Error|Exception)\b(?::|$)")


@dataclass(frozen=True)
class ExitEvent:
    """A rank's end as the launcher saw it (``runtime.exit_watch``): ``time`` on the
    launcher's clock (``time.time()``, the clock the records use: the same node) when its watch
    thread woke up to the end, so later than the end under load, ``said``
    whether the rank ended through the trampoline (which then gave ``exit_code``), else how
    the kernel ended it where the launcher could read it (``signal``, ``exit_code``)."""

    rank: int
    time: float
    said: bool = False
    exit_code: int | None = None
    signal: int | None = None
    pid: int | None = None
    host: str | None = None

    def failure(self) -> bool | None:
        """True: it failed (a signal other than a launcher's stop, or a non-zero code); False:
        it ended well or was stopped; None: it ended without a word, how is not known."""
        if self.signal is not None:
            return self.signal not in STOP_SIGNALS
        if self.exit_code is not None:
            return self.exit_code != 0
        return None

    def failed_rank(self) -> FailedRank:
        return FailedRank(
            self.rank, exit_code=self.exit_code, signal=self.signal, host=self.host, pid=self.pid
        )


def _loss_words(record: Mapping[str, Any]) -> int:
    """2: the record tells of a lost peer for sure (``peer_lost``, a transport's words); 1: its
    error line has a broken connection in the operating system's words only; 0: neither."""
    if record.get("peer_lost"):
        return 2
    error = str(record.get("error") or "").lower()
    lines = [error] + [
        line.lower()
        for line in str(record.get("traceback") or "").splitlines()
        if _EXCEPTION_LINE.match(line)
    ]
    for line in lines:
        if any(m in line for m in TRANSPORT_LOSS_MARKS) or (
            any(m in line for m in PEER_LOSS_MARKS) and any(n in line for n in TRANSPORT_NAMES)
        ):
            return 2
    if any(m in error for m in PEER_LOSS_ERROR_MARKS):
        return 2
    return 1 if any(m in error for m in PEER_LOSS_MARKS) else 0


def is_peer_loss(record: Mapping[str, Any]) -> bool:
    """Whether a record may tell of a rank that failed because a peer had gone (pure): an
    error marked ``peer_lost``, or a broken connection (:data:`PEER_LOSS_MARKS`,
    :data:`TRANSPORT_LOSS_MARKS`) in its error line or, a transport's, in the exception line
    of an error it came from. Source lines of the traceback are not read."""
    return _loss_words(record) > 0


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


def _seen(
    rank: int, failed: Mapping[int, FailedRank], exits: Mapping[int, ExitEvent]
) -> FailedRank | None:
    """How ``rank`` ended, from the launcher's own report and the exit watch together."""
    got, ev = failed.get(rank), exits.get(rank)
    if ev is None:
        return got
    if got is None:
        return ev.failed_rank()
    if got.exit_code is None and got.signal is None:  # the launcher's report wins, if it has one
        got = replace(got, exit_code=ev.exit_code, signal=ev.signal)
    return replace(got, host=got.host or ev.host, pid=got.pid or ev.pid)


def _time(value: Any) -> float:
    return float(value or 0.0)


def _end_times(
    failed: Mapping[int, FailedRank],
    records: Mapping[int, Mapping[str, Any]],
    exits: Mapping[int, ExitEvent],
) -> dict[int, float]:
    """When each rank the exit watch saw ended, to compare with records' times. A death
    without a word, by a signal other than a launcher's stop or a non-zero code (also as the
    launcher reported it), gets :data:`ABRUPT_DEATH_GRACE_S`, as the watch sees it late; but
    not before the end of a rank with a record that the watch saw first (the watch sees ends
    in the order they happen: that rank's failure came before this death)."""
    times: dict[int, float] = {}
    for r, ev in exits.items():
        seen = _seen(r, failed, exits) or ev.failed_rank()
        abrupt = seen.signal not in STOP_SIGNALS if seen.signal is not None else seen.exit_code
        times[r] = ev.time
        if abrupt and not ev.said:
            first = [e.time for x, e in exits.items() if x in records and x != r]
            times[r] = max([ev.time - ABRUPT_DEATH_GRACE_S, *(t for t in first if t < ev.time)])
    return times


def _ended_before(
    rank: int,
    when: float,
    failed: Mapping[int, FailedRank],
    records: Mapping[int, Mapping[str, Any]],
    ends: Mapping[int, float],
) -> bool:
    """Whether a rank other than ``rank`` ended (or may have: a failure of unknown time, as on
    another node) before ``when``: then ``rank``'s broken connection tells of a lost peer."""
    for r, t in ends.items():
        if r != rank and t < when:
            return True
    for r, rec in records.items():
        if r != rank and _time(rec.get("time")) < when:
            return True
    return any(
        r != rank and r not in records and r not in ends and got.signal not in STOP_SIGNALS
        for r, got in failed.items()
    )


def pick_first_failure(
    failed: Mapping[int, FailedRank],
    records: Mapping[int, Mapping[str, Any]],
    exits: Mapping[int, ExitEvent] | None = None,
) -> FailedRank | None:
    """The rank whose failure caused the others (pure), from what the launcher saw
    (``failed``: exit codes and signals; ``exits``: when each rank on this node ended, and
    how) and what the ranks recorded (``records``).

    1. The causes are the ranks that failed on their own account: a record that neither
       ``follows`` another rank (that rank's failure, repeated by ``runtime.agree``) nor tells
       of a lost peer (:func:`is_peer_loss`: a transport's broken connection, a collective
       that broke when a peer exited; a broken connection in the operating system's words
       only when another rank ended before the record), and a rank that died abruptly (a
       signal other than a launcher's stop, ``os._exit``, a crash in native code: no record).
       The first cause wins: by its record's time, or for an abrupt death the time the exit
       watch saw it end, less :data:`ABRUPT_DEATH_GRACE_S` (but not before the end of a rank
       with a record that the watch saw first). A rank killed by such a signal
       whose time is unknown (no exit watch: another node) comes first, as its peers fail
       only when their connection to it breaks.
    2. Else a record that follows another rank names that rank (its own record is lost).
    3. Else a rank the launcher names by its exit code alone, of unknown time (another node),
       or a rank the exit watch saw end without a word, before the earliest record of a lost
       peer (after it, it is a rank the launcher stopped, reaped before its status was read).
    4. Else the earliest record of a lost peer (the peer that went left nothing).
    5. Else a rank ended by SIGTERM, SIGINT or SIGHUP: that is how a launcher stops the ranks
       left once one has failed, so it is the cause only when nothing else failed (someone
       stopped that rank from outside).

    ``failed`` may be empty or name one rank only (mpirun names the first exit it noticed,
    which under load is not always the first; torchrun's function entries); ``exits`` and the
    records decide then.
    """
    exits = exits or {}
    ends = _end_times(failed, records, exits)
    causes: list[tuple[tuple[int, float, int], FailedRank]] = []
    untimed: list[int] = []
    unknown: list[tuple[float, int]] = []
    for r, rec in records.items():
        words, when = _loss_words(rec), _time(rec.get("time"))
        if rec.get("follows") is not None or words == 2:
            continue
        if words == 1 and _ended_before(r, when, failed, records, ends):
            continue
        causes.append(((1, when, r), _from_record(r, rec, _seen(r, failed, exits))))
    for r in sorted((set(failed) | set(exits)) - set(records)):
        ev, seen = exits.get(r), _seen(r, failed, exits)
        if seen is None or seen.signal in STOP_SIGNALS:
            continue
        if ev is None:  # the launcher's report alone: another node, or no exit watch
            if seen.signal is not None:
                causes.append(((0, 0.0, r), seen))
            else:
                untimed.append(r)
        elif r in failed or ev.failure():  # the launcher's report first
            causes.append(((1, ends[r], r), seen))
        elif ev.failure() is None:
            unknown.append((ev.time, r))
    if causes:
        return min(causes, key=lambda c: c[0])[1]
    following = {r: rec for r, rec in records.items() if rec.get("follows") is not None}
    if following:  # every record follows another rank: that rank's own record is lost
        first = min(following, key=lambda r: (_time(following[r].get("time")), r))
        cause = int(following[first]["follows"])
        rec = {**following[first], "host": None, "pid": None}
        return _from_record(cause, rec, _seen(cause, failed, exits))
    if untimed:
        return failed[untimed[0]]
    losses = [(_time(rec.get("time")), r) for r, rec in records.items()]
    unknown = [u for u in unknown if not losses or u[0] < min(losses)[0]]
    if unknown:  # it ended first without a word, its peers only lost it
        return exits[min(unknown)[1]].failed_rank()
    if losses:  # only lost peers, and the rank that went left no trace
        first = min(losses)[1]
        return _from_record(first, records[first], _seen(first, failed, exits))
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
