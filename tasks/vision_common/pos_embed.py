"""The start of a ViT's learned absolute position embedding, shared by every vision head."""
from __future__ import annotations

from typing import Sequence

import torch
from timm.layers.pos_embed_sincos import build_sincos2d_pos_embed
from torch import nn

POS_INITS = ("trunc_normal", "sincos")


def init_pos_embed(pos_embed: nn.Parameter, grid: Sequence[int], num_prefix_tokens: int, how: str) -> None:
    """``trunc_normal`` (std 0.02) everywhere, or, for ``sincos``, the patch rows set to timm's
    2-D sin-cos table of ``grid`` (prefix tokens keep the 0.02 start)."""
    if how not in POS_INITS:
        raise ValueError(f"pos_init must be one of {', '.join(POS_INITS)} (got {how!r})")
    nn.init.trunc_normal_(pos_embed, std=0.02)
    if how == "sincos":
        with torch.no_grad():
            pos_embed[0, num_prefix_tokens:] = build_sincos2d_pos_embed(list(grid), pos_embed.shape[-1])
