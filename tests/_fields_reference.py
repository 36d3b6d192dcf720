"""HF transformers' reference of the demo checkpoint for tests/test_serve_fields.py: its
log_softmax at every position, and greedy decoding of its logits processed by a request's
sampling settings (``generation.logits_process.process``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from torch_tensorrt_dist.generation.logits_process import process
from torch_tensorrt_dist.generation.sampling import SamplingConfig
from torch_tensorrt_dist.models.tokenizer import load_tokenizer

transformers = pytest.importorskip("transformers")

#: the demo tokenizer's end-of-text id
EOS = (1,)


class Reference:
    """HF transformers' model of the checkpoint (float32, as the server runs it)."""

    def __init__(self, ckpt: Path) -> None:
        self.tok = load_tokenizer(ckpt, vocab_size=1024)
        self.hf = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
        self.hf.eval()
        self.chat_tok = transformers.AutoTokenizer.from_pretrained(ckpt)
        #: token text -> id, for the texts one id alone spells
        texts: dict[str, list[int]] = {}
        for i in range(1024):
            texts.setdefault(self.tok.token_text(i), []).append(i)
        self.ids = {t: ids[0] for t, ids in texts.items() if len(ids) == 1}

    def log_softmax(self, ids: list[int]) -> torch.Tensor:
        """[len(ids), V]: HF's log_softmax of the logits at every position."""
        with torch.no_grad():
            return torch.log_softmax(self.hf(torch.tensor([ids])).logits[0].float(), dim=-1)

    def greedy(self, prompt: list[int], max_new: int, **settings: Any) -> tuple[str, str]:
        """(text, finish) of the greedy argmax of HF's logits processed by ``settings``."""
        cfg = SamplingConfig(**settings)
        ends = cfg.end_ids(EOS)
        ids, out = list(prompt), []
        with torch.no_grad():
            for _ in range(max_new):
                logits = self.hf(torch.tensor([ids])).logits[0, -1].float()
                x = process(logits, cfg, prompt=prompt, output=out, eos_ids=ends)
                out.append(int(x.argmax()))
                ids.append(out[-1])
                if out[-1] in ends:
                    return self.tok.decode(out[:-1]), "stop"
        return self.tok.decode(out), "length"


def check_top(lp: torch.Tensor, top: dict[str, float], ref: Reference, k: int) -> None:
    """The top entries are HF's k most likely tokens (and the sampled one), values within 1e-4."""
    best = lp.topk(k)
    want = sorted(best.values.tolist(), reverse=True)
    got = sorted(top.values(), reverse=True)
    assert got[:k] == pytest.approx(want, abs=1e-4)
    for text, value in top.items():
        if text in ref.ids:
            assert value == pytest.approx(lp[ref.ids[text]].item(), abs=1e-4)
