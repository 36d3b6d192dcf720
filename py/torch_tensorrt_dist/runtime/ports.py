"""A free TCP port for a rendezvous on this machine, outside the kernel's ephemeral range.

    port = free_port()          # e.g. 23817: free now, and no outgoing connection will take it

A port that ``bind(0)`` returned is free only until the kernel hands it out again, and it hands
out ports of the same range to every outgoing connection (gloo's pairs, c10d store clients,
HTTP clients): between choosing a port and the rank that binds it minutes later (imports, an
MPI start), another job on the machine may hold it (``EADDRINUSE``). A port outside
``/proc/sys/net/ipv4/ip_local_port_range`` is taken only by someone who binds it explicitly, and
a random one of those collides with another job's choice rarely.
"""

from __future__ import annotations

import random
import socket

__all__ = ["ephemeral_range", "free_port"]

#: the ports chosen from: above the registered services most machines run
LOWEST = 20000
TRIES = 64


def ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """The kernel's range for outgoing connections (Linux's default where it is not readable)."""
    try:
        with open(path) as fh:
            low, high = (int(x) for x in fh.read().split()[:2])
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1", *, rng: random.Random | None = None) -> int:
    """A TCP port free on ``host`` now, outside the ephemeral range where there is room;
    else one that ``bind(0)`` gives."""
    low, high = ephemeral_range()
    pick = rng or random.SystemRandom()
    ranges = [(a, b) for a, b in ((LOWEST, low - 1), (high + 1, 65535)) if a <= b]
    if ranges:
        weights = [b - a + 1 for a, b in ranges]
        for _ in range(TRIES):
            a, b = pick.choices(ranges, weights)[0]
            port = pick.randint(a, b)
            if _bindable(host, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
