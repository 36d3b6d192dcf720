"""Which of transformers' causal LMs the transformers family runs: a walk over
``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` that records, per ``model_type``, whether a native
family runs it, whether a tiny random-weight checkpoint of it gives transformers' own greedy
tokens through this family at TP 1, or why it is refused; and whether its TP-2 plan passes the
checks. It writes the table of ``docs/models.md`` between its markers:

    python -m torch_tensorrt_dist.models.hf_survey docs/models.md     # minutes: every type

``refusal`` is the config-only part (no weights, no model), the part ``tests/test_models_doc.py``
checks against the written table for a sample of types.
"""

from __future__ import annotations

import re
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from torch_tensorrt_dist.errors import CheckpointError, ConfigError

__all__ = ["BEGIN", "END", "causal_lm_types", "refusal", "survey", "tiny_config", "write_table"]

BEGIN = "<!-- survey:begin (python -m torch_tensorrt_dist.models.hf_survey docs/models.md) -->"
END = "<!-- survey:end -->"

#: the tiny sizes, for the fields a config class has
TINY: dict[str, Any] = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=256,
    max_position_embeddings=256,
    moe_intermediate_size=32,
    num_experts=4,
    num_local_experts=4,
    n_routed_experts=4,
    num_experts_per_tok=2,
    pad_token_id=0,
    bos_token_id=None,
    eos_token_id=None,
)
PROMPTS = [[1, 5, 7, 9, 11, 13, 2, 3, 4, 5], [3, 4, 8]]
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
    default = cls()
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
    raise ConfigError(f"no tiny config of {kind!r}: {type(error).__name__}: {error}")


def _short(message: str) -> str:
    """A refusal's first clause (the table's cell)."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    first = re.sub(r" \([^()]*\)", "", first)
    return re.split(r": |; ", first, maxsplit=1)[0].replace("|", "/")


def refusal(kind: str, tp: int) -> str | None:
    """Why this family refuses ``kind`` at ``tp`` from its config alone (None: it plans)."""
    from torch_tensorrt_dist.models.hf_config import check_runnable

    try:
        check_runnable(tiny_config(kind), tp=tp)
    except ConfigError as exc:
        return _short(str(exc))
    return None


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


def _exact(kind: str, root: Path) -> str:
    """A tiny random checkpoint of ``kind`` through this family at TP 1 against
    transformers' greedy ``generate``: "exact", "differs" or the refusal / error."""
    import torch
    import transformers

    from torch_tensorrt_dist.generation.generate import Generator
    from torch_tensorrt_dist.models.hf_config import read_hf_config
    from torch_tensorrt_dist.parallel.hf_load import build_meta, check_hf_checkpoint, load_hf

    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(
        tiny_config(kind), dtype=torch.float32, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.2)
    path = root / kind
    hf.save_pretrained(path)
    ref = []
    for p in PROMPTS:
        ids = hf.generate(
            torch.tensor([p]), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False
        )
        ref.append(ids[0, len(p) :].tolist())
    cfg = read_hf_config(path)
    try:
        check_hf_checkpoint(path, build_meta(cfg, torch.float32))
    except (ConfigError, CheckpointError) as exc:
        return "refused: " + _short(str(exc).removeprefix(f"{path}: ").removeprefix(f"{path} "))
    model = load_hf(path, cfg)
    gen = Generator(model, engine="none", max_batch_size=2, cache_len=32, block_size=4)  # type: ignore[arg-type]
    got = gen.generate(PROMPTS, max_new_tokens=NEW).tokens
    return "exact" if got == ref else "differs"


def survey(
    kinds: list[str] | None = None, *, run: bool = True, seconds: int = 120
) -> dict[str, tuple[str, str]]:
    """model_type -> (TP 1, TP 2): "native", "exact", "differs", "refused: why", "error: ...";
    TP 2 is the plan's checks only ("plans" or "refused: why"); ``run`` False: TP 1 too
    ("plans" where the config passes, nothing built)."""
    from torch_tensorrt_dist.families import NATIVE_MODEL_TYPES

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds or causal_lm_types():
            start = time.perf_counter()
            try:
                with _deadline(seconds):
                    tp2 = refusal(kind, 2)
                    if kind in NATIVE_MODEL_TYPES:
                        tp1 = f"native ({NATIVE_MODEL_TYPES[kind]})"
                    else:
                        why = refusal(kind, 1)
                        if why is not None:
                            tp1 = f"refused: {why}"
                        else:
                            tp1 = _exact(kind, Path(tmp)) if run else "plans"
            except Exception as exc:  # the table records what went wrong
                tp1, tp2 = f"error: {type(exc).__name__}: {_short(str(exc))[:80]}", ""
            else:
                tp2 = "plans" if tp2 is None else f"refused: {tp2}"
            out[kind] = (tp1, tp2)
            print(f"{kind}: {tp1} | {tp2} ({time.perf_counter() - start:.1f} s)", file=sys.stderr)
    return out


def write_table(doc: Path, rows: dict[str, tuple[str, str]]) -> None:
    """Replace the table between :data:`BEGIN` and :data:`END` in ``doc``."""
    import transformers

    lines = [
        BEGIN,
        "",
        f"transformers {transformers.__version__}: {len(rows)} causal-LM model types.",
        "",
        "| model_type | TP 1 (tiny checkpoint, greedy vs transformers) | TP 2 (plan checks) |",
        "| --- | --- | --- |",
    ]
    lines += [f"| `{k}` | {a} | {b} |" for k, (a, b) in sorted(rows.items())]
    text = doc.read_text()
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    doc.write_text(head + "\n".join(lines) + "\n\n" + END + tail)


if __name__ == "__main__":
    target, args = Path(sys.argv[1]), sys.argv[2:]
    run = "--plans-only" not in args
    write_table(target, survey([a for a in args if a != "--plans-only"] or None, run=run))
