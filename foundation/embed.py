"""Modality front ends: pixels, filterbanks and token ids to ``(B, T, dim)`` embeddings."""
from __future__ import annotations

import torch
from timm.layers import PatchEmbed  # images: timm's conv patchifier (dynamic size supported)
from torch import nn

__all__ = ["PatchEmbed", "VGGSubsampling", "TextEmbedding"]


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
        # He init for the ReLU convs: PyTorch's default shrinks the signal ~3x per conv, so the
        # backbone got frames of std ~0.04 (normalised features in), swamped by the first
        # residual branches; ESPnet scales the same output by sqrt(dim) instead.
        for m in self.convs:
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                nn.init.zeros_(m.bias)

    @staticmethod
    def output_lengths(lengths: torch.Tensor) -> torch.Tensor:
        return torch.div(torch.div(lengths + 1, 2, rounding_mode="floor") + 1, 2, rounding_mode="floor")

    def forward(self, feats: torch.Tensor, lengths: torch.Tensor | None = None):
        """``feats`` (B, L, in_features) -> ((B, L', dim), lengths (B,) or None)."""
        if feats.dim() != 3 or feats.shape[-1] != self.in_features:
            raise ValueError(f"VGGSubsampling: expected (B, frames, {self.in_features}) features, got {tuple(feats.shape)}")
        x = self.convs(feats.unsqueeze(1))  # (B, C, L', F')
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
