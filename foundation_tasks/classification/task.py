"""Image classification fine-tuning (BEiT's ImageNet recipe, Magneto Table 14).

    tasks:
      - name: classification
        data_dir: data/vision-demo      # ROOT/{train,val}/<class>/*.JPEG
        num_classes: 10
        img_size: 32
        patch_size: 4

Training augmentation is timm's ``create_transform`` (RandomResizedCrop, flip,
RandAugment ``rand-m9-mstd0.5-inc1``, random erasing 0.25), then Mixup 0.8 / CutMix 1.0
with label smoothing 0.1 in the head; evaluation is resize + centre crop, top-1 / top-5.
Layer decay and drop path are engine / backbone settings (``optim.layer_decay``,
``backbone.drop_path``).

Fine-tuning from pretraining: the top-level ``init_from`` loads the backbone and this
head's front end (``patch_embed``, ``cls_token``, ``pos_embed``, resized to this patch
grid) from a MIM run or a ViT file; a classifier of another size is skipped.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from timm.data import Mixup
from torch import nn

from foundation.config import ConfigError
from foundation.embed import POS_INITS
from foundation.engine.task import register_task
from foundation_tasks.classification.metrics import classification_metrics, topk_sums
from foundation_tasks.classification.model import ClassificationHead
from foundation_tasks.vision_common.folder import ImageFolderDataset, find_classes
from foundation_tasks.vision_common.images import ImageDataError
from foundation_tasks.vision_common.task import ImageFolderTask
from foundation_tasks.vision_common.transforms import MEAN, STD, TransformConfig, build_transform
from foundation_tasks.vision_common.resize import adapt_vision_init


@dataclass
class ClassificationConfig(TransformConfig):
    data_dir: Optional[str] = None  # ImageNet layout: ROOT/{train,val}/<class>/*.JPEG
    num_classes: int = 1000  # must equal the number of class folders in ROOT/train
    patch_size: int = 16
    global_pool: str = "avg"  # avg (BEiT's mean pooling) | token (class token)
    pos_embed_init: str = "trunc_normal"  # trunc_normal (std 0.02, BEiT) | sincos (2-D sin-cos start, MAE)
    fc_norm: bool = True  # LayerNorm after pooling
    head_init_scale: float = 0.001  # BEiT: the head's initial weights are scaled down
    mixup: float = 0.8  # Mixup alpha (0 = off)
    cutmix: float = 1.0  # CutMix alpha (0 = off)
    mixup_prob: float = 1.0  # probability of mixing a batch
    mixup_switch_prob: float = 0.5  # probability of CutMix rather than Mixup when both are on
    label_smoothing: float = 0.1
    min_image_size: int = 1  # smaller images are errors naming the file
    cache_images: bool = False  # keep decoded images in memory (small data sets)
    # a label budget: train on this many images per class (val is never subset), drawn by
    # subset_seed; nested across budgets (vision_common.folder.labelled_subset)
    train_per_class: Optional[int] = None
    subset_seed: int = 0

    def __post_init__(self) -> None:
        def bad(name: str, msg: str) -> ConfigError:
            return ConfigError(f"field {name!r}: {msg} (got {getattr(self, name)!r})")

        if self.global_pool not in ("avg", "token"):
            raise bad("global_pool", "must be avg or token")
        if self.pos_embed_init not in POS_INITS:
            raise bad("pos_embed_init", f"must be one of {', '.join(POS_INITS)}")
        if self.train_per_class is not None and self.train_per_class < 1:
            raise bad("train_per_class", "must be >= 1 or null (every image)")
        for name in ("num_classes", "patch_size", "img_size", "min_image_size", "re_count"):
            if getattr(self, name) < 1:
                raise bad(name, "must be >= 1")
        for name in ("re_prob", "mixup_prob", "mixup_switch_prob", "hflip"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise bad(name, "must be in [0, 1]")
        for name in ("mixup", "cutmix"):
            if getattr(self, name) < 0:
                raise bad(name, "must be >= 0")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise bad("label_smoothing", "must be in [0, 1)")
        if len(self.scale) != 2 or not 0 < self.scale[0] <= self.scale[1] <= 1:
            raise bad("scale", "must be [min, max] with 0 < min <= max <= 1")
        if not 0 < self.crop_pct <= 1:
            raise bad("crop_pct", "must be in (0, 1]")


@register_task("classification")
class Classification(ImageFolderTask):
    Config = ClassificationConfig
    primary_metric = "top1"
    modality = "vision"

    def check(self) -> None:
        super().check()
        c = self.cfg
        classes = find_classes(c.data_dir)
        if len(classes) != c.num_classes:
            raise ConfigError(f"field 'num_classes': {c.num_classes}, but {Path(c.data_dir) / 'train'} has "
                              f"{len(classes)} class folders")

    def mixup(self) -> Mixup | None:
        c = self.cfg
        if c.mixup_prob == 0 or (c.mixup == 0 and c.cutmix == 0):
            return None
        return Mixup(mixup_alpha=c.mixup, cutmix_alpha=c.cutmix, prob=c.mixup_prob, switch_prob=c.mixup_switch_prob,
                     mode="batch", label_smoothing=c.label_smoothing, num_classes=c.num_classes)

    def build_head(self, shared=None) -> ClassificationHead:
        c, b = self.cfg, self.backbone_cfg
        head = ClassificationHead(b.dim, c.num_classes, c.img_size, c.patch_size, global_pool=c.global_pool,
                                  fc_norm=c.fc_norm, head_init_scale=c.head_init_scale,
                                  label_smoothing=c.label_smoothing, mixup=self.mixup(), eps=b.layernorm_eps,
                                  pos_init=c.pos_embed_init)
        return head

    def adapt_init(self, name, tensor, target):
        """A front end pretrained at another resolution: positions resized to this grid."""
        return adapt_vision_init(name, tensor, target, [self.cfg.img_size // self.cfg.patch_size] * 2,
                                 prefix_tokens=1)  # the class token

    def dataset(self, split: str, train: bool) -> ImageFolderDataset:
        c = self.cfg
        return ImageFolderDataset(c.data_dir, split, build_transform(c, train), min_image_size=c.min_image_size,
                                  random_transform=train, expected_shape=(3, c.img_size, c.img_size),
                                  cache_images=c.cache_images, per_class=c.train_per_class if train else None,
                                  subset_seed=c.subset_seed)

    def collate(self, samples):
        images, labels = zip(*samples)
        return {"images": torch.stack(images), "labels": torch.as_tensor(labels, dtype=torch.long)}

    def eval_step(self, head: ClassificationHead, backbone: nn.Module, batch) -> dict[str, torch.Tensor]:
        return topk_sums(head.logits(backbone, batch["images"]), batch["labels"])

    def metrics(self, totals) -> dict[str, float]:
        return classification_metrics(totals)

    def export_meta(self) -> dict:
        """Class names (the output order: the sorted train folders) and the evaluation transform."""
        if getattr(self, "_meta", None) is None:
            c = self.cfg
            try:
                classes = find_classes(c.data_dir)
            except ImageDataError as e:
                raise ConfigError(f"field 'data_dir': {e}") from None
            self._meta = dict(classes=classes, img_size=c.img_size, crop_pct=c.crop_pct,
                              interpolation=c.interpolation, mean=list(MEAN), std=list(STD))
        return self._meta

    def predictor(self, head, backbone, meta, device):
        from foundation_tasks.classification.predict import ClassificationPredictor

        return ClassificationPredictor(self, head, backbone, meta, device)
