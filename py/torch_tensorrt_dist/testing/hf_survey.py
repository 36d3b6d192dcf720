"""Which of transformers' causal LMs the transformers family runs: a walk over
``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` that records, per ``model_type``, whether a native
family runs it, whether a tiny random-weight checkpoint of it gives transformers' own greedy
tokens through this family at TP 1, or why it is refused; and whether its TP-2 plan passes the
checks, and whether its pipeline stages (``--pp 2``) pass the plan's checks. It writes the
table of ``docs/models.md`` between its markers:

    python -m torch_tensorrt_dist.testing.hf_survey docs/models.md     # minutes: every type
    python -m torch_tensorrt_dist.testing.hf_survey docs/models.md --pp-only   # the PP column

``refusal`` is the config-only part (no weights, no model) and ``pp_refusal`` the PP checks on
a meta-device model (no weights), the parts ``tests/test_models_doc.py`` checks against the
written table for a sample of types.
"""

from __future__ import annotations

import re
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from torch_tensorrt_dist.errors import CheckpointError, ConfigError
from torch_tensorrt_dist.testing import checkpoints

__all__ = [
    "BEGIN",
    "END",
    "causal_lm_types",
    "pp_refusal",
    "read_table",
    "refusal",
    "survey",
    "tiny_config",
    "tp1_verdict",
    "write_table",
]

BEGIN = "<!-- survey:begin (python -m torch_tensorrt_dist.testing.hf_survey docs/models.md) -->"
END = "<!-- survey:end -->"

#: the tiny sizes, for the fields a config class has
TINY: dict[str, Any] = {**checkpoints.TINY, **checkpoints.TINY_EXPERTS}
PROMPTS = [[1, 5, 7, 9, 11, 13, 2, 3, 4, 5], [3, 4, 8]]
#: a tiny model built has at most this many parameters (else it is not tried)
MAX_PARAMETERS = 20_000_000
NEW = 6


def causal_lm_types() -> list[str]:
    """Every ``model_type`` transformers maps to a causal-LM class, sorted."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def tiny_config(kind: str) -> Any:
    """``kind``'s config class with the :data:`TINY` sizes it has fields for (its text
    config's, for a model with one); without the token ids, then without the head sizes, where
    the class refuses them. ConfigError where it takes none of these (never a full-size one)."""
    from transformers import CONFIG_MAPPING

    cls: Any = CONFIG_MAPPING[kind]
    try:
        default = cls()
    except Exception as exc:  # a class whose defaults do not validate
        raise ConfigError(f"no tiny config of {kind!r}: {type(exc).__name__}") from None
    text = default.get_text_config()
    own = text.to_dict()
    fields = {k: v for k, v in TINY.items() if k in own}
    sub = None if text is default else next(k for k, v in vars(default).items() if v is text)
    own.pop("layer_types", None)  # made again for the new layer count
    error: Exception | None = None
    for drop in ((), ("pad_token_id", "bos_token_id", "eos_token_id"), ("head_dim",)):
        fields = {k: v for k, v in fields.items() if k not in drop}
        try:
            return cls(**fields) if sub is None else cls(**{sub: {**own, **fields}})
        except Exception as exc:  # each class validates its own way
            error = exc
    raise ConfigError(f"no tiny config of {kind!r}: {type(error).__name__}")


def _short(message: str) -> str:
    """A refusal's first clause (the table's cell)."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    first = re.sub(r" \([^()]*\)", "", first)
    return re.split(r": |; ", first, maxsplit=1)[0].replace("|", "/")


def refusal(kind: str, tp: int) -> str | None:
    """Why this family refuses ``kind`` at ``tp`` from its config alone (None: it plans;
    ConfigError where no tiny config of it is made)."""
    from torch_tensorrt_dist.models.hf_config import check_runnable

    cfg = tiny_config(kind)
    try:
        check_runnable(cfg, tp=tp)
    except ConfigError as exc:
        return _short(str(exc))
    return None


def pp_refusal(kind: str) -> str | None:
    """Why this family refuses ``kind`` at ``--pp 2`` (``--tp 1``) before any weight is
    read: its TP-1 checks, then its PP plan's (``models/hf_stage.py``, on a meta-device
    model); None: it plans."""
    import torch

    from torch_tensorrt_dist.models.hf_config import check_runnable
    from torch_tensorrt_dist.models.hf_stage import check_pipeline
    from torch_tensorrt_dist.parallel.hf_load import build_meta

    cfg = tiny_config(kind)
    try:
        check_runnable(cfg, tp=1)
        check_pipeline(build_meta(cfg, torch.float32))
    except ConfigError as exc:
        return _short(str(exc))
    return None


def pp_cell(kind: str) -> str:
    """The table's PP cell of ``kind``: "plans", "refused: why", or what went wrong."""
    try:
        why = pp_refusal(kind)
    except Exception as exc:  # the table records what went wrong
        if isinstance(exc, ConfigError) and "no tiny config" in str(exc):
            return "not tried: no tiny config"
        return f"error: {type(exc).__name__}: {_short(str(exc))[:80]}"
    return "plans" if why is None else f"refused: {why}"


@contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    def expired(signum: int, frame: Any) -> None:
        raise TimeoutError(f"over {seconds} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _reference(cfg: Any, path: Path) -> list[list[int]]:
    """transformers' model of ``cfg`` (random weights) saved at ``path``; its greedy tokens of
    :data:`PROMPTS`."""
    import torch
    import transformers

    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(
        cfg, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.2)
    hf.save_pretrained(path)
    return checkpoints.hf_greedy(hf, PROMPTS, NEW)


def tp1_verdict(kind: str, root: Path) -> str:
    """A tiny random checkpoint of ``kind`` through this family at TP 1 against
    transformers' greedy ``generate``: "exact", "differs" or the refusal / error."""
    import torch
    import transformers

    from torch_tensorrt_dist.generation.generate import Generator
    from torch_tensorrt_dist.models.hf_config import read_hf_config
    from torch_tensorrt_dist.parallel.hf_load import build_meta, check_hf_checkpoint, load_hf

    cfg = tiny_config(kind)
    with torch.device("meta"):  # its size first: a field the tiny sizes miss stays full size
        meta = transformers.AutoModelForCausalLM.from_config(cfg)
        size = sum(p.numel() for p in meta.parameters())
    if size > MAX_PARAMETERS:
        return f"not tried: {size:,} parameters at the tiny sizes (a size field of its own)"
    try:  # transformers' own model at the tiny sizes (the reference)
        path = root / kind
        ref = _reference(cfg, path)
    except Exception as exc:  # its own code refuses the tiny sizes: nothing of ours ran
        return f"not tried: transformers' own model fails at the tiny sizes ({type(exc).__name__})"
    cfg = read_hf_config(path)  # as saved
    try:
        check_hf_checkpoint(path, build_meta(cfg, torch.float32))
    except (ConfigError, CheckpointError) as exc:
        return "refused: " + _short(str(exc).removeprefix(f"{path}: ").removeprefix(f"{path} "))
    model = load_hf(path, cfg)
    gen = Generator(model, engine="none", max_batch_size=2, cache_len=32, block_size=4)  # type: ignore[arg-type]
    got = gen.generate(PROMPTS, max_new_tokens=NEW).tokens
    return "exact" if got == ref else "differs"


#: a table row: (TP 1, TP 2, PP 2)
Row = tuple[str, str, str]


def survey(
    kinds: list[str] | None = None,
    *,
    run: bool = True,
    seconds: int = 120,
    on_row: Callable[[str, Row], None] | None = None,
) -> dict[str, Row]:
    """model_type -> (TP 1, TP 2, PP 2): "native", "exact", "differs", "refused: why",
    "error: ..."; TP 2 and PP 2 are the plan's checks only ("plans" or "refused: why"); ``run``
    False: TP 1 too ("plans" where the config passes, nothing built)."""
    from torch_tensorrt_dist.families import NATIVE_MODEL_TYPES

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds or causal_lm_types():
            start = time.perf_counter()
            tp2 = ""
            try:
                with _deadline(seconds):
                    why2 = refusal(kind, 2)
                    tp2 = "plans" if why2 is None else f"refused: {why2}"
                    if kind in NATIVE_MODEL_TYPES:
                        tp1 = f"native ({NATIVE_MODEL_TYPES[kind]})"
                    else:
                        why = refusal(kind, 1)
                        if why is not None:
                            tp1 = f"refused: {why}"
                        else:
                            tp1 = tp1_verdict(kind, Path(tmp)) if run else "plans"
            except Exception as exc:  # the table records what went wrong
                tp1 = f"error: {type(exc).__name__}: {_short(str(exc))[:80]}"
                if isinstance(exc, ConfigError) and "no tiny config" in str(exc):
                    why = str(exc).rsplit(": ", 1)[1]
                    tp1 = f"not tried: its config class validates no tiny config ({why})"
                elif "text configs were found" in str(exc):
                    tp1 = "not tried: several text configs (no single one to shrink)"
            row = (tp1, tp2, pp_cell(kind))
            out[kind] = row
            if on_row is not None:
                on_row(kind, row)
            took = time.perf_counter() - start
            print(f"{kind}: {' | '.join(row)} ({took:.1f} s)", file=sys.stderr)
    return out


def read_table(doc: Path) -> dict[str, Row]:
    """The rows written between :data:`BEGIN` and :data:`END` in ``doc`` (a row written
    before the PP column: its PP cell empty)."""
    section = doc.read_text().split(BEGIN, 1)[1].split(END, 1)[0]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")] + [""]
            rows[cells[0].strip("`")] = (cells[1], cells[2], cells[3])
    return rows


def _counts(rows: dict[str, Row], column: int = 0) -> dict[str, int]:
    """How many cells of a column begin with each answer ("exact", "refused", ...), most
    first."""
    counts: dict[str, int] = {}
    for row in rows.values():
        cell = row[column]
        word = "not tried" if cell.startswith("not tried") else re.split(r"[:( ]", cell)[0]
        counts[word] = counts.get(word, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def write_table(doc: Path, rows: dict[str, Row]) -> None:
    """Replace the table between :data:`BEGIN` and :data:`END` in ``doc``."""
    import transformers

    def counts(column: int) -> str:
        return ", ".join(f"{n} {word}" for word, n in _counts(rows, column).items())

    lines = [
        BEGIN,
        "",
        f"transformers {transformers.__version__}: {len(rows)} causal-LM model types; TP 1: "
        f"{counts(0)}; PP 2: {counts(2)}.",
        "",
        "| model_type | TP 1 (tiny checkpoint, greedy vs transformers) | TP 2 (plan checks) "
        "| PP 2 (plan checks) |",
        "| --- | --- | --- | --- |",
    ]
    lines += [f"| `{k}` | {a} | {b} | {c} |" for k, (a, b, c) in sorted(rows.items())]
    text = doc.read_text()
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    doc.write_text(head + "\n".join(lines) + "\n\n" + END + tail)


def main(argv: list[str]) -> None:
    """``DOC [--plans-only | --pp-only] [MODEL_TYPE ...]``: the named types (default every
    one) walked, their rows written into DOC's table as each finishes (the other rows kept);
    ``--pp-only``: only their PP cells (the other cells kept)."""
    target, args = Path(argv[0]), argv[1:]
    rows = read_table(target)
    kinds = [a for a in args if a not in ("--plans-only", "--pp-only")] or None
    if "--pp-only" in args:
        for kind in kinds or causal_lm_types():
            tp1, tp2, _ = rows.get(kind, ("", "", ""))
            rows[kind] = (tp1, tp2, pp_cell(kind))
            print(f"{kind}: {rows[kind][2]}", file=sys.stderr)
        write_table(target, rows)
        return

    def on_row(kind: str, row: Row) -> None:
        rows[kind] = row
        write_table(target, rows)

    survey(kinds, run="--plans-only" not in args, on_row=on_row)


if __name__ == "__main__":
    main(sys.argv[1:])
