"""Images and block-wise masks for MIM pretraining, from an ImageNet-layout folder.

The image goes through BEiT's pretraining augmentation (random resized crop, colour
jitter, flip); the tokenizer later encodes that same augmented image, so targets and
input always agree. Training masks are drawn from the item's augmentation seed;
evaluation masks are a fixed function of (mask_seed, index), so every evaluation of a
run scores the same masked patches.
"""
from __future__ import annotations

import numpy as np
import torch

from foundation_tasks.vision_common.folder import ImageFolderDataset
from foundation_tasks.vision_common.masking import MaskingGenerator


class MaskedImageFolder(ImageFolderDataset):
    """Items ``(image (3, H, W), mask (N,) bool)``; labels are not used."""

    def __init__(self, *args, masking: MaskingGenerator, mask_seed: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.masking, self.mask_seed = masking, mask_seed

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, _, seed = self.sample(i)
        rng = np.random.default_rng([seed, 1] if seed is not None else [self.mask_seed, i])
        return x, torch.from_numpy(self.masking(rng).reshape(-1))
