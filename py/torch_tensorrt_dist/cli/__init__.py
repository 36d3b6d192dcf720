"""The ``torchtrt-dist`` command line.

Each subcommand is a module of this package that defines ``register(subparsers)``; the module
adds its parser and sets ``func`` (a callable taking the parsed args and returning an exit code).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys
from collections.abc import Sequence

from torch_tensorrt_dist._version import __version__
from torch_tensorrt_dist.errors import TensorRTDistError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchtrt-dist",
        description="Tensor- and pipeline-parallel inference with Torch-TensorRT.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more logging (-v info, -vv debug)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from torch_tensorrt_dist.runtime.huge_pages import use_huge_pages

    use_huge_pages()  # before this process's first tensor (runtime/huge_pages.py)
    parser = build_parser()
    args = parser.parse_args(argv)
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except TensorRTDistError as exc:
        from torch_tensorrt_dist.cli._failures import refuse

        return refuse(exc, 2, prefix=f"torchtrt-dist {args.command}: error")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
