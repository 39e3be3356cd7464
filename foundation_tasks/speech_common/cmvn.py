"""The modules every speech head puts around its VGG front end: global CMVN whose
statistics travel in the checkpoint, and the padding mask of a length-padded batch."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn


def padding_mask(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    """(B, max_len) bool, True = padding."""
    return torch.arange(max_len, device=lengths.device)[None] >= lengths[:, None]


class GlobalCMVN(nn.Module):
    """Global mean / variance normalisation from statistics over the training set, kept
    as buffers so that they travel in the checkpoint. The statistics are ESPnet's
    ``feats_stats.npz`` (count, sum, sum_square), so either toolkit reads the other's.

    ``utterance_mean``: then each utterance's own mean is taken off (ESPnet's ``UtteranceMVN``
    with means only): a speaker's or channel's constant spectral tilt - eSpeak's lowest voice -
    no longer reaches the encoder as if it were content."""

    def __init__(self, num_features: int, eps: float = 1e-20, utterance_mean: bool = False):
        super().__init__()
        self.eps, self.utterance_mean = eps, utterance_mean
        self.register_buffer("mean", torch.zeros(num_features))
        self.register_buffer("std", torch.ones(num_features))
        self.register_buffer("frames", torch.zeros((), dtype=torch.long))  # 0 = not set yet

    @torch.no_grad()
    def set_stats(self, count: float, total: np.ndarray, total_square: np.ndarray) -> None:
        mean = total / count
        var = np.maximum(total_square / count - mean * mean, self.eps)
        self.mean.copy_(torch.as_tensor(mean, dtype=self.mean.dtype))
        self.std.copy_(torch.as_tensor(np.sqrt(var), dtype=self.std.dtype))
        self.frames.fill_(int(count))

    def forward(self, feats: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        pad = padding_mask(lengths, feats.shape[1])[..., None]
        x = ((feats - self.mean) / self.std).masked_fill(pad, 0.0)
        if self.utterance_mean:
            from espnet2.layers.utterance_mvn import utterance_mvn

            x, _ = utterance_mvn(x, lengths, norm_means=True, norm_vars=False)
        return x.masked_fill(pad, 0.0)  # padding stays 0 (ESPnet leaves minus the mean there)
