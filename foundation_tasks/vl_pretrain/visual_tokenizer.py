"""Visual tokenizers: images -> one discrete id per patch, the targets of masked image
modeling. Chosen by name (``visual_tokenizer`` in the config, ``build_visual_tokenizer``).

* ``vq_tokenizer``: a trained VQ-KD tokenizer (BEiT v2's; BEiT-3's targets) of the
  vision task ``foundation_tasks/vq_tokenizer``, loaded by ``foundation_tasks.vision_common.tokenizer``: a tokenizer run's ``model.safetensors`` or a
  converted BEiT v2 tokenizer, at ``visual_tokenizer_path``, frozen. It was trained on
  ImageNet-normalised images, so ours (normalised with ``image_mean`` / ``image_std``)
  are re-normalised for it; its patch grid must be ours.
* ``random_projection`` (the default, and what the demo table uses): a fixed
  random-projection quantizer (BEST-RQ, Chiu et al. 2022): a patch's pixels times a fixed
  random matrix, l2-normalised, and the id of the nearest of ``vocab_size`` fixed random
  unit codewords. Nothing is learned; it is a pure function of (seed, sizes), so the
  demo needs no tokenizer training run.

* ``pixels``: no ids; each masked patch's pixels, normalised per patch (MAE's
  ``norm_pix_loss``), regressed with mean squared error (SimMIM / MAE instead of BEiT). The
  ids above describe a patch mostly by its colour; this target is its local structure.

None is part of the module tree of a head: not trained, not saved with the weights.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from foundation.config import ConfigError
from foundation_tasks.vision_common.pixels import patch_pixels

VISUAL_TOKENIZERS = ("random_projection", "vq_tokenizer", "pixels")
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class RandomProjectionTokenizer(nn.Module):
    def __init__(self, patch_size: int, in_chans: int = 3, vocab_size: int = 8192, code_dim: int = 32, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        n_in = in_chans * patch_size * patch_size
        self.patch_size, self.vocab_size = patch_size, vocab_size
        self.projection = torch.randn(n_in, code_dim, generator=g) / math.sqrt(n_in)
        self.codebook = F.normalize(torch.randn(vocab_size, code_dim, generator=g), dim=-1)

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        p = self.patch_size
        patches = F.unfold(images.float(), kernel_size=p, stride=p).transpose(1, 2)  # (B, N, C p p), row-major
        proj, book = self.projection.to(images.device), self.codebook.to(images.device)
        with torch.autocast(images.device.type, enabled=False):  # bf16 would tie and flip ~3 % of the ids
            return (F.normalize(patches @ proj, dim=-1) @ book.T).argmax(-1)


class VQKDTokenizer(nn.Module):
    """A frozen VQ-KD tokenizer (``foundation_tasks.vision_common.tokenizer``) behind our image normalisation."""

    def __init__(self, tokenizer: nn.Module, grid: tuple[int, int], mean, std):
        super().__init__()
        if tuple(tokenizer.grid) != tuple(grid):
            raise ConfigError(f"field 'visual_tokenizer_path': the tokenizer's patch grid {tuple(tokenizer.grid)} "
                              f"is not this model's {tuple(grid)}; use its img_size / patch_size")
        self._tokenizer = (tokenizer,)  # a tuple: not a submodule
        self.vocab_size = tokenizer.num_codes
        # ours -> pixels -> ImageNet-normalised, as one affine map per channel
        mean, std = torch.tensor(mean), torch.tensor(std)
        imean, istd = torch.tensor(IMAGENET_MEAN), torch.tensor(IMAGENET_STD)
        self.scale, self.shift = (std / istd).view(1, 3, 1, 1), ((mean - imean) / istd).view(1, 3, 1, 1)

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images.float() * self.scale.to(images.device) + self.shift.to(images.device)
        return self._tokenizer[0].to(images.device)(x)


class PixelTarget(nn.Module):
    """Normalised patch pixels (B, N, p*p*C), float where the tokenizers give integer ids;
    ``vocab_size`` is the prediction's width."""

    def __init__(self, patch_size: int, in_chans: int = 3):
        super().__init__()
        self.patch_size, self.vocab_size = patch_size, patch_size * patch_size * in_chans

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return patch_pixels(images, self.patch_size)


def build_visual_tokenizer(cfg: Any) -> nn.Module:
    """The target a ``vl_pretrain`` config names; ``vocab_size`` is the width of the MIM
    output (ids, or pixels per patch)."""
    if cfg.visual_tokenizer == "pixels":
        return PixelTarget(cfg.patch_size)
    if cfg.visual_tokenizer == "random_projection":
        return RandomProjectionTokenizer(cfg.patch_size, vocab_size=cfg.visual_vocab_size, code_dim=cfg.visual_code_dim,
                                         seed=cfg.visual_seed)
    from foundation.checkpoint import CheckpointError
    from foundation_tasks.vision_common.tokenizer import load_tokenizer

    try:
        tokenizer = load_tokenizer(cfg.visual_tokenizer_path)
    except (CheckpointError, FileNotFoundError) as e:
        raise ConfigError(f"field 'visual_tokenizer_path': {e}") from None
    grid = (cfg.img_size // cfg.patch_size,) * 2
    return VQKDTokenizer(tokenizer, grid, cfg.image_mean, cfg.image_std)
