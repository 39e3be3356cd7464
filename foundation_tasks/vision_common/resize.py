"""Pretrained ViT tensors at another resolution: the position tables that change shape with
the patch grid, resized as BEiT / timm do (shared by the vision tasks' ``adapt_init`` and
segmentation's readers of ViT files).

* the absolute position embedding: resampled bicubically over the grid with its
  class-token entries kept (timm's ``resample_abs_pos_embed``, which ViT and BEiT use);
* the relative position bias table of ``rel_pos="2d"`` (BEiT): the (2h-1)(2w-1) grid
  offsets are resampled with BEiT's geometric-sequence interpolation (timm's
  ``resize_rel_pos_bias_table``: offsets near 0 keep their spacing, far ones are spread
  out to reach the new, larger offsets); the three class-token entries are kept.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from timm.layers.pos_embed_rel import resize_rel_pos_bias_table

from foundation.embed import resize_pos_embed

REL_POS_TABLE = "backbone.encoder.rel_pos.table"


def resize_rel_pos_table(table: torch.Tensor, old_grid: Sequence[int], new_grid: Sequence[int]) -> torch.Tensor:
    """A ``RelativePositionBias2d`` table ((2h-1)(2w-1) + 3, heads) for another patch grid,
    by BEiT's geometric-sequence interpolation; the class-token rows are kept. Same grid:
    the table itself."""
    (h, w), (H, W) = tuple(old_grid), tuple(new_grid)
    if table.shape[0] != (2 * h - 1) * (2 * w - 1) + 3:
        raise ValueError(f"relative position table: {table.shape[0]} rows do not fit a {h}x{w} grid "
                         f"({(2 * h - 1) * (2 * w - 1)} offsets + 3 class-token entries)")
    if (h, w) == (H, W):
        return table
    new_shape = ((2 * H - 1) * (2 * W - 1) + 3, table.shape[1])
    return resize_rel_pos_bias_table(table, (H, W), new_shape, old_window_size=(h, w))


def _square_rel_grid(rows: int) -> tuple[int, int] | None:
    """The square patch grid of a (2g-1)^2 + 3 row table."""
    side = math.isqrt(max(rows - 3, 0))
    return ((side + 1) // 2,) * 2 if side * side == rows - 3 and side % 2 else None


def adapt_vision_init(name: str, tensor: torch.Tensor, target: torch.Tensor, grid: Sequence[int],
                      prefix_tokens: int) -> torch.Tensor | str | None:
    """A vision task's ``Task.adapt_init``: ``pos_embed`` (square source grid) and the
    backbone's relative position table resized to this task's ``grid``; equal shapes as
    they are; anything else skipped."""
    if tensor.shape == target.shape:
        return tensor
    if name == "pos_embed" and tensor.dim() == 3 and tensor.shape[-1] == target.shape[-1]:
        n = tensor.shape[1] - prefix_tokens
        side = math.isqrt(max(n, 0))
        if side * side != n:
            return f"{n} patch positions are not a square grid"
        return resize_pos_embed(tensor, grid, prefix_tokens, (side, side))
    if name == REL_POS_TABLE and tensor.dim() == 2 and tensor.shape[1] == target.shape[1]:
        old = _square_rel_grid(tensor.shape[0])
        if old is None:
            return None
        return resize_rel_pos_table(tensor, old, grid)
    return None
