"""Held-out text for the demo model: Python help text it was not trained on.

The demo checkpoint was trained on the prose paragraphs of ``pydoc_data.topics`` (the text
behind ``help("return")``, ``models/demo.py``). This is the prose of the *other* half of
Python's help system, the docstrings ``help()`` shows for the builtins: every public name of
``builtins`` in sorted order (for classes other than exceptions, then each public attribute
in sorted order), ``inspect.getdoc`` of each, split into paragraphs at blank lines, wrapped
lines joined, kept only if it passes the training corpus's own prose rule
(``demo._is_prose``), appears nowhere in the training paragraphs, and was not kept before.
CPython 3.11.7 gives 450 paragraphs (47,880 characters, 17,837 tokens with ``<s>``/``</s>``
per paragraph); ``data/demo/heldout.txt`` holds them, one per blank-line-separated block::

    python -m torch_tensorrt_dist.models.demo_heldout --out heldout.txt
"""

from __future__ import annotations

import argparse
import builtins
import inspect
import re
from collections.abc import Sequence
from pathlib import Path

__all__ = ["heldout_paragraphs", "heldout_path", "main"]


def heldout_path() -> Path:
    """The shipped held-out text (``data/demo/heldout.txt``)."""
    return Path(__file__).resolve().parent.parent / "data" / "demo" / "heldout.txt"


def _paragraphs(doc: str | None) -> list[str]:
    out = []
    for block in re.split(r"\n\s*\n", doc or ""):
        lines = [line.strip() for line in block.split("\n") if line.strip()]
        if lines:
            out.append(" ".join(lines))
    return out


def _docs() -> list[str | None]:
    docs: list[str | None] = []
    for name in sorted(dir(builtins)):
        if name.startswith("_"):
            continue
        obj = getattr(builtins, name)
        docs.append(inspect.getdoc(obj))
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            for attr in sorted(vars(obj)):
                if not attr.startswith("__"):
                    docs.append(inspect.getdoc(getattr(obj, attr)))
    return docs


def heldout_paragraphs(training: Sequence[str] | None = None) -> list[str]:
    """The held-out paragraphs (see the module docstring); ``training``: the demo corpus
    (default: ``demo.demo_corpus()`` of this Python)."""
    from torch_tensorrt_dist.models.demo import _is_prose, demo_corpus

    seen = set(training if training is not None else demo_corpus())
    out: list[str] = []
    for doc in _docs():
        for paragraph in _paragraphs(doc):
            if _is_prose(paragraph) and paragraph not in seen:
                seen.add(paragraph)
                out.append(paragraph)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="file to write")
    ns = parser.parse_args(argv)
    Path(ns.out).write_text("\n\n".join(heldout_paragraphs()) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
