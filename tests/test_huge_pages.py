"""Transparent huge pages for torch's large CPU tensors (``runtime/huge_pages.py``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torch_tensorrt_dist.runtime.huge_pages import (
    THP_ENV,
    HugePages,
    huge_kib,
    rank_env,
    system_thp_mode,
    wanted,
)


def test_the_environment_decides_and_unset_means_on():
    assert wanted({})
    assert wanted({THP_ENV: "1"})
    assert not wanted({THP_ENV: "0"})
    assert not wanted({THP_ENV: " "})
    # launched ranks get the variable from their first line, unless the user set it
    assert rank_env({}) == {THP_ENV: "1"}
    assert rank_env({THP_ENV: "0"}) == {}


def test_the_system_mode_is_the_bracketed_word(tmp_path: Path):
    f = tmp_path / "enabled"
    f.write_text("always [madvise] never\n")
    assert system_thp_mode(str(f)) == "madvise"
    f.write_text("garbage\n")
    assert system_thp_mode(str(f)) is None
    assert system_thp_mode(str(tmp_path / "absent")) is None


_SMAPS = """\
00400000-00600000 r-xp 00000000 08:01 42     /usr/bin/python3
Size:               2048 kB
AnonHugePages:         0 kB
7f0000000000-7f0000800000 rw-p 00000000 00:00 0
Size:               8192 kB
AnonHugePages:      6144 kB
7f0000800000-7f0000a00000 rw-p 00000000 00:00 0
AnonHugePages:      2048 kB
7f0001000000-7f0001200000 rw-p 00000000 00:00 0
AnonHugePages:      2048 kB
"""


def test_huge_kib_sums_the_mappings_that_overlap_the_range(tmp_path: Path):
    f = tmp_path / "smaps"
    f.write_text(_SMAPS)
    assert huge_kib(0x7F0000100000, 0x7F0000100001, str(f)) == 6144  # inside one mapping
    assert huge_kib(0x7F00007FF000, 0x7F0000801000, str(f)) == 6144 + 2048  # two of them
    assert huge_kib(0x7F0000A00000, 0x7F0001000000, str(f)) == 0  # the gap between
    assert huge_kib(0x400000, 0x400001, str(f)) == 0
    assert huge_kib(0, 1, str(tmp_path / "absent")) is None
    f.write_text("zz-yy rw-p\n")
    assert huge_kib(0, 1, str(f)) is None


def test_each_state_says_what_it_does():
    assert "off (THP_MEM_ALLOC_ENABLE=0)" in HugePages(False, "madvise").describe()
    assert "mode is never" in HugePages(True, "never").describe()
    assert "on (system THP mode madvise)" in HugePages(True, "madvise", True).describe()
    assert "not granted" in HugePages(True, "madvise", False).describe()


_PROBE = textwrap.dedent(
    """
    import os, torch
    from torch_tensorrt_dist.cli import build_parser  # the CLI's imports, as main has them
    from torch_tensorrt_dist.runtime.huge_pages import THP_ENV, huge_kib, use_huge_pages
    use_huge_pages()
    assert THP_ENV not in os.environ or os.environ[THP_ENV] == "0", "the environment is restored"
    build_parser()
    x = torch.ones(64 * 2**18)  # 64 MiB
    huge = huge_kib(x.data_ptr(), x.data_ptr() + x.nbytes)
    print(huge)
    """
)


def _huge_kib(env_value: str | None) -> int:
    import os

    env = {k: v for k, v in os.environ.items() if k != THP_ENV}
    if env_value is not None:
        env[THP_ENV] = env_value
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(system_thp_mode() != "madvise", reason="needs the system's THP mode madvise")
def test_a_large_tensor_gets_huge_pages_unless_the_environment_says_no():
    """The allocator reads the variable at its first allocation: asked for first thing (as
    the CLI does), a 64 MiB tensor lies in huge pages; with THP_MEM_ALLOC_ENABLE=0 it does
    not. (The kernel may refuse a huge page when memory is fragmented: most of the tensor is
    asked for, not all.)"""
    assert _huge_kib(None) >= 32 * 1024
    assert _huge_kib("0") == 0
