"""BEiT masked image modeling head: masked patches are replaced by a learned mask token,
and a linear layer on the backbone's output predicts each masked patch's visual token
id (the tokenizer's code for that patch of the unmasked image); cross-entropy over the
masked patches only.

The front end is the classifier's (``foundation.embed.ViTFrontEnd``: ``patch_embed``,
``cls_token``, ``pos_embed``), so fine-tuning loads it by name; ``mask_token`` and ``lm_head`` are the
pretraining-only parts. The frozen tokenizer is held outside the module tree: it is not
trained, not saved with these weights and not moved by ``.to()`` (it follows the images).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from foundation.embed import ViTFrontEnd
from foundation_tasks.vision_common.tokenizer import FrozenTokenizer


class MIMHead(ViTFrontEnd):
    def __init__(self, dim: int, img_size: int, patch_size: int, tokenizer: FrozenTokenizer,
                 pos_init: str = "trunc_normal"):
        super().__init__(dim, img_size, patch_size, pos_init=pos_init)
        if tuple(tokenizer.grid) != tuple(self.grid):
            raise ValueError(f"the tokenizer's patch grid {tuple(tokenizer.grid)} differs from this model's "
                             f"{tuple(self.grid)}: use the same img_size / patch_size")
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.lm_head = nn.Linear(dim, tokenizer.num_codes)
        nn.init.trunc_normal_(self.mask_token, std=0.02)
        nn.init.trunc_normal_(self.lm_head.weight, std=0.02)
        nn.init.zeros_(self.lm_head.bias)
        self._tokenizer = (tokenizer,)  # a tuple: not a submodule

    @property
    def tokenizer(self) -> FrozenTokenizer:
        return self._tokenizer[0]

    def no_weight_decay(self) -> set[str]:
        return super().no_weight_decay() | {"mask_token"}

    @torch.no_grad()
    def targets(self, images: torch.Tensor) -> torch.Tensor:
        return self.tokenizer.to(images.device)(images)

    def masked_logits(self, backbone: nn.Module, images: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Logits (M, num_codes) of the M masked patches (``mask`` (B, N) bool, True = masked)."""
        x, grid = self.patches(images)
        w = mask.unsqueeze(-1).to(x.dtype)
        x = x * (1 - w) + self.mask_token.to(x.dtype) * w
        tokens = self.tokens(x, grid)  # the 'vision' expert of a multiway backbone, the shared layers of a plain one
        hidden = backbone(tokens, segments=[("vision", tokens.shape[1])])[:, 1:]
        return self.lm_head(hidden[mask])

    def forward(self, backbone: nn.Module, batch: dict[str, torch.Tensor]):
        images, mask = batch["images"], batch["mask"]
        ids = self.targets(images)[mask]
        logits = self.masked_logits(backbone, images, mask)
        loss = F.cross_entropy(logits.float(), ids)
        return loss, {"mim_acc": (logits.argmax(-1) == ids).float().mean().detach()}
