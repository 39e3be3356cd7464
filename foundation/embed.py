"""Modality front ends: pixels, filterbanks and token ids to ``(B, T, dim)`` embeddings."""
from __future__ import annotations

from typing import Sequence

import torch
from timm.layers import PatchEmbed  # images: timm's conv patchifier (dynamic size supported)
from timm.layers import resample_abs_pos_embed
from timm.layers.pos_embed_sincos import build_sincos2d_pos_embed
from torch import nn

__all__ = ["PatchEmbed", "ViTFrontEnd", "POS_INITS", "init_pos_embed", "resize_pos_embed", "VGGSubsampling",
           "TextEmbedding"]

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


def resize_pos_embed(pos: torch.Tensor, new_grid: Sequence[int], prefix_tokens: int = 1,
                     old_grid: Sequence[int] | None = None) -> torch.Tensor:
    """(1, prefix + h*w, D) -> (1, prefix + H*W, D), bicubic over the grid; prefix entries kept."""
    H, W = tuple(new_grid)
    if pos.shape[1] == prefix_tokens + H * W and (old_grid is None or tuple(old_grid) == (H, W)):
        return pos
    return resample_abs_pos_embed(pos, (H, W), old_size=old_grid, num_prefix_tokens=prefix_tokens)


class ViTFrontEnd(nn.Module):
    """The one ViT image front end: pixels -> ``(B, prefix + H*W, D)`` tokens through timm's conv
    patchifier (``patch_embed``), an optional class token (``cls_token``) and an optional learned
    absolute position embedding (``pos_embed``), resampled when the image's patch grid is not
    the one it was built for (``dynamic_img_size``).

    A base class, not a submodule, so that its tensors keep timm's top-level names in every
    model built on it (``foundation.vit.VisionTransformer``, the vision task heads): checkpoints,
    timm and mmseg rely on them. ``init=False`` leaves ``cls_token`` / ``pos_embed`` at zero
    until ``init_front_end()``, for a model that draws other weights first (the ViT draws its
    backbone's), so that every model keeps its order of random draws.

    ``pos_init``: ``trunc_normal`` (std 0.02, ViT / BEiT) or ``sincos`` (the patches' rows start
    as timm's 2-D sin-cos table, std ~0.5, still learned: MAE / MoCo v3). From scratch,
    Magneto's first block already outputs ~4x the embedding's scale (Sub-LN and the
    gamma-scaled init), so a 0.02 position signal takes hundreds of steps to matter."""

    def __init__(self, dim: int, img_size: int, patch_size: int, in_chans: int = 3, pos_init: str = "trunc_normal", *,
                 class_token: bool = True, abs_pos_embed: bool = True, dynamic_img_size: bool = False,
                 init: bool = True):
        super().__init__()
        self.in_chans, self.pos_init, self.dynamic_img_size = in_chans, pos_init, dynamic_img_size
        self.num_prefix_tokens = 1 if class_token else 0
        self.patch_embed = PatchEmbed(img_size=img_size, patch_size=patch_size, in_chans=in_chans, embed_dim=dim,
                                      strict_img_size=not dynamic_img_size, output_fmt="NHWC" if dynamic_img_size else None,
                                      flatten=not dynamic_img_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if class_token else None
        n_pos = self.num_prefix_tokens + self.patch_embed.num_patches
        self.pos_embed = nn.Parameter(torch.zeros(1, n_pos, dim)) if abs_pos_embed else None
        if init:
            self.init_front_end()

    def init_front_end(self) -> None:
        if self.cls_token is not None:
            nn.init.trunc_normal_(self.cls_token, std=0.02)
        if self.pos_embed is not None:
            init_pos_embed(self.pos_embed, self.grid, self.num_prefix_tokens, self.pos_init)

    @property
    def grid(self) -> tuple[int, int]:
        """The patch grid the position embedding was built for."""
        return tuple(self.patch_embed.grid_size)

    def patches(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """``(B, C, H, W)`` -> patch embeddings ``(B, h*w, D)`` (no class token, no positions) and (h, w)."""
        if images.dim() != 4 or images.shape[1] != self.in_chans:
            raise ValueError(f"images: expected (B, {self.in_chans}, H, W), got {tuple(images.shape)}")
        x = self.patch_embed(images)
        if not self.dynamic_img_size:
            return x, self.grid
        B, H, W, D = x.shape
        return x.reshape(B, H * W, D), (H, W)

    def tokens(self, patches: torch.Tensor, grid: Sequence[int] | None = None) -> torch.Tensor:
        """The class token (if any) + ``patches`` of a ``grid`` (default: the built one), plus the positions."""
        x = patches
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        if self.pos_embed is not None:
            x = x + resize_pos_embed(self.pos_embed, grid or self.grid, self.num_prefix_tokens, self.grid)
        return x

    def embed(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """Pixels -> tokens ``(B, prefix + h*w, D)`` with position embedding, and (h, w)."""
        x, grid = self.patches(images)
        return self.tokens(x, grid), grid

    def no_weight_decay(self) -> set[str]:
        return {name for name in ("cls_token", "pos_embed") if getattr(self, name) is not None}


class VGGSubsampling(nn.Module):
    """Speech front end: two VGG blocks (conv3x3-ReLU-conv3x3-ReLU-maxpool2), 4x in time
    (10 ms -> 40 ms frames) and 4x in frequency, then a linear map to ``dim``.

    This is the VGG front end of the Transformer-Transducer in Magneto Sec. 6 (and
    ESPnet's ``VGG2L``). Max pooling uses ``ceil_mode`` so no frame is dropped: an input of
    L frames gives ceil(ceil(L / 2) / 2) output frames, which ``output_lengths`` returns.
    """

    def __init__(self, in_features: int = 80, dim: int = 512, channels: tuple[int, int] = (64, 128)):
        super().__init__()
        c1, c2 = channels
        self.in_features = in_features
        self.convs = nn.Sequential(
            nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(),
            nn.Conv2d(c1, c1, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2, ceil_mode=True),
            nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(),
            nn.Conv2d(c2, c2, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2, ceil_mode=True),
        )
        freq = -(-(-(-in_features // 2)) // 2)
        self.proj = nn.Linear(c2 * freq, dim)
        # He init for the ReLU convs: PyTorch's default shrinks the signal ~3x per conv, which
        # would give the backbone frames of std ~0.04 (normalised features in), swamped by the
        # first residual branches; ESPnet scales the same output by sqrt(dim) instead.
        for m in self.convs:
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                nn.init.zeros_(m.bias)
        # channels-last (NHWC) weights and activations: oneDNN's CPU convolutions run these small
        # VGG blocks ~1.5x faster than on NCHW (an eighth of a tiny speech model's step), the
        # same convolutions up to float rounding; checkpoints are saved contiguous, so a file does
        # not depend on the memory format
        self.convs.to(memory_format=torch.channels_last)

    @staticmethod
    def output_lengths(lengths: torch.Tensor) -> torch.Tensor:
        return torch.div(torch.div(lengths + 1, 2, rounding_mode="floor") + 1, 2, rounding_mode="floor")

    def forward(self, feats: torch.Tensor, lengths: torch.Tensor | None = None):
        """``feats`` (B, L, in_features) -> ((B, L', dim), lengths (B,) or None)."""
        if feats.dim() != 3 or feats.shape[-1] != self.in_features:
            raise ValueError(f"VGGSubsampling: expected (B, frames, {self.in_features}) features, got {tuple(feats.shape)}")
        x = self.convs(feats.unsqueeze(1).contiguous(memory_format=torch.channels_last))  # (B, C, L', F')
        B, C, L, F = x.shape
        x = self.proj(x.permute(0, 2, 1, 3).reshape(B, L, C * F))
        return x, (None if lengths is None else self.output_lengths(lengths))


class TextEmbedding(nn.Module):
    """Token embedding plus a learned absolute position embedding (BERT / BEiT-3 style)."""

    def __init__(self, vocab_size: int, dim: int, max_positions: int = 512, padding_idx: int | None = None):
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, dim, padding_idx=padding_idx)
        self.positions = nn.Embedding(max_positions, dim) if max_positions else None
        nn.init.trunc_normal_(self.tokens.weight, std=0.02)
        if self.positions is not None:
            nn.init.trunc_normal_(self.positions.weight, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids)
        if self.positions is not None:
            T = ids.shape[1]
            if T > self.positions.num_embeddings:
                raise ValueError(f"TextEmbedding: {T} tokens, but only {self.positions.num_embeddings} positions")
            x = x + self.positions.weight[:T]
        return x
