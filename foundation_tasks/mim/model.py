"""Masked image modeling heads: masked patches are replaced by a learned mask token, the
backbone sees the whole grid (BEiT, SimMIM), and a linear layer on its output at each
masked patch predicts that patch's target:

* ``MIMHead``: the visual token id of the patch (BEiT: a tokenizer's code for that patch of
  the unmasked image), cross-entropy;
* ``PixelMIMHead``: the patch's pixels, normalised per patch (MAE's ``norm_pix_loss``),
  mean squared error (SimMIM's one-layer prediction head, MAE's normalised target).

The front end is the classifier's (``foundation.embed.ViTFrontEnd``: ``patch_embed``,
``cls_token``, ``pos_embed``), so fine-tuning loads it by name; ``mask_token`` and the
prediction layer are pretraining-only. A frozen tokenizer is held outside the module tree:
it is not trained, not saved with these weights and not moved by ``.to()``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from foundation.embed import ViTFrontEnd
from foundation_tasks.vision_common.pixels import patch_pixels
from foundation_tasks.vision_common.tokenizer import FrozenTokenizer


class MaskedImageModel(ViTFrontEnd):
    """The shared part: the front end with a mask token, and the backbone's output at the masked patches."""

    def __init__(self, dim: int, img_size: int, patch_size: int, pos_init: str = "trunc_normal"):
        super().__init__(dim, img_size, patch_size, pos_init=pos_init)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dim))
        nn.init.trunc_normal_(self.mask_token, std=0.02)

    def no_weight_decay(self) -> set[str]:
        return super().no_weight_decay() | {"mask_token"}

    def masked_hidden(self, backbone: nn.Module, images: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(M, D) outputs at the M masked patches (``mask`` (B, N) bool, True = masked)."""
        x, grid = self.patches(images)
        w = mask.unsqueeze(-1).to(x.dtype)
        x = x * (1 - w) + self.mask_token.to(x.dtype) * w
        tokens = self.tokens(x, grid)  # the 'vision' expert of a multiway backbone, the shared layers of a plain one
        hidden = backbone(tokens, segments=[("vision", tokens.shape[1])])[:, 1:]
        return hidden[mask]


def _linear(dim: int, out: int) -> nn.Linear:
    layer = nn.Linear(dim, out)
    nn.init.trunc_normal_(layer.weight, std=0.02)
    nn.init.zeros_(layer.bias)
    return layer


class MIMHead(MaskedImageModel):
    def __init__(self, dim: int, img_size: int, patch_size: int, tokenizer: FrozenTokenizer,
                 pos_init: str = "trunc_normal"):
        super().__init__(dim, img_size, patch_size, pos_init=pos_init)
        if tuple(tokenizer.grid) != tuple(self.grid):
            raise ValueError(f"the tokenizer's patch grid {tuple(tokenizer.grid)} differs from this model's "
                             f"{tuple(self.grid)}: use the same img_size / patch_size")
        self.lm_head = _linear(dim, tokenizer.num_codes)
        self._tokenizer = (tokenizer,)  # a tuple: not a submodule

    @property
    def tokenizer(self) -> FrozenTokenizer:
        return self._tokenizer[0]

    @torch.no_grad()
    def targets(self, images: torch.Tensor) -> torch.Tensor:
        return self.tokenizer.to(images.device)(images)

    def masked_logits(self, backbone: nn.Module, images: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Logits (M, num_codes) of the M masked patches."""
        return self.lm_head(self.masked_hidden(backbone, images, mask))

    def forward(self, backbone: nn.Module, batch: dict[str, torch.Tensor]):
        images, mask = batch["images"], batch["mask"]
        ids = self.targets(images)[mask]
        logits = self.masked_logits(backbone, images, mask)
        loss = F.cross_entropy(logits.float(), ids)
        return loss, {"mim_acc": (logits.argmax(-1) == ids).float().mean().detach()}


class PixelMIMHead(MaskedImageModel):
    def __init__(self, dim: int, img_size: int, patch_size: int, pos_init: str = "trunc_normal",
                 norm_pix: bool = True, in_chans: int = 3):
        super().__init__(dim, img_size, patch_size, pos_init=pos_init)
        self.patch_size, self.norm_pix = patch_size, norm_pix
        self.pixel_head = _linear(dim, patch_size * patch_size * in_chans)

    @torch.no_grad()
    def targets(self, images: torch.Tensor) -> torch.Tensor:
        """(B, N, p*p*C) patch pixels; with ``norm_pix`` each patch to zero mean, unit variance
        (MAE: a target of local contrast, not of absolute colour)."""
        return patch_pixels(images, self.patch_size, self.norm_pix)

    def masked_pixels(self, backbone: nn.Module, images: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.pixel_head(self.masked_hidden(backbone, images, mask)).float()

    def forward(self, backbone: nn.Module, batch: dict[str, torch.Tensor]):
        images, mask = batch["images"], batch["mask"]
        loss = F.mse_loss(self.masked_pixels(backbone, images, mask), self.targets(images)[mask])
        return loss, {}
