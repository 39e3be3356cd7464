"""BEiT v2's normalised EMA vector quantiser (VQ-KD, Peng et al. 2022, Sec. 2.1).

Encoder outputs and codes are l2-normalised, so the nearest code is the one of highest
cosine similarity; codes are not learned by gradient but moved towards the mean of the
(normalised) vectors assigned to them, an exponential moving average with ``decay``,
then renormalised. The codebook starts from k-means (cosine, 10 iterations) on the first
training batch, which keeps most codes alive. The encoder gets the straight-through
gradient and a commitment loss ``beta * ||sg[z_q] - z||^2``.

Buffers (saved with the weights, not trained by the optimizer): ``codebook`` (K, d),
``usage`` (an EMA of how many vectors each code gets per batch) and ``initted``.
Under ``torch.distributed`` the assignment statistics are summed over ranks, and the
k-means start is broadcast from rank 0, so every rank keeps the same codebook.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def kmeans_cosine(samples: torch.Tensor, k: int, iters: int = 10, generator: torch.Generator | None = None) -> torch.Tensor:
    """(k, d) unit-norm centroids of unit-norm ``samples`` (n, d) by spherical k-means;
    a centroid that loses all its samples keeps its place."""
    n = samples.shape[0]
    pick = (torch.randperm(n, generator=generator)[:k] if n >= k
            else torch.randint(0, n, (k,), generator=generator))
    means = samples[pick.to(samples.device)].clone()
    for _ in range(iters):
        with torch.autocast(samples.device.type, enabled=False):
            assign = (samples @ means.t()).argmax(-1)
        sums = torch.zeros_like(means).index_add_(0, assign, samples)
        counts = torch.bincount(assign, minlength=k)
        means = torch.where((counts > 0)[:, None], F.normalize(sums, dim=-1), means)
    return means


class NormEMAQuantizer(nn.Module):
    def __init__(self, num_codes: int = 8192, dim: int = 32, decay: float = 0.99, beta: float = 1.0,
                 kmeans_init: bool = True):
        super().__init__()
        self.num_codes, self.dim, self.decay, self.beta = num_codes, dim, decay, beta
        self.register_buffer("codebook", F.normalize(torch.randn(num_codes, dim), dim=-1))
        self.register_buffer("usage", torch.zeros(num_codes))
        self.register_buffer("initted", torch.tensor(0.0 if kmeans_init else 1.0))

    @torch.no_grad()
    def _init_codebook(self, z: torch.Tensor) -> None:
        if _distributed():  # every rank's vectors, so the start is the same everywhere
            parts = [torch.empty_like(z) for _ in range(dist.get_world_size())]
            dist.all_gather(parts, z.contiguous())
            z = torch.cat(parts)
        self.codebook.copy_(kmeans_cosine(z.float(), self.num_codes))
        if _distributed():
            dist.broadcast(self.codebook, 0)
        self.initted.fill_(1.0)

    def nearest(self, z: torch.Tensor) -> torch.Tensor:
        """Code ids of unit-norm vectors ``z`` (..., d): the nearest codes (for unit-norm
        codes, those of highest cosine; the code norms are kept for exactness). In fp32 whatever
        the autocast: bf16 distances tie and flip ~3 % of the ids, so targets would depend on
        the device."""
        with torch.autocast(z.device.type, enabled=False):
            return (self.codebook.pow(2).sum(-1) - 2 * z.float() @ self.codebook.float().t()).argmin(-1)

    @torch.no_grad()
    def _ema_update(self, z: torch.Tensor, ids: torch.Tensor) -> None:
        counts = torch.bincount(ids, minlength=self.num_codes).to(z.dtype)
        sums = torch.zeros(self.num_codes, self.dim, dtype=z.dtype, device=z.device).index_add_(0, ids, z)
        if _distributed():
            dist.all_reduce(counts)
            dist.all_reduce(sums)
        self.usage.mul_(self.decay).add_(counts, alpha=1 - self.decay)
        used = counts > 0
        target = torch.where(used[:, None], F.normalize(sums, dim=-1), self.codebook)
        self.codebook.copy_(F.normalize(self.codebook.lerp(target, 1 - self.decay), dim=-1))

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``z`` (B, N, d) -> (quantised (B, N, d) with straight-through gradient, ids (B, N),
        commitment loss). Training updates the codebook."""
        z = F.normalize(z.float(), dim=-1)
        flat = z.reshape(-1, self.dim)
        if self.training and not bool(self.initted):
            self._init_codebook(flat.detach())
        ids = self.nearest(flat.detach())
        z_q = self.codebook[ids].view_as(z)
        loss = self.beta * F.mse_loss(z, z_q.detach())  # commitment: pulls the encoder to its code
        if self.training:
            self._ema_update(flat.detach(), ids)
        return z + (z_q - z).detach(), ids.view(z.shape[:-1]), loss

    def extra_repr(self) -> str:
        return f"num_codes={self.num_codes}, dim={self.dim}, decay={self.decay}, beta={self.beta}"
