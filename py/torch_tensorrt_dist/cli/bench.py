"""``torchtrt-dist bench``: communication, compile, decode, memory, serving, GPU and more.

    torchtrt-dist bench                       # every section (several minutes on 2 cores)
    torchtrt-dist bench --section communication --json figures.json
    torchtrt-dist bench --section serve --quick  # smaller counts, the same figures

Prints one table with each figure's goal and whether it is met; ``--json`` also writes them.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from typing import Any

from torch_tensorrt_dist.cli._options import add_command, add_threads

__all__ = ["register"]


def register(sub: Any) -> None:
    from torch_tensorrt_dist.bench import SECTIONS

    p = add_command(
        sub, "bench", "measure communication, compile overhead, decode speed and memory", __doc__
    )
    p.add_argument(
        "--section",
        action="append",
        choices=list(SECTIONS),
        help="run only these sections (repeatable; default: all)",
    )
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON to FILE")
    p.add_argument(
        "--quick",
        action="store_true",
        help="smaller counts and lengths where a section has them (serve); the same figures",
    )
    add_threads(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from torch_tensorrt_dist.bench import SECTIONS, format_figures, run_sections
    from torch_tensorrt_dist.runtime.threads import cores_given, rank_thread_count, use_threads

    if args.json:  # before the sections run: a wrong path would lose their figures
        from torch_tensorrt_dist.validation import check_output_file

        check_output_file(args.json, name="--json")
    names = args.section or list(SECTIONS)
    start = time.monotonic()

    def progress(name: str) -> None:
        print(f"[bench] {name} ({time.monotonic() - start:.0f} s)", file=sys.stderr, flush=True)

    threads = rank_thread_count(args.threads)
    with use_threads(threads):  # a section that runs its own ranks sets their threads itself
        figures = run_sections(names, progress, quick=args.quick)
    machine = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cores": cores_given(),
        "threads": threads,
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }
    print(format_figures(figures))
    print(f"\nmachine: {machine}; {time.monotonic() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "figures": [x.as_dict() for x in figures]}, f, indent=2)
    return 0
