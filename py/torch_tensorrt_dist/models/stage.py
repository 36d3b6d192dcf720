"""A pipeline stage of a decoder: the model of its family with only this stage's parts.

    role = StageRole(index=1, count=2, layers=range(2, 4))
    cut_stage(model, role)       # a Transformer (dense or MoE), on meta or real weights
    out = model.paged_step(hidden, start, last, past, dest)   # [R, S, dim] -> logits [R, V]

A stage keeps its layers under their global index (``layers.5.…``: checkpoint names, the
tensor-parallel plan and the quantization find them as in the whole model); the other
layers become :class:`AbsentLayer` placeholders that hold nothing. The first stage keeps the
token embedding, the last one the final norm and the LM head (and, for a tied head, the
embedding matrix the head reads). ``Transformer.paged_step`` then takes the previous stage's
hidden states instead of tokens unless the stage is first, and returns hidden states instead
of logits unless it is last (``generation/pipeline.py`` moves them between the ranks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from torch import nn

from torch_tensorrt_dist.errors import ConfigError

__all__ = ["AbsentLayer", "StageRole", "cut_stage"]

#: a decoder: ``models.llama.Transformer`` or one built on it (MoE); not imported, as the
#: Transformer itself holds a StageRole
Model = TypeVar("Model", bound=nn.Module)


@dataclass(frozen=True)
class StageRole:
    """Stage ``index`` of ``count``, running decoder ``layers``; ``deepest``: the most layers
    any stage runs (every rank's KV pool has the same number of blocks, so that the ranks
    allocate alike: the memory of the deepest stage sets it; 0: this stage's)."""

    index: int
    count: int
    layers: range
    deepest: int = 0

    @property
    def kv_layers(self) -> int:
        """The layers a rank's KV-cache budget is counted for (``deepest``)."""
        return max(self.deepest, len(self.layers))

    @property
    def first(self) -> bool:
        """Takes tokens (holds the embedding)."""
        return self.index == 0

    @property
    def last(self) -> bool:
        """Gives logits (holds the final norm and the LM head)."""
        return self.index == self.count - 1

    @classmethod
    def whole(cls, n_layers: int) -> StageRole:
        """The whole model: one stage of every layer."""
        return cls(0, 1, range(n_layers), n_layers)


class AbsentLayer(nn.Module):
    """The place of a layer another pipeline stage runs: no parameters, never called."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def extra_repr(self) -> str:
        return f"layer {self.index}: on another pipeline stage"


def cut_stage(model: Model, role: StageRole) -> Model:
    """Keep only ``role``'s parts of ``model`` (a ``Transformer``; in place, before
    materialising a meta model, so that a rank never allocates another stage's weights)."""
    decoder: Any = model
    n = len(decoder.layers)
    if role.count < 1 or not 0 <= role.index < role.count:
        raise ConfigError(f"stage {role.index} is not a stage of pp={role.count}")
    if not role.layers or role.layers.start < 0 or role.layers.stop > n:
        raise ConfigError(f"stage {role.index}: layers {role.layers} are not layers of [0, {n})")
    for i in range(n):
        if i not in role.layers:
            decoder.layers[i] = AbsentLayer(i)
    head_reads_embedding = decoder.output is None  # tied head: the last stage reads the matrix
    if not (role.first or (role.last and head_reads_embedding)):
        del decoder.tok_embeddings
    if not role.last:
        del decoder.norm
        decoder.output = None
    decoder.stage = role
    return model
