"""Speculative decoding in the paged core: proposers, the acceptance rule, per-row k.

    spec = SpeculativeConfig(method="ngram", num_tokens=4)
    gen = Generator(model, speculative=spec)        # the core verifies k + 1 tokens a row

A decoding row whose proposer offers k tokens runs as a chunk of k + 1 (its last token and the
k proposals) in the step's verify call, which returns the logits of every position
(``Transformer.paged_step(..., every=True)``); ``verify.py`` accepts the longest prefix the
target agrees with and samples one more token; ``speculator.py`` is the core's side of it
(proposals, the verify call, acceptance, the rewind of the blocks of what was rejected).
"""

from torch_tensorrt_dist.generation.speculative.config import (
    METHODS,
    SPECULATIVE_TOKENS_RANGE,
    SpeculativeConfig,
)
from torch_tensorrt_dist.generation.speculative.proposer import NgramProposer, Proposer
from torch_tensorrt_dist.generation.speculative.rejection import accept_point_mass
from torch_tensorrt_dist.generation.speculative.state import RowSpeculation

__all__ = [
    "METHODS",
    "SPECULATIVE_TOKENS_RANGE",
    "NgramProposer",
    "Proposer",
    "RowSpeculation",
    "SpeculativeConfig",
    "accept_point_mass",
]
