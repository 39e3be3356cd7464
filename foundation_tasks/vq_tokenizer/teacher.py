"""What the VQ-KD decoder reconstructs: a CLIP teacher's patch features (BEiT v2), the patch
features of a ViT trained here (one of our own vision runs, e.g. pixel MIM on the same
unlabelled images), or the image's own patch pixels.

Both take the images as the vision pipeline gives them (ImageNet mean/std normalised,
``foundation_tasks.vision_common.transforms.MEAN/STD``) and return ``(B, N, out_dim)`` on the tokenizer's
patch grid. Teachers are frozen and are not part of the tokenizer's saved weights: a
tokenizer checkpoint holds only what encodes images into ids.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from foundation_tasks.vision_common.front_end import vision_encoder
from foundation_tasks.vision_common.pixels import patch_pixels
from foundation_tasks.vision_common.transforms import unnormalize


class PixelTeacher(nn.Module):
    """The target is the (normalised) pixels of each patch: VQ-KD becomes a patch VQ-VAE.

    ``norm_pix``: each patch's pixels minus their mean, over their standard deviation (MAE's
    ``norm_pix_loss``). The codes then describe a patch's local structure (edges, corners,
    texture) rather than its mean colour, which a masked patch's neighbours already give
    away (a small pixel tokenizer otherwise spends its codes on colours)."""

    def __init__(self, patch_size: int, in_chans: int = 3, norm_pix: bool = False):
        super().__init__()
        self.patch_size, self.norm_pix = patch_size, norm_pix
        self.out_dim = patch_size * patch_size * in_chans

    @torch.no_grad()
    def forward(self, images: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        return patch_pixels(images, self.patch_size, self.norm_pix)


class ClipTeacher(nn.Module):
    """An ``open_clip`` image tower; the target is its final patch tokens (after
    ``ln_post``) projected by ``visual.proj``, as BEiT v2 uses CLIP-B/16.

    ``model`` is an open_clip model name (``ViT-B-16``) or the path of an open_clip model
    config ``.json`` (registered on the fly). ``pretrained`` is a local weights file; without
    one the teacher is randomly initialised, which is only good for testing the code path.
    Images are converted to CLIP's normalisation and resized to its input size; its token
    grid is resized (bilinear) to the tokenizer's.
    """

    def __init__(self, model: str, pretrained: Optional[str] = None):
        super().__init__()
        import open_clip

        name = model
        if model.endswith(".json"):
            open_clip.add_model_config(Path(model))
            name = Path(model).stem
        if pretrained is None:
            warnings.warn(f"VQ-KD teacher {model!r} has no pretrained weights (clip_pretrained: null): it is randomly "
                          "initialised, which only tests the code path", stacklevel=2)
        clip = open_clip.create_model(name, pretrained=pretrained)
        self.visual = clip.visual.eval().requires_grad_(False)
        self.visual.output_tokens = True
        cfg = getattr(self.visual, "preprocess_cfg", {}) or {}
        self.size = tuple(self.visual.image_size)
        self.register_buffer("mean", torch.tensor(cfg.get("mean", (0.48145466, 0.4578275, 0.40821073)))[:, None, None],
                             persistent=False)
        self.register_buffer("std", torch.tensor(cfg.get("std", (0.26862954, 0.26130258, 0.27577711)))[:, None, None],
                             persistent=False)
        proj = getattr(self.visual, "proj", None)
        self.out_dim = proj.shape[1] if proj is not None else self.visual.transformer.width
        self.grid = tuple(self.visual.grid_size)

    def train(self, mode: bool = True) -> "ClipTeacher":
        return super().train(False)  # always frozen, always eval

    @torch.no_grad()
    def forward(self, images: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        x = (unnormalize(images) - self.mean) / self.std
        if tuple(x.shape[-2:]) != self.size:
            x = F.interpolate(x, size=self.size, mode="bicubic", align_corners=False)
        _, tokens = self.visual(x)
        if self.visual.proj is not None:
            tokens = tokens @ self.visual.proj
        if self.grid != tuple(grid):
            B, _, D = tokens.shape
            t = tokens.transpose(1, 2).reshape(B, D, *self.grid)
            tokens = F.interpolate(t, size=tuple(grid), mode="bilinear", align_corners=False).flatten(2).transpose(1, 2)
        return tokens.float()


class RunTeacher(nn.Module):
    """A frozen ViT from one of our vision runs (``model.safetensors`` of a MIM, tokenizer or
    classification run); the target is its final-normed patch tokens.

    BEiT v2's teacher is CLIP; where none can be had, a model pretrained here on the same
    unlabelled images stands in: a pixel-MIM (MAE-target) run's features carry the objects'
    shape, which the codes then inherit (a pixel tokenizer's codes describe colour). The
    front end is built at the tokenizer's image and patch size (positions resampled when the
    run's grid differs); the run's patch size must be the tokenizer's."""

    def __init__(self, path: str, img_size: int, patch_size: int):
        super().__init__()
        self.embed, self.backbone = vision_encoder(path, img_size, patch_size)
        self.requires_grad_(False).eval()
        self.out_dim = self.backbone.config.dim

    def train(self, mode: bool = True) -> "RunTeacher":
        return super().train(False)  # always frozen, always eval

    @torch.no_grad()
    def forward(self, images: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        tokens = self.embed.embed(images)[0]
        return self.backbone(tokens, segments=[("vision", tokens.shape[1])])[:, 1:].float()
