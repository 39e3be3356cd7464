"""BEST-RQ's random-projection quantizer (Chiu et al. 2022, Sec. 2).

    stacked, normalised filterbank frames x (..., input_dim)
      -> y = x P          P: (input_dim, code_dim), Xavier-initialised, frozen
      -> target = argmin_j || y / |y| - c_j ||     c_j: codebook rows, N(0, 1), l2-normalised, frozen

Both the projection and the codebook are drawn once from ``seed`` and never trained:
they are buffers (no gradients, not in the optimizer) that travel in the checkpoint, so
a resumed or re-evaluated run computes exactly the same targets. With several codebooks
(``num_codebooks``) each has its own projection and codebook and the model predicts one
target per codebook.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class RandomProjectionQuantizer(nn.Module):
    def __init__(self, input_dim: int, code_dim: int = 16, vocab_size: int = 8192, num_codebooks: int = 1,
                 seed: int = 0):
        super().__init__()
        if min(input_dim, code_dim, num_codebooks) < 1 or vocab_size < 2:
            raise ValueError("input_dim, code_dim, num_codebooks must be >= 1 and vocab_size >= 2")
        self.input_dim, self.code_dim = input_dim, code_dim
        self.vocab_size, self.num_codebooks = vocab_size, num_codebooks
        g = torch.Generator().manual_seed(seed)
        # Xavier (Glorot) uniform per codebook: U(-b, b), b = sqrt(6 / (fan_in + fan_out))
        bound = math.sqrt(6.0 / (input_dim + code_dim))
        projection = (torch.rand(num_codebooks, input_dim, code_dim, generator=g) * 2 - 1) * bound
        codebook = F.normalize(torch.randn(num_codebooks, vocab_size, code_dim, generator=g), dim=-1)
        self.register_buffer("projection", projection)
        self.register_buffer("codebook", codebook)

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., input_dim) -> (..., num_codebooks) target ids (long)."""
        if x.shape[-1] != self.input_dim:
            raise ValueError(f"quantizer: expected (..., {self.input_dim}) features, got {tuple(x.shape)}")
        lead = x.shape[:-1]
        flat = x.reshape(-1, self.input_dim).float()
        with torch.autocast(x.device.type, enabled=False):  # fp32 targets under bf16 / fp16 training too
            y = F.normalize(torch.einsum("nd,kdc->knc", flat, self.projection.float()), dim=-1)  # (K, N, C)
            # for unit vectors, the nearest codebook vector (l2) is the one of largest dot product
            ids = torch.einsum("knc,kvc->knv", y, self.codebook.float()).argmax(-1)  # (K, N)
        return ids.transpose(0, 1).reshape(*lead, self.num_codebooks)

    def extra_repr(self) -> str:
        return (f"input_dim={self.input_dim}, code_dim={self.code_dim}, vocab_size={self.vocab_size}, "
                f"num_codebooks={self.num_codebooks}, frozen")
