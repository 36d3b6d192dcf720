"""runtime/ports.py: a rendezvous port outside the kernel's ephemeral range, and free."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

from torch_tensorrt_dist.runtime import ports


def test_port_is_free_and_outside_the_ephemeral_range() -> None:
    low, high = ports.ephemeral_range()
    rng = random.Random(0)
    for _ in range(20):
        port = ports.free_port(rng=rng)
        assert ports.LOWEST <= port < low or high < port <= 65535
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free: it binds


def test_a_bound_port_is_never_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (20002, 65535))  # room: 20000, 20001
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 20000))
        busy.listen()
        got = {ports.free_port(rng=random.Random(seed)) for seed in range(10)}
    assert got == {20001}


def test_no_room_outside_the_range_falls_back_to_the_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (1024, 65535))
    port = ports.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_range_read_from_the_kernel_file_or_linux_default(tmp_path: Path) -> None:
    f = tmp_path / "range"
    f.write_text("40000\t50000\n")
    assert ports.ephemeral_range(str(f)) == (40000, 50000)
    assert ports.ephemeral_range(str(tmp_path / "absent")) == (32768, 60999)
    f.write_text("garbage")
    assert ports.ephemeral_range(str(f)) == (32768, 60999)
