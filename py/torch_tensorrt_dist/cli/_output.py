"""What ``torchtrt-dist generate`` shows on rank 0: the streamed text, then a JSON object or
a status line (shared by generation from a checkpoint and from artifacts)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Output"]


class Output:
    """Rank 0's output of one request; other ranks print nothing."""

    def __init__(
        self, ns: argparse.Namespace, tok: Any, n_prompts: int, stop_ids: Sequence[int], rank: int
    ) -> None:
        from torch_tensorrt_dist.generation import TextStream

        self.ns, self.tok, self.stop_ids, self.rank = ns, tok, tuple(stop_ids), rank
        self.stream = TextStream(tok, n_prompts)
        #: a single prompt without --json is streamed as it is generated
        self.streaming = rank == 0 and not ns.json and n_prompts == 1

    def on_step(self) -> Callable[[list[list[int]]], None] | None:
        """The generator's per-step callback (None when nothing is streamed): the new ids of
        each prompt; prints the prompt first."""
        if not self.streaming:
            return None
        print(self.ns.prompt[0], end="", flush=True)

        def step(new: list[list[int]]) -> None:
            piece = self.stream.push(new, self.stop_ids)[0]
            if piece:
                print(piece, end="", flush=True)

        return step

    def result(self, result: Any, fields: dict[str, Any], status: str) -> None:
        """The texts, then one JSON object (``--json``: the result and ``fields``) or the
        ``status`` line with ttft and decode speed on stderr."""
        if self.rank != 0:
            return
        stops = self.stop_ids
        texts = [self.tok.decode([i for i in ids if i not in stops]) for ids in result.tokens]
        if self.ns.json:
            summary = {
                "tokens": result.tokens,
                "text": texts,
                "ttft_s": result.ttft_s,
                "tokens_per_s": result.tokens_per_s,
                "prefill_len": result.prefill_len,
                "decode_steps": result.decode_steps,
                **fields,
            }
            print(json.dumps(summary), flush=True)
            return
        if self.streaming:
            print(flush=True)  # end the streamed line
        else:
            for prompt, text in zip(self.ns.prompt, texts):
                print(f"{prompt}{text}\n")
        print(
            f"{status} ttft {result.ttft_s * 1e3:.1f} ms, decode {result.tokens_per_s:.1f} tok/s",
            file=sys.stderr,
        )
