"""BEST-RQ masked speech prediction around the shared backbone (Chiu et al. 2022).

    fbank (B, L, 80) -> global CMVN -> x
    targets: x stacked by 4 frames (the front end's subsampling: one target per encoder
             frame) -> frozen random-projection quantizer -> ids (B, ceil(L/4), K)
    input:   masked frames of x replaced by noise N(0, 0.1^2) -> VGG front end (L/4 frames)
             -> backbone (its 'speech' expert when multiway) -> Linear -> logits per codebook
    loss:    cross-entropy on the encoder frames that hold a masked input frame, only

The front end (``frontend``) and the normalisation (``cmvn``) carry the ASR head's names
and modules, so an ASR fine-tuning's ``init_from`` loads the pretrained front end by name
(the ASR task keeps its own CMVN statistics). The quantizer is frozen (buffers, see ``quantizer.py``).
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from foundation.embed import VGGSubsampling
from foundation_tasks.best_rq.quantizer import RandomProjectionQuantizer
from foundation_tasks.speech_common.cmvn import GlobalCMVN, padding_mask

STACK = 4  # input frames per encoder frame (VGGSubsampling: 10 ms -> 40 ms)
EXPERT = "speech"  # the expert the speech tokens take in a multiway backbone
EVAL_NOISE_SEED = 4321


def stack_frames(x: torch.Tensor, n: int = STACK) -> torch.Tensor:
    """(B, L, F) -> (B, ceil(L / n), n * F), zero-padding the last group."""
    B, L, Fdim = x.shape
    pad = (-L) % n
    if pad:
        x = F.pad(x, (0, 0, 0, pad))
    return x.reshape(B, (L + pad) // n, n * Fdim)


class BestRQHead(nn.Module):
    def __init__(self, *, dim: int, num_mel_bins: int = 80, vgg_channels: Sequence[int] = (64, 128),
                 codebook_size: int = 8192, codebook_dim: int = 16, num_codebooks: int = 1, quantizer_seed: int = 0,
                 mask_noise_std: float = 0.1, utterance_mean: bool = False):
        super().__init__()
        self.cmvn = GlobalCMVN(num_mel_bins, utterance_mean=utterance_mean)
        self.frontend = VGGSubsampling(num_mel_bins, dim, tuple(vgg_channels))
        self.quantizer = RandomProjectionQuantizer(STACK * num_mel_bins, codebook_dim, codebook_size, num_codebooks,
                                                   quantizer_seed)
        self.num_codebooks, self.codebook_size = num_codebooks, codebook_size
        self.mask_noise_std = mask_noise_std
        self.out = nn.Linear(dim, num_codebooks * codebook_size)
        nn.init.trunc_normal_(self.out.weight, std=0.02)
        nn.init.zeros_(self.out.bias)

    def predict(self, backbone: nn.Module, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(logits (M, K, V), targets (M, K), target mask (B, T)) over the M encoder frames
        that hold a masked input frame."""
        feats, lens, mask = batch["feats"], batch["feat_lens"], batch["mask"]
        x = self.cmvn(feats, lens)  # padded frames are 0
        targets = self.quantizer(stack_frames(x))  # from the unmasked features: (B, T, K)
        if self.training:
            noise = torch.randn_like(x)
        else:  # the same noise at every evaluation
            g = torch.Generator(device=x.device).manual_seed(EVAL_NOISE_SEED)
            noise = torch.randn(x.shape, generator=g, device=x.device, dtype=x.dtype)
        x = torch.where(mask[..., None], noise * self.mask_noise_std, x)
        h, out_lens = self.frontend(x, lens)
        T = h.shape[1]
        pad = padding_mask(out_lens, T)
        hidden = backbone(h, padding_mask=pad, segments=[(EXPERT, T)])
        chosen = stack_frames(mask[..., None].float()).amax(-1).bool()[:, :T] & ~pad
        logits = self.out(hidden[chosen]).view(-1, self.num_codebooks, self.codebook_size)
        return logits, targets[:, :T][chosen], chosen

    def forward(self, backbone: nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
        logits, targets, chosen = self.predict(backbone, batch)
        ratio = (batch["mask"].sum() / batch["feat_lens"].sum()).detach()  # of the input frames
        if targets.numel() == 0:  # no masked frame in the batch: no loss, but every parameter in the graph
            return logits.sum() * 0.0 + self.out.weight.sum() * 0.0, {"mask_ratio": ratio}
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        acc = (logits.argmax(-1) == targets).float().mean()
        return loss, {"accuracy": acc.detach(), "mask_ratio": ratio}
