"""Pipeline stages on the generation core: a :class:`PipelineGenerator` per rank.

    mesh = make_pipeline_mesh(pp=2, tp=2)                   # every rank of a 4-rank world
    place = stage_place(mesh, args.n_layers)
    model = load_llama(path, group=place.tp_group, stage=place.role)   # this stage's parts
    gen = PipelineGenerator(model, place, engine="inductor", max_batch_size=8)
    result = gen.generate(prompts, max_new_tokens=32)      # the same tokens on every rank

Every rank runs the same generation core and scheduler as a tensor-parallel rank
(``core.py``, ``scheduler.py``); only the step function differs: this stage's part of
``Transformer.paged_step`` (compiled alone: one graph per shape class, with the stage's TP
collectives only), the hidden states from and to the neighbouring stages, and the last stage's
logits broadcast to every rank (``stage_step.py``). Every stage holds the KV blocks of its own
layers with the same block ids (the plans and block tables are the same everywhere), so
serving, prefix caching, chunked prefill and preemption work as they do without stages.
"""

from __future__ import annotations

from typing_extensions import Unpack

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.generate import Generator, RunnerOptions
from torch_tensorrt_dist.generation.runner import ModelRunner
from torch_tensorrt_dist.generation.stage_step import StageLinks, StageStep
from torch_tensorrt_dist.models.llama import Transformer
from torch_tensorrt_dist.parallel.pipeline import StagePlace

__all__ = ["PipelineGenerator", "PipelineRunner"]


class PipelineRunner(ModelRunner):
    """A :class:`ModelRunner` over one pipeline stage (build it on every rank): its step is
    this stage's part between its neighbours (``stage_step.StageStep``). ``model`` is the
    rank's stage (``load_llama(..., stage=place.role)``, ``load_moe``, ``random_llama``, or
    a transformers model's: ``load_hf(..., stage=place.role)``)."""

    def __init__(
        self, model: Transformer, place: StagePlace, **options: Unpack[RunnerOptions]
    ) -> None:
        lay = place.layout
        if model.stage != place.role:
            raise ConfigError(
                f"rank {lay.rank} is stage {place.role.index} of pp={lay.pp} (layers "
                f"{list(place.role.layers)}), but its model is stage {model.stage.index} (layers "
                f"{list(model.stage.layers)}); load the stage of this rank (stage=place.role)"
            )
        super().__init__(model, **options)
        self.place = place
        links = StageLinks(
            lay,
            place.pp_group,
            dim=model.args.dim,
            vocab=model.args.vocab_size,
            dtype=model._model_weight().dtype,  # (a transformers model's too: hf_model.py)
            device=self.device,
        )
        self.step = StageStep(self.step, links, self.limits, mark_dynamic=self.mark_dynamic)


class PipelineGenerator(Generator):
    """A :class:`Generator` over a :class:`PipelineRunner` (call it on every rank)."""

    def __init__(
        self,
        model: Transformer,
        place: StagePlace,
        *,
        prefix_caching: bool = True,
        salt: bytes = b"",
        **options: Unpack[RunnerOptions],
    ) -> None:
        runner = PipelineRunner(model, place, **options)
        super().__init__(runner, prefix_caching=prefix_caching, salt=salt)
