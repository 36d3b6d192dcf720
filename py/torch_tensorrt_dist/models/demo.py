"""The small demo checkpoint that ``torchtrt-dist generate`` uses when no ``--model`` is given.

The checkpoint lives in ``torch_tensorrt_dist/data/demo/``: a Hugging Face style
``LlamaForCausalLM`` (4 layers, 8 query heads, 4 KV heads, tied embeddings, bfloat16) and a
byte-level BPE tokenizer, both trained here on text that ships with Python itself: the prose of
the language reference topics (``pydoc_data.topics``, PSF licence) and the Zen of Python.

``demo_checkpoint_path()`` only locates the files (no transformers import). ``train_demo()``
rebuilds them deterministically; it needs ``transformers`` (a development dependency)::

    python -m torch_tensorrt_dist.models.demo --out DIR [--steps N]

Same seed, thread count, Python version (the topics text) and torch version give the same
weights.
"""

from __future__ import annotations

import argparse
import codecs
import hashlib
import json
import logging
import math
import platform
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import torch

from torch_tensorrt_dist.errors import ConfigError

__all__ = [
    "DEMO_FILES",
    "DemoTrainResult",
    "corpus_sha256",
    "demo_checkpoint_path",
    "demo_corpus",
    "main",
    "train_demo",
    "train_tokenizer",
]

logger = logging.getLogger(__name__)

DEMO_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
TRAIN_INFO = "train_info.json"
BOS, EOS = "<s>", "</s>"
_PROSE_CHARS = frozenset(" ,.'\"-:;()\u2019\u2018")


def demo_checkpoint_path() -> Path:
    """Return the folder of the shipped demo checkpoint (config, weights, tokenizer).

    Raises ConfigError when a file is missing (a broken install or an unbuilt checkout).
    """
    path = Path(__file__).resolve().parent.parent / "data" / "demo"
    missing = [name for name in DEMO_FILES if not (path / name).is_file()]
    if missing:
        raise ConfigError(
            f"the demo checkpoint in {path} lacks {', '.join(missing)}; reinstall the package "
            "(its package_data must include data/demo/*) or rebuild it with "
            "`python -m torch_tensorrt_dist.models.demo --out <that folder>`"
        )
    return path


def _zen_of_python() -> str:
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):  # `import this` prints the poem
        import this
    return codecs.decode(this.s, "rot13")


def _is_prose(paragraph: str) -> bool:
    if "::=" in paragraph or ">>>" in paragraph or len(paragraph.split()) < 4:
        return False
    ok = sum(c.isalpha() or c in _PROSE_CHARS for c in paragraph)
    return ok / len(paragraph) >= 0.93


def demo_corpus() -> list[str]:
    """The training paragraphs: prose of Python's reference topics, then the Zen of Python.

    Code samples and grammar rules are dropped; wrapped lines are joined; the order is fixed.
    """
    from pydoc_data.topics import topics

    paragraphs: list[str] = []
    for key in sorted(topics):
        for block in re.split(r"\n\s*\n", topics[key]):
            lines = [ln.strip() for ln in block.split("\n")]
            # Drop reST title underlines such as "*****" or "=====".
            lines = [ln for ln in lines if ln and not set(ln) <= set("*=-~^")]
            if lines and _is_prose(" ".join(lines)):
                paragraphs.append(" ".join(lines))
    zen = _zen_of_python().strip().split("\n")
    paragraphs.extend(line.strip() for line in zen if line.strip())
    return paragraphs


def corpus_sha256(paragraphs: Sequence[str]) -> str:
    """A digest of the training text, recorded with the checkpoint (it varies by Python version)."""
    return hashlib.sha256("\n\n".join(paragraphs).encode("utf-8")).hexdigest()


def train_tokenizer(paragraphs: Sequence[str], vocab_size: int = 1024) -> Any:
    """Train a byte-level BPE tokenizer (any text round-trips) that prepends ``<s>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(paragraphs), trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tok


@dataclass(frozen=True)
class DemoTrainResult:
    """What ``train_demo`` did: steps run, last smoothed training loss, wall seconds."""

    out_dir: Path
    steps: int
    final_loss: float
    seconds: float
    tokens: int


def _token_stream(tok: Any, paragraphs: Sequence[str]) -> torch.Tensor:
    # Each paragraph is a document: <s> text </s>, concatenated in corpus order.
    eos_id = tok.token_to_id(EOS)
    ids: list[int] = []
    for enc in tok.encode_batch(list(paragraphs)):
        ids.extend(enc.ids)
        ids.append(eos_id)
    return torch.tensor(ids, dtype=torch.long)


def _lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def _model_config(vocab_size: int, seq_len: int, bos_id: int, eos_id: int) -> dict[str, Any]:
    return {
        "vocab_size": vocab_size,
        "hidden_size": 256,
        "intermediate_size": 768,  # 3 x 256: divisible by 64 x 4 for TP 2 and 4
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 32,
        "max_position_embeddings": seq_len,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "hidden_act": "silu",
    }


def _write_side_files(out: Path, cfg: dict[str, Any], seq_len: int, info: dict[str, Any]) -> None:
    # transformers 5 writes rope_parameters; keep the flat keys older readers expect too.
    config = json.loads((out / "config.json").read_text())
    config["rope_theta"] = cfg["rope_theta"]
    config["torch_dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "model_max_length": seq_len,
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    (out / TRAIN_INFO).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


def train_demo(
    out_dir: str | Path,
    *,
    steps: int = 400,
    seed: int = 0,
    threads: int = 2,
    batch_size: int = 8,
    seq_len: int = 256,
    lr: float = 3e-3,
    vocab_size: int = 1024,
    log_every: int = 25,
) -> DemoTrainResult:
    """Train the demo tokenizer and model from a fixed seed and save them to ``out_dir``.

    Writes config.json, generation_config.json, model.safetensors (bfloat16), tokenizer.json
    and tokenizer_config.json. Needs ``transformers``; runs on CPU with ``threads`` threads.
    """
    if steps < 1 or batch_size < 1 or seq_len < 8 or threads < 1:
        raise ConfigError(
            f"train_demo got steps={steps}, batch_size={batch_size}, seq_len={seq_len}, "
            f"threads={threads}; use steps, batch_size, threads >= 1 and seq_len >= 8"
        )
    try:
        import tokenizers
        import transformers
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as exc:
        raise ConfigError(
            "training the demo checkpoint needs transformers: pip install -e '.[dev]'"
        ) from exc

    start = time.perf_counter()
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    paragraphs = demo_corpus()
    tok = train_tokenizer(paragraphs, vocab_size)
    data = _token_stream(tok, paragraphs)
    logger.info("corpus: %d paragraphs, %d tokens", len(paragraphs), data.numel())

    cfg = _model_config(tok.get_vocab_size(), seq_len, tok.token_to_id(BOS), tok.token_to_id(EOS))
    model = LlamaForCausalLM(LlamaConfig(**{**cfg, "attn_implementation": "sdpa"}))
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
    )
    gen = torch.Generator().manual_seed(seed)
    offsets = torch.arange(seq_len)
    smooth = float("nan")
    warmup = max(1, steps // 20)
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, steps, lr, warmup)
        starts = torch.randint(0, data.numel() - seq_len, (batch_size,), generator=gen)
        batch = data[starts[:, None] + offsets]  # [B, S]
        # The model shifts the labels itself: position t predicts token t + 1.
        # bfloat16 autocast: faster on CPUs with AVX512-BF16 (weights stay float32).
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        value = float(loss.detach())
        smooth = value if math.isnan(smooth) else 0.9 * smooth + 0.1 * value
        if (step + 1) % log_every == 0 or step + 1 == steps:
            elapsed = time.perf_counter() - start
            logger.info("step %d/%d loss %.4f (%.0f s)", step + 1, steps, smooth, elapsed)

    model.eval()
    cast(Any, model).to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    tok.save(str(out / "tokenizer.json"))
    seconds = time.perf_counter() - start
    info = {
        "command": f"python -m torch_tensorrt_dist.models.demo --out DIR --steps {steps}",
        "seed": seed,
        "threads": threads,
        "steps": steps,
        "batch_size": batch_size,
        "seq_len": seq_len,
        "lr": lr,
        "final_loss": round(smooth, 4),
        "seconds": round(seconds, 1),
        "corpus_paragraphs": len(paragraphs),
        "corpus_tokens": int(data.numel()),
        "corpus_sha256": corpus_sha256(paragraphs),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
    }
    _write_side_files(out, cfg, seq_len, info)
    return DemoTrainResult(out, steps, smooth, seconds, int(data.numel()))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m torch_tensorrt_dist.models.demo",
        description="Rebuild the demo checkpoint (tokenizer + tiny Llama) deterministically.",
    )
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--steps", type=int, default=400, help="optimizer steps (default 400)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    parser.add_argument(
        "--install", action="store_true", help="also copy the result over the shipped checkpoint"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        result = train_demo(args.out, steps=args.steps, seed=args.seed, threads=args.threads)
    except ConfigError as exc:
        parser.error(str(exc))
    if args.install:
        target = Path(__file__).resolve().parent.parent / "data" / "demo"
        target.mkdir(parents=True, exist_ok=True)
        for name in (*DEMO_FILES, "generation_config.json", TRAIN_INFO):
            shutil.copy2(Path(args.out) / name, target / name)
    summary = asdict(result) | {"out_dir": str(result.out_dir)}
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
