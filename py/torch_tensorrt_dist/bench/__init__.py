"""Benchmarks that print figures next to their goals (``torchtrt-dist bench``).

Speeds are ratios of two things measured in the same run, so a noisy machine shifts both.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from torch_tensorrt_dist.bench.common import Figure

__all__ = ["QUICK_SECTIONS", "SECTIONS", "Figure", "format_figures", "run_sections"]


def _communication() -> list[Figure]:
    from torch_tensorrt_dist.bench.communication import communication

    return communication()


def _compile() -> list[Figure]:
    from torch_tensorrt_dist.bench.compile_overhead import compile_overhead

    return compile_overhead()


def _decode() -> list[Figure]:
    from torch_tensorrt_dist.bench.decode import decode_speed

    return decode_speed()


def _memory() -> list[Figure]:
    from torch_tensorrt_dist.bench.memory import memory

    return memory()


def _verify() -> list[Figure]:
    from torch_tensorrt_dist.bench.verify_cost import verify_cost

    return verify_cost()


def _moe() -> list[Figure]:
    from torch_tensorrt_dist.bench.moe import moe_figures

    return moe_figures()


def _cold_start() -> list[Figure]:
    from torch_tensorrt_dist.bench.cold_start import cold_start

    return cold_start()


def _quantize() -> list[Figure]:
    from torch_tensorrt_dist.bench.quantize import quantize_figures

    return quantize_figures()


def _serve(*, quick: bool = False) -> list[Figure]:
    from torch_tensorrt_dist.bench.serve import serve_figures
    from torch_tensorrt_dist.bench.serve_sizes import ServeSizes

    return serve_figures(ServeSizes.quick() if quick else ServeSizes.full())


def _serve_control() -> list[Figure]:
    from torch_tensorrt_dist.bench.serve_control import serve_figures

    return serve_figures()


def _serve_clients(*, quick: bool = False) -> list[Figure]:
    from torch_tensorrt_dist.bench.serve_clients import ClientSizes, serve_clients

    return serve_clients(ClientSizes.quick() if quick else ClientSizes())


def _serve_vllm() -> list[Figure]:
    from torch_tensorrt_dist.bench.serve_vllm import serve_vllm

    return serve_vllm()


def _grammar() -> list[Figure]:
    from torch_tensorrt_dist.bench.grammar_cost import grammar_cost

    return grammar_cost() + grammar_cost(tools=True)


def _speculative() -> list[Figure]:
    from torch_tensorrt_dist.bench.speculative import speculative_figures

    return speculative_figures()


def _hf_family() -> list[Figure]:
    from torch_tensorrt_dist.bench.hf_family import hf_family

    return hf_family()


def _gpu() -> list[Figure]:
    from torch_tensorrt_dist.bench.gpu import gpu

    return gpu()


#: section name -> function returning its figures (in the order they run)
SECTIONS: dict[str, Callable[[], list[Figure]]] = {
    "communication": _communication,
    "compile": _compile,
    "decode": _decode,
    "memory": _memory,
    "verify": _verify,
    "moe": _moe,
    "cold_start": _cold_start,
    "quantize": _quantize,
    "serve": _serve,
    "serve_control": _serve_control,
    "serve_clients": _serve_clients,
    "serve_vllm": _serve_vllm,
    "grammar": _grammar,
    "speculative": _speculative,
    "hf_family": _hf_family,
    "gpu": _gpu,
}
#: sections with smaller counts under ``--quick`` (the same figures)
QUICK_SECTIONS: dict[str, Callable[[], list[Figure]]] = {
    "serve": partial(_serve, quick=True),
    "serve_clients": partial(_serve_clients, quick=True),
}


def run_sections(
    names: list[str], progress: Callable[[str], None] | None = None, *, quick: bool = False
) -> list[Figure]:
    """The figures of the named sections, in order; ``quick``: the smaller counts of the
    sections that have them (``QUICK_SECTIONS``)."""
    figures: list[Figure] = []
    for name in names:
        if progress is not None:
            progress(name)
        run = QUICK_SECTIONS.get(name, SECTIONS[name]) if quick else SECTIONS[name]
        figures += run()
    return figures


def format_figures(figures: list[Figure]) -> str:
    from torch_tensorrt_dist.backend.report import format_table

    rows = [
        [
            f.section,
            f.name,
            f"{f.value:,}"
            if isinstance(f.value, (int, float)) and not isinstance(f.value, bool)
            else str(f.value),
            f.unit,
            f.goal or "-",
            {True: "met", False: "NOT MET", None: "-"}[f.met],
            f.note,
        ]
        for f in figures
    ]
    return format_table(["section", "figure", "value", "unit", "goal", "status", "note"], rows)
