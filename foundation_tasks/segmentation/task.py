"""Semantic segmentation (ADE20k) with UperNet on the shared ViT backbone, through mmseg.

The recipe of mmseg's ``configs/beit/beit-base_upernet_8xb2-160k_ade20k-640x640.py``:
blocks (3, 5, 7, 11) -> Feature2Pyramid (rescales 4, 2, 1, 0.5) -> UPerHead (768 channels,
pool scales 1, 2, 3, 6) + FCN auxiliary head on the third map (loss weight 0.4); 640 crops;
sliding-window inference (stride 426); AdamW 3e-5 with layer decay 0.9, warmup then poly
(the engine's ``optim`` / ``schedule`` sections). Data: mmseg's ADE20KDataset and
transforms (``foundation_tasks/segmentation/data.py``); metric: mmseg's IoUMetric (``metrics.py``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import torch
import torch.nn.functional as F

from foundation.config import ConfigError
from foundation.embed import POS_INITS
from foundation.engine.data import labelled_fraction
from foundation.engine.task import Task, register_task
from foundation_tasks.segmentation.data import (ADE_PALETTE, MEAN, STD, SegDataset, TrainCollate, ade20k, check_layout,
                                     class_names, eval_collate, eval_pipeline, train_pipeline)
from foundation_tasks.segmentation.metrics import iou_sums, seg_metrics
from foundation_tasks.segmentation.model import UperNetHead
from foundation_tasks.vision_common.resize import adapt_vision_init

TEST_MODES = ("slide", "whole")


@dataclass
class SegmentationConfig:
    data_root: str = "data/ade/ADEChallengeData2016"  # images/{training,validation}, annotations/...
    num_classes: int = 150  # the first num_classes ADE20k classes (the demo data: 8)
    img_size: int = 640  # training crop; the patch grid (backbone.rel_pos_grid) is img_size / patch_size
    patch_size: int = 16
    class_token: bool = True
    abs_pos_embed: bool = False  # BEiT has none: the backbone's rel_pos: 2d encodes positions
    pos_embed_init: str = "trunc_normal"  # of abs_pos_embed: trunc_normal (std 0.02) | sincos (2-D sin-cos start)
    out_indices: List[int] = field(default_factory=lambda: [3, 5, 7, 11])
    rescales: List[float] = field(default_factory=lambda: [4.0, 2.0, 1.0, 0.5])
    channels: int = 768  # UPerHead
    pool_scales: List[int] = field(default_factory=lambda: [1, 2, 3, 6])
    aux_channels: int = 256  # FCNHead
    aux_index: int = 2
    aux_weight: float = 0.4  # 0 = no auxiliary head
    # per-class weights of both heads' cross-entropy (mmseg's CrossEntropyLoss class_weight), one per class;
    # null: every class 1 (BEiT's ADE20k recipe)
    class_weight: Optional[List[float]] = None
    dropout_ratio: float = 0.1
    sync_bn: bool = True  # SyncBN under multi-GPU training (BN otherwise)
    ratio_range: List[float] = field(default_factory=lambda: [0.5, 2.0])  # RandomResize of (4 crop, crop)
    cat_max_ratio: float = 0.75  # RandomCrop
    photometric: bool = True  # PhotoMetricDistortion
    test_mode: str = "slide"  # slide | whole
    test_stride: Optional[int] = None  # sliding window stride; default 2/3 of img_size (426 for 640)
    # a label budget: train on this fraction of the annotated images (the validation set is never
    # subset), drawn by subset_seed; nested across fractions (foundation.engine.data.labelled_fraction)
    train_fraction: Optional[float] = None
    subset_seed: int = 0

    def __post_init__(self) -> None:
        def bad(name: str, msg: str) -> ConfigError:
            return ConfigError(f"field {name!r}: {msg} (got {getattr(self, name)!r})")

        class_names(self.num_classes)
        if self.img_size < 1 or self.patch_size < 1 or self.img_size % self.patch_size:
            raise bad("img_size", f"must be a positive multiple of patch_size={self.patch_size}")
        if len(self.out_indices) != len(self.rescales):
            raise bad("rescales", f"needs one entry per out_indices entry ({len(self.out_indices)})")
        if any(r not in (4, 2, 1, 0.5) for r in self.rescales):
            raise bad("rescales", "entries must be 4, 2, 1 or 0.5 (Feature2Pyramid)")
        if not 0 <= self.aux_index < len(self.out_indices):
            raise bad("aux_index", f"must index the {len(self.out_indices)} neck outputs")
        if self.aux_weight < 0:
            raise bad("aux_weight", "must be >= 0")
        if self.class_weight is not None and (len(self.class_weight) != self.num_classes
                                              or any(not w >= 0 for w in self.class_weight)):
            raise bad("class_weight", f"must be {self.num_classes} weights >= 0, one per class (num_classes), or null")
        if self.pos_embed_init not in POS_INITS:
            raise bad("pos_embed_init", f"must be one of {', '.join(POS_INITS)}")
        if self.train_fraction is not None and not 0 < self.train_fraction <= 1:
            raise bad("train_fraction", "must be in (0, 1] or null (every image)")
        if self.test_mode not in TEST_MODES:
            raise bad("test_mode", f"must be one of {', '.join(TEST_MODES)}")
        if self.test_stride is not None and not 1 <= self.test_stride <= self.img_size:
            raise bad("test_stride", f"must be in 1..img_size={self.img_size}")
        if len(self.ratio_range) != 2 or not 0 < self.ratio_range[0] <= self.ratio_range[1]:
            raise bad("ratio_range", "must be [low, high] with 0 < low <= high")

    @property
    def grid(self) -> list[int]:
        return [self.img_size // self.patch_size] * 2


@register_task("segmentation")
class Segmentation(Task):
    Config = SegmentationConfig
    primary_metric = "mIoU"
    modality = "vision"
    higher_is_better = True
    embedding_params = ("patch_embed", "pos_embed", "cls_token")

    def check(self) -> None:
        c, b = self.cfg, self.backbone_cfg
        if b.arch != "encoder" or b.experts:
            raise ConfigError("field 'backbone': segmentation needs a plain encoder (arch: encoder, no experts)")
        for i in c.out_indices:
            if not -b.depth <= i < b.depth:
                raise ConfigError(f"field 'out_indices': block {i} does not exist in a {b.depth}-layer backbone")
        if b.has_final_norm and b.depth - 1 not in [i % b.depth for i in c.out_indices]:
            raise ConfigError("field 'backbone.final_norm': the final LayerNorm would be unused because the last "
                              "block is not in out_indices; set backbone.final_norm: false (BEiT's setting)")
        if b.rel_pos == "2d" and (list(b.rel_pos_grid) != c.grid or b.rel_pos_prefix != int(c.class_token)):
            raise ConfigError(f"field 'backbone.rel_pos_grid': must be the patch grid of the training crop, "
                              f"img_size / patch_size = {c.grid}, with rel_pos_prefix {int(c.class_token)} "
                              f"(got {b.rel_pos_grid}, {b.rel_pos_prefix})")
        if b.rel_pos != "2d" and not c.abs_pos_embed:
            raise ConfigError("field 'abs_pos_embed': without backbone.rel_pos: 2d the model needs a position "
                              "embedding (abs_pos_embed: true)")
        check_layout(c.data_root)

    def build_head(self, shared=None) -> UperNetHead:
        c = self.cfg
        head = UperNetHead(
            self.backbone_cfg.dim, c.num_classes, c.img_size, c.patch_size, out_indices=c.out_indices,
            rescales=c.rescales, channels=c.channels, pool_scales=c.pool_scales, aux_channels=c.aux_channels,
            aux_index=c.aux_index, aux_weight=c.aux_weight, dropout_ratio=c.dropout_ratio,
            class_token=c.class_token, abs_pos_embed=c.abs_pos_embed, final_norm=self.backbone_cfg.has_final_norm,
            sync_bn=c.sync_bn, pos_init=c.pos_embed_init, class_weight=c.class_weight,
        )
        return head

    def adapt_init(self, name, tensor, target):
        """init_from (a MIM run, a ViT file) at another resolution: the position embedding
        and the relative position table resized to this crop's patch grid."""
        return adapt_vision_init(name, tensor, target, self.cfg.grid, int(self.cfg.class_token))

    def train_dataset(self) -> SegDataset:
        c = self.cfg
        pipeline = train_pipeline(c.img_size, c.num_classes, c.ratio_range, c.cat_max_ratio, c.photometric)
        data = ade20k(c.data_root, "train", pipeline, c.num_classes)
        return SegDataset(data, "train", labelled_fraction(len(data), c.train_fraction, c.subset_seed, "images"))

    def eval_dataset(self) -> SegDataset:
        c = self.cfg
        return SegDataset(ade20k(c.data_root, "eval", eval_pipeline(c.img_size, c.num_classes), c.num_classes), "eval")

    def collate(self, samples: list) -> dict:
        # training items are crops of one size; evaluation items keep their own sizes
        if samples[0]["split"] == "train":
            if getattr(self, "_train_collate", None) is None:
                self._train_collate = TrainCollate(self.cfg.img_size)
            return self._train_collate(samples)
        return eval_collate(samples)

    @property
    def stride(self) -> int:
        return self.cfg.test_stride or max(1, self.cfg.img_size * 2 // 3)

    def eval_step(self, head: UperNetHead, backbone, batch) -> dict[str, torch.Tensor]:
        c = self.cfg
        stride = self.stride
        totals: dict[str, torch.Tensor] = {}
        for i in range(batch["images"].shape[0]):
            h, w = batch["img_shape"][i].tolist()
            oh, ow = batch["ori_shape"][i].tolist()
            logits = head.predict_logits(backbone, batch["images"][i:i + 1, :, :h, :w], c.test_mode, c.img_size, stride)
            logits = F.interpolate(logits.float(), size=(oh, ow), mode="bilinear", align_corners=False)
            sums = iou_sums(logits.argmax(1)[0], batch["labels"][i, :oh, :ow], c.num_classes)
            for k, v in sums.items():
                totals[k] = totals[k] + v if k in totals else v
        return totals

    def metrics(self, totals) -> dict[str, float]:
        return seg_metrics(totals, class_names(self.cfg.num_classes))

    def export_meta(self) -> dict:
        """Class names and palette, the label values (ADE20k's: index + 1), the test-time
        resize and normalisation, and whole / sliding-window inference with its sizes."""
        c = self.cfg
        return dict(classes=[n.strip() for n in class_names(c.num_classes)],  # mmseg's list has 'bed '
                    palette=[list(p) for p in ADE_PALETTE[:c.num_classes]],
                    label_offset=1, scale=c.img_size, mean=list(MEAN), std=list(STD), mode=c.test_mode,
                    crop=c.img_size, stride=self.stride)

    def predictor(self, head, backbone, meta, device):
        from foundation_tasks.segmentation.predict import SegmentationPredictor

        return SegmentationPredictor(self, head, backbone, meta, device)
