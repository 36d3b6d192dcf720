"""The suite's header names the CPU the results came from (tests/conftest.py)."""

from __future__ import annotations

import torch

from .conftest import cpu_report

CPUINFO = """processor\t: 0
model name\t: AMD EPYC 9R14 96-Core Processor
flags\t\t: fpu sse avx2 avx512f avx512_vnni avx512_bf16 avx512bw
"""


def test_the_header_names_the_model_its_isa_torchs_capability_and_the_thp_mode():
    line = cpu_report(CPUINFO, "always [madvise] never\n")
    capability = torch.backends.cpu.get_cpu_capability()
    assert line == (
        "cpu: AMD EPYC 9R14 96-Core Processor; isa: avx2 avx512f avx512_vnni avx512_bf16; "
        f"torch cpu capability: {capability}; thp: madvise"
    )


def test_without_cpuinfo_or_thp_the_header_says_so():
    line = cpu_report("", None)
    assert "isa: none listed" in line and line.endswith("thp: absent")
