"""Masked image modeling: BEiT on visual tokens (Magneto Sec. 5, Table 13; BEiT v2), or
normalised pixels (SimMIM's input masking, MAE's per-patch normalised target).

    tasks:
      - name: mim
        data_dir: data/vision-demo                  # ImageNet layout; labels unused
        target: tokens                               # tokens (BEiT) | pixels
        tokenizer: checkpoints/vision-tokenizer-tiny/best/model.safetensors   # target: tokens
        img_size: 32
        patch_size: 4
        num_masking_patches: 26                      # BEiT on 14x14: 75
        min_num_patches: 4                           # BEiT: 16

The tokenizer is a trained ``vq_tokenizer`` run (or a converted BEiT v2 tokenizer) with
the same patch grid. Evaluation reports, on the masked patches of the validation images,
the accuracy of the predicted token ids (``mim_acc``) and their cross-entropy, or for the
pixel target the mean squared error of the normalised patch pixels (``pix_loss``; 1.0 is
what predicting each patch's mean scores).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import torch
from torch import nn

from foundation.checkpoint import CheckpointError
from foundation.config import ConfigError
from foundation.embed import POS_INITS
from foundation.engine.task import register_task
from foundation_tasks.mim.data import MaskedImageFolder
from foundation_tasks.mim.metrics import mim_metrics, mim_sums, pixel_sums
from foundation_tasks.mim.model import MaskedImageModel, MIMHead, PixelMIMHead
from foundation_tasks.vision_common.masking import MaskingGenerator
from foundation_tasks.vision_common.task import ImageFolderTask
from foundation_tasks.vision_common.tokenizer import load_tokenizer
from foundation_tasks.vision_common.transforms import pretrain_transform, uncropped_eval_transform


TARGETS = ("tokens", "pixels")


@dataclass
class MIMConfig:
    data_dir: Optional[str] = None  # ImageNet layout: ROOT/{train,val}/<class>/*.JPEG
    target: str = "tokens"  # tokens: the tokenizer's code of each masked patch (BEiT) | pixels (normalised)
    norm_pix: bool = True  # pixels: each target patch to zero mean, unit variance (MAE's norm_pix_loss)
    tokenizer: Optional[str] = None  # tokens: a vq_tokenizer run's model.safetensors (or a converted BEiT v2 one)
    tokenizer_task: Optional[str] = None  # its vq_tokenizer task id, if it has several
    img_size: int = 224
    patch_size: int = 16
    pos_embed_init: str = "trunc_normal"  # trunc_normal (std 0.02, BEiT) | sincos (2-D sin-cos start, MAE)
    num_masking_patches: int = 75  # BEiT: 75 of 14 x 14
    min_num_patches: int = 16  # smallest block
    max_num_patches: Optional[int] = None  # largest block; default num_masking_patches
    min_aspect: float = 0.3  # block aspect ratio range [min_aspect, max_aspect]
    max_aspect: Optional[float] = None  # default 1 / min_aspect
    mask_seed: int = 0  # evaluation masks
    scale: List[float] = field(default_factory=lambda: [0.08, 1.0])  # RandomResizedCrop area (BEiT: 0.08)
    color_jitter: float = 0.4
    hflip: float = 0.5
    interpolation: str = "bicubic"

    def __post_init__(self) -> None:
        def bad(name: str, msg: str) -> ConfigError:
            return ConfigError(f"field {name!r}: {msg} (got {getattr(self, name)!r})")

        for name in ("img_size", "patch_size", "num_masking_patches", "min_num_patches"):
            if getattr(self, name) < 1:
                raise bad(name, "must be >= 1")
        if self.target not in TARGETS:
            raise bad("target", f"must be one of {', '.join(TARGETS)}")
        if self.pos_embed_init not in POS_INITS:
            raise bad("pos_embed_init", f"must be one of {', '.join(POS_INITS)}")
        if len(self.scale) != 2 or not 0 < self.scale[0] <= self.scale[1] <= 1:
            raise bad("scale", "must be [min, max] with 0 < min <= max <= 1")
        if self.img_size % self.patch_size == 0:
            try:
                self.masking()
            except ValueError as e:
                raise ConfigError(f"masking: {e}") from None

    def masking(self) -> MaskingGenerator:
        return MaskingGenerator((self.img_size // self.patch_size,) * 2, self.num_masking_patches,
                                self.min_num_patches, self.max_num_patches, self.min_aspect, self.max_aspect)


@register_task("mim")
class MIM(ImageFolderTask):
    Config = MIMConfig
    primary_metric = "mim_acc"
    modality = "vision"
    multiway = True

    @classmethod
    def primary(cls, config: MIMConfig) -> tuple[str, bool]:
        return ("pix_loss", False) if config.target == "pixels" else (cls.primary_metric, True)

    def check(self) -> None:
        super().check()
        c = self.cfg
        if c.target == "pixels":
            return
        if c.tokenizer is None:
            raise ConfigError("field 'tokenizer': set it to a trained tokenizer (a vq_tokenizer run's "
                              "best/model.safetensors; see configs/vision/tiny_tokenizer.yaml)")
        if not Path(c.tokenizer).is_file():
            raise ConfigError(f"field 'tokenizer': not found: {c.tokenizer} (train it first: foundation train "
                              "configs/vision/tiny_tokenizer.yaml)")

    def build_head(self, shared=None) -> MaskedImageModel:
        c = self.cfg
        if c.target == "pixels":
            return PixelMIMHead(self.backbone_cfg.dim, c.img_size, c.patch_size, pos_init=c.pos_embed_init,
                                norm_pix=c.norm_pix)
        if c.tokenizer is None or not Path(c.tokenizer).is_file():
            raise ConfigError(f"field 'tokenizer': not found: {c.tokenizer}")
        try:
            tokenizer = load_tokenizer(c.tokenizer, c.tokenizer_task)
        except CheckpointError as e:
            raise ConfigError(f"field 'tokenizer': {e}") from None
        if (tokenizer.img_size, tokenizer.patch_size) != (c.img_size, c.patch_size):
            raise ConfigError(f"field 'tokenizer': it encodes {tokenizer.img_size}px images in {tokenizer.patch_size}px "
                              f"patches, this task has img_size={c.img_size}, patch_size={c.patch_size}")
        return MIMHead(self.backbone_cfg.dim, c.img_size, c.patch_size, tokenizer, pos_init=c.pos_embed_init)

    def dataset(self, split: str, train: bool) -> MaskedImageFolder:
        c = self.cfg
        transform = (pretrain_transform(c.img_size, c.scale, c.color_jitter, c.hflip, c.interpolation) if train else
                     uncropped_eval_transform(c.img_size, c.interpolation))
        return MaskedImageFolder(c.data_dir, split, transform, random_transform=train, masking=c.masking(),
                                 mask_seed=c.mask_seed, expected_shape=(3, c.img_size, c.img_size))

    def collate(self, samples):
        images, masks = zip(*samples)
        return {"images": torch.stack(images), "mask": torch.stack(masks)}

    def eval_step(self, head: MaskedImageModel, backbone: nn.Module, batch) -> dict[str, torch.Tensor]:
        images, mask = batch["images"], batch["mask"]
        if isinstance(head, PixelMIMHead):
            return pixel_sums(head.masked_pixels(backbone, images, mask), head.targets(images)[mask])
        return mim_sums(head.masked_logits(backbone, images, mask), head.targets(images)[mask])

    def metrics(self, totals) -> dict[str, float]:
        return mim_metrics(totals)
