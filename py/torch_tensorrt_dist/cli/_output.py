"""What ``torchtrt-dist generate`` shows on rank 0: the streamed text, then a JSON object or
a status line (shared by generation from a checkpoint and from artifacts)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from torch_tensorrt_dist.config.jobs import GenerateJob

__all__ = ["Output"]


class Output:
    """Rank 0's output of one request; other ranks print nothing."""

    def __init__(self, job: GenerateJob, tok: Any, stop_ids: Sequence[int], rank: int) -> None:
        from torch_tensorrt_dist.generation import TextStream

        self.job, self.tok, self.stop_ids, self.rank = job, tok, tuple(stop_ids), rank
        self.stream = TextStream(tok, len(job.prompts))
        #: a single prompt without --json is streamed as it is generated
        self.streaming = rank == 0 and not job.json and len(job.prompts) == 1

    def on_step(self) -> Callable[[list[int]], None] | None:
        """The generator's per-step callback (None when nothing is streamed); prints the
        prompt first."""
        if not self.streaming:
            return None
        print(self.job.prompts[0], end="", flush=True)

        def step(step_ids: list[int]) -> None:
            piece = self.stream.push(step_ids, self.stop_ids)[0]
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
        if self.job.json:
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
            for prompt, text in zip(self.job.prompts, texts):
                print(f"{prompt}{text}\n")
        print(
            f"{status} ttft {result.ttft_s * 1e3:.1f} ms, decode {result.tokens_per_s:.1f} tok/s",
            file=sys.stderr,
        )
