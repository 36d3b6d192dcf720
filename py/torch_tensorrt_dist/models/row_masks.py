"""Masks and RoPE positions of the serving graphs, where every KV-cache row is a slot.

A slot holds one sequence from KV position 0 (no left padding). The decode graph runs every row
at its own write position ``pos[b]``; a prefill writes one slot's prompt (right-padded to its
bucket) at positions ``[0, S)``. Everything is built from tensors, so neither graph recompiles.
"""

from __future__ import annotations

from torch import Tensor

from torch_tensorrt_dist.models.llama_args import ModelArgs

__all__ = ["decode_rows_mask", "prefill_slot_mask"]


def decode_rows_mask(args: ModelArgs, key_slots: Tensor, pos: Tensor) -> Tensor:
    """key_slots: [L] (arange), pos: [B] -> mask [B, 1, 1, L] (bool).

    Row b's query (written at slot ``pos[b]``, RoPE position ``pos[b]``) sees slots
    ``<= pos[b]`` (within the sliding window): later slots hold an older request's keys or a
    bucket's padding, never read.
    """
    j, q = key_slots[None, :], pos[:, None]  # [1, L], [B, 1]
    mask = j <= q
    if args.sliding_window is not None:
        mask = mask & (j > q - args.sliding_window)
    return mask[:, None, None, :]


def prefill_slot_mask(args: ModelArgs, key_slots: Tensor, length: int) -> Tensor | None:
    """The mask of a prefill over slots ``[0, S)``: None where plain causal attention is exact
    (no sliding window, or one of at least S positions), for ``is_causal`` attention, which
    skips the upper triangle; else the causal mask within the window, [1, 1, S, S] (bool).
    The prompt is right-padded, so its tokens never see the padding after them."""
    window = args.sliding_window
    if window is None or length <= window:
        return None
    j = key_slots[:length]
    i = j[:, None]
    mask = (j[None, :] <= i) & (j[None, :] > i - window)
    return mask[None, None]
