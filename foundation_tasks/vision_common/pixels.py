"""Pixel targets of masked image modeling (MAE, SimMIM): each patch's pixels as one vector,
optionally normalised per patch (MAE's ``norm_pix_loss``)."""
from __future__ import annotations

import torch


def patchify(images: torch.Tensor, patch_size: int) -> torch.Tensor:
    """(B, C, H, W) -> (B, H/p * W/p, p*p*C), patches in row-major grid order (the tokens'
    order), each patch's values as (row, column, channel) like MAE's ``patchify``."""
    b, c, h, w = images.shape
    p = patch_size
    x = images.reshape(b, c, h // p, p, w // p, p)
    return x.permute(0, 2, 4, 3, 5, 1).reshape(b, (h // p) * (w // p), p * p * c)


@torch.no_grad()
def patch_pixels(images: torch.Tensor, patch_size: int, norm_pix: bool = True) -> torch.Tensor:
    """(B, N, p*p*C) float patch pixels; with ``norm_pix`` each patch to zero mean, unit
    variance: a target of local structure (edges, corners), not of the mean colour that a
    masked patch's neighbours already give away."""
    t = patchify(images.float(), patch_size)
    if norm_pix:
        t = (t - t.mean(-1, keepdim=True)) / (t.var(-1, keepdim=True) + 1e-6).sqrt()
    return t
