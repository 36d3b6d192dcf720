"""A pipeline stage of a transformers causal LM: its own class with only this stage's parts, by
its ``base_model_pp_plan``.

    check_pipeline(meta_model)        # refused by name: no PP plan, a forward that changes
                                      # the hidden states it is given (no weight needed)
    cut_hf_stage(meta_model, role)    # before the weights are read: only this stage's are

transformers' PP plan names the base model's parts in order: the embedding (and what runs on
its output, a dropout) before the decoder layers' ``ModuleList``, the final norm after them;
the causal LM's own ``_pp_plan`` names its head. A stage keeps its decoder layers in their
places (their attention's ``layer_idx`` is the global index our KV pools are found by: a
model's forward may also index its config's ``layer_types`` by the layer's place); every other
layer, and the parts before the layers off the first stage and after them off the last,
become :class:`Passthrough` modules that hold nothing and return the hidden states they are
given. The first stage's forward then gives the hidden states after its last layer; a later
one's takes them as ``inputs_embeds`` (``models/hf_model.PagedHFModel.paged_step``). A tied
head keeps the embedding on the last stage (the head reads its matrix).

This holds only where the base model's forward does nothing else to the hidden states between
its embedding and its norm (no position embeddings added, no work between layers), besides a
scale named in :data:`INPUT_SCALES` (granite's ``embedding_multiplier``): the first stage
applies it to its embedded tokens, a later stage has it set to 1 (the hidden states it is
given were scaled already). :func:`check_pipeline` runs that forward on the meta-device model
with every part a passthrough and those scales set to 1, as a later stage's, and refuses the
model unless it returns the values it was given.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.models.stage import StageRole

__all__ = ["INPUT_SCALES", "Passthrough", "check_pipeline", "cut_hf_stage", "pp_parts"]

#: number attributes of a base model that its forward multiplies ``inputs_embeds`` by, given
#: or embedded (granite's ``embedding_multiplier``, set from its config): set to 1 on a stage
#: after the first, whose ``inputs_embeds`` are the previous stage's hidden states
INPUT_SCALES = ("embedding_multiplier",)


class Passthrough(nn.Module):
    """The place of a part another pipeline stage runs: no parameters; returns the hidden
    states it is called with (its first argument, or ``hidden_states=``). ``attention_type``:
    the replaced decoder layer's (a forward may pick each layer's mask by it)."""

    def __init__(self, name: str, attention_type: str | None = None) -> None:
        super().__init__()
        self.name = name
        if attention_type is not None:
            self.attention_type = attention_type

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return args[0] if args else kwargs["hidden_states"]

    def extra_repr(self) -> str:
        return f"{self.name}: on another pipeline stage"


def pp_parts(hf: Any) -> tuple[list[str], str, list[str]]:
    """The base model's parts by its PP plan: (before the layers, the layers, after them);
    ConfigError naming the model type where it has no plan (it runs with ``--pp 1`` only)."""
    from torch_tensorrt_dist.models.hf_config import transformers_version

    base = hf.base_model
    plan = getattr(hf.config.get_text_config(), "base_model_pp_plan", None)
    kind = hf.config.model_type
    if not plan:
        raise ConfigError(
            f"model_type {kind!r} has no base_model_pp_plan in transformers "
            f"{transformers_version()}: it runs with --pp 1 only"
        )
    names = list(plan)
    lists = [n for n in names if isinstance(getattr(base, n, None), nn.ModuleList)]
    if len(lists) != 1:
        raise ConfigError(
            f"model_type {kind!r} has {len(lists)} decoder-layer lists among its "
            f"base_model_pp_plan's parts ({', '.join(names)}), not one: it runs with --pp 1 only"
        )
    at = names.index(lists[0])
    return names[:at], lists[0], names[at + 1 :]


def _passthrough_layers(layers: nn.ModuleList, keep: range) -> None:
    for i, layer in enumerate(layers):
        if i not in keep:
            layers[i] = Passthrough(f"layer {i}", getattr(layer, "attention_type", None))


def _unscale_inputs(base: nn.Module) -> None:
    for name in INPUT_SCALES:
        if isinstance(getattr(base, name, None), int | float):
            setattr(base, name, 1.0)


def cut_hf_stage(hf: Any, role: StageRole) -> None:
    """Keep only ``role``'s parts of ``hf`` (a meta-device transformers causal LM: in place,
    before its weights are read)."""
    if role.count == 1:
        return
    before, layers_name, after = pp_parts(hf)
    base = hf.base_model
    layers = getattr(base, layers_name)
    if role.layers.stop > len(layers):
        raise ConfigError(f"stage {role.index}: layers {role.layers} are not layers of the model")
    _passthrough_layers(layers, role.layers)
    head = hf.get_output_embeddings()
    tied = head is not None and head.weight is hf.get_input_embeddings().weight
    if not role.first:
        _unscale_inputs(base)  # (the first stage scaled them)
        if not (role.last and tied):  # a tied head reads the embedding
            for name in before:
                setattr(base, name, Passthrough(name))
    if not role.last:
        for name in after:
            setattr(base, name, Passthrough(name))
        for name, child in list(hf.named_children()):  # the LM head
            if child is head:
                setattr(hf, name, Passthrough(name))


def check_pipeline(hf: Any) -> None:
    """Refuse (by name) a model whose stages cannot hand hidden states on: no PP plan, or a
    base model whose forward changes the hidden states between its embedding and its layers,
    between layers, or after them besides its final norm (a later stage's: with its
    :data:`INPUT_SCALES` set to 1). Runs that forward once on a meta-device model (changed in
    place: every part a passthrough; throw it away after)."""
    before, layers_name, after = pp_parts(hf)
    base, text = hf.base_model, hf.config.get_text_config()
    x = torch.linspace(-2.0, 3.0, 2 * text.hidden_size).view(1, 2, -1).to(_dtype(hf))
    _passthrough_layers(getattr(base, layers_name), range(0))
    for name in before + after:
        setattr(base, name, Passthrough(name))
    _unscale_inputs(base)
    why = "it changes them"
    try:
        out = base(inputs_embeds=x, position_ids=torch.arange(2)[None], use_cache=False)
        got: Tensor | None = getattr(out, "last_hidden_state", None)
    except Exception as exc:  # a part outside the plan (position embeddings on meta)
        got, why = None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    same = isinstance(got, Tensor) and got.device == x.device and got.shape == x.shape
    if not (same and got is not None and torch.equal(got, x)):
        raise ConfigError(
            f"model_type {hf.config.model_type!r} cannot run as pipeline stages: its base "
            f"model's forward does more to the hidden states it is given than its "
            f"base_model_pp_plan's parts ({why}; position embeddings, a scale on inputs_embeds "
            f"other than {', '.join(INPUT_SCALES)}), "
            "so a later stage cannot take the previous stage's; run it with --pp 1"
        )


def _dtype(hf: Any) -> torch.dtype:
    return next((p.dtype for p in hf.parameters() if p.is_floating_point()), torch.float32)
