"""ADE20k through mmseg's own dataset and transforms, as map-style datasets for the engine.

``ade20k(root, split, ...)`` builds mmseg's ``ADE20KDataset`` on an ``ADEChallengeData2016``
layout with the pipeline of mmseg's ``_base_/datasets/ade20k_640x640.py`` scaled to the
crop size (train: RandomResize of (4 crop, crop) by 0.5-2, RandomCrop with cat_max_ratio
0.75, flip, PhotoMetricDistortion; eval: Resize to (4 crop, crop) keeping the aspect ratio,
then the annotation at its original size), with ``LoadCheckedImageFromFile`` and
``LoadCheckedAnnotations`` in place of mmcv's / mmseg's loaders so that a bad image or
annotation fails with the file's name, and every image mode is read right. Any other
failure of the pipeline on one item (an image too thin to resize, ...) is a
``SegDataError`` naming the image, its size and the annotation.

Batches are plain tensors (the engine moves them to the device): ``train_collate`` uses
mmseg's ``SegDataPreProcessor`` (BGR->RGB, ImageNet mean/std, pad to the crop with 0 /
255); ``eval_collate`` normalises the same way and pads images and labels to the largest
in the batch, keeping each image's resized and original size.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import torch
from PIL import Image
from torch.utils.data import Dataset

from foundation.config import ConfigError
from foundation_tasks.segmentation import mmseg_compat

mmseg_compat.import_mmseg()

from mmengine.registry import DefaultScope  # noqa: E402
from mmseg.datasets import ADE20KDataset  # noqa: E402
from mmseg.models.data_preprocessor import SegDataPreProcessor  # noqa: E402

from foundation.engine.failure import one_line  # noqa: E402
from foundation_tasks.segmentation.transforms import AnnotationError, missing_annotations  # noqa: E402
from foundation_tasks.vision_common.images import ImageDataError  # noqa: E402

SPLITS = {"train": "training", "eval": "validation"}
MEAN, STD = (123.675, 116.28, 103.53), (58.395, 57.12, 57.375)  # ImageNet, 0-255, RGB
IGNORE = 255
ADE_CLASSES: tuple[str, ...] = ADE20KDataset.METAINFO["classes"]
ADE_PALETTE: list = ADE20KDataset.METAINFO["palette"]


def class_names(num_classes: int) -> tuple[str, ...]:
    """The first ``num_classes`` ADE20k classes (the demo data uses ids 1..8 of ADE20k)."""
    if not 1 <= num_classes <= len(ADE_CLASSES):
        raise ConfigError(f"field 'num_classes': must be in 1..{len(ADE_CLASSES)} (got {num_classes})")
    return ADE_CLASSES[:num_classes]


def check_layout(root: str | Path, field: str = "data_root") -> None:
    """``ConfigError`` naming the field and what is missing, before any work starts."""
    root = Path(root)
    hint = "(make demo data with: foundation data make segmentation --out DIR)"
    if not root.is_dir():
        raise ConfigError(f"field {field!r}: directory not found: {root} {hint}")
    for split in SPLITS.values():
        img_dir, ann_dir = root / "images" / split, root / "annotations" / split
        if not img_dir.is_dir() or not any(img_dir.rglob("*.jpg")):
            raise ConfigError(f"field {field!r}: no images in {img_dir} (expected the ADEChallengeData2016 "
                              f"layout images/{{training,validation}}/*.jpg) {hint}")
        if not ann_dir.is_dir():
            raise ConfigError(f"field {field!r}: annotation folder not found: {ann_dir}")
        missing = missing_annotations(img_dir, ann_dir)
        if missing:
            shown = ", ".join(str(p) for p in missing[:5])
            raise ConfigError(f"field {field!r}: {len(missing)} image(s) have no annotation file: {shown}"
                              + (" ..." if len(missing) > 5 else ""))


def train_pipeline(crop: int, num_classes: int, ratio_range: Sequence[float] = (0.5, 2.0),
                   cat_max_ratio: float = 0.75, photometric: bool = True) -> list[dict]:
    return [
        dict(type="LoadCheckedImageFromFile"),
        dict(type="LoadCheckedAnnotations", num_classes=num_classes),  # reduce_zero_label: the dataset's
        dict(type="RandomResize", scale=(4 * crop, crop), ratio_range=tuple(ratio_range), keep_ratio=True),
        dict(type="RandomCrop", crop_size=(crop, crop), cat_max_ratio=cat_max_ratio),
        dict(type="RandomFlip", prob=0.5),
        *([dict(type="PhotoMetricDistortion")] if photometric else []),
        dict(type="PackSegInputs"),
    ]


def eval_pipeline(scale: int, num_classes: int) -> list[dict]:
    return [
        dict(type="LoadCheckedImageFromFile"),
        dict(type="Resize", scale=(4 * scale, scale), keep_ratio=True),
        # after Resize: the annotation stays at the original size, as mmseg evaluates
        dict(type="LoadCheckedAnnotations", num_classes=num_classes),  # reduce_zero_label: the dataset's
        dict(type="PackSegInputs"),
    ]


def ade20k(root: str | Path, split: str, pipeline: list[dict], num_classes: int = 150) -> ADE20KDataset:
    """mmseg's ADE20KDataset on ``root`` (train -> training, eval -> validation)."""
    folder = SPLITS[split]
    metainfo = None
    if num_classes != len(ADE_CLASSES):  # a prefix of ADE20k's classes (the demo data)
        metainfo = dict(classes=class_names(num_classes), palette=ADE_PALETTE[:num_classes])
    with DefaultScope.overwrite_default_scope("mmseg"):  # transforms are looked up in mmseg's registry
        return ADE20KDataset(
            data_root=str(root), data_prefix=dict(img_path=f"images/{folder}", seg_map_path=f"annotations/{folder}"),
            pipeline=pipeline, metainfo=metainfo, reduce_zero_label=True, serialize_data=False,
        )


class SegDataset(Dataset):
    """An mmseg dataset for the engine: mmseg's items (``inputs``, ``data_samples``) plus
    ``split`` ("train" | "eval"), which tells the collate function how to batch them;
    ``indices`` keeps only those images (a label budget)."""

    def __init__(self, dataset: ADE20KDataset, split: str, indices: Optional[Sequence[int]] = None):
        self.dataset, self.split = dataset, split
        self.indices = list(range(len(dataset))) if indices is None else list(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> dict:
        i = self.indices[i]
        try:
            return {**self.dataset[i], "split": self.split}
        except (AnnotationError, ImageDataError):
            raise  # they name the file
        except Exception as e:  # noqa: BLE001 - e.g. cv2.error from a resize, which names nothing
            info = self.dataset.get_data_info(i)
            raise SegDataError(f"{info['img_path']}{_size(info['img_path'])}: the {self.split} pipeline failed on it "
                               f"(annotation {info.get('seg_map_path')}): {one_line(e)}") from e


def _size(path: str) -> str:
    """" (W x H pixels)" of an image file, or "" when unreadable."""
    try:
        with Image.open(path) as im:
            return f" ({im.size[0]}x{im.size[1]} pixels)"
    except (OSError, ValueError):
        return ""


class SegDataError(ValueError):
    """An item of a segmentation data set cannot be made into a training sample."""


class TrainCollate:
    """mmseg's SegDataPreProcessor on the CPU: (B, 3, crop, crop) floats and (B, crop, crop) labels."""

    def __init__(self, crop: int):
        self.pre = SegDataPreProcessor(mean=MEAN, std=STD, bgr_to_rgb=True, pad_val=0, seg_pad_val=IGNORE,
                                       size=(crop, crop))

    def __call__(self, samples: list[dict]) -> dict[str, torch.Tensor]:
        out = self.pre({"inputs": [s["inputs"] for s in samples],
                        "data_samples": [s["data_samples"] for s in samples]}, training=True)
        labels = torch.stack([d.gt_sem_seg.data[0] for d in out["data_samples"]]).long()
        return {"images": out["inputs"], "labels": labels}


def eval_collate(samples: list[dict]) -> dict[str, torch.Tensor]:
    """Images normalised as in training and padded (0) to the batch's largest; labels at
    their original size padded with 255; ``img_shape`` / ``ori_shape`` per sample."""
    mean, std = torch.tensor(MEAN).view(3, 1, 1), torch.tensor(STD).view(3, 1, 1)
    images = [(s["inputs"][[2, 1, 0]].float() - mean) / std for s in samples]  # BGR -> RGB
    labels = [s["data_samples"].gt_sem_seg.data[0] for s in samples]
    H, W = max(i.shape[1] for i in images), max(i.shape[2] for i in images)
    h, w = max(lab.shape[0] for lab in labels), max(lab.shape[1] for lab in labels)
    batch = torch.zeros(len(samples), 3, H, W)
    label_batch = torch.full((len(samples), h, w), IGNORE, dtype=torch.long)
    for k, (img, lab) in enumerate(zip(images, labels)):
        batch[k, :, : img.shape[1], : img.shape[2]] = img
        label_batch[k, : lab.shape[0], : lab.shape[1]] = lab
    return {
        "images": batch,
        "labels": label_batch,
        "img_shape": torch.tensor([list(i.shape[1:]) for i in images]),
        "ori_shape": torch.tensor([list(lab.shape) for lab in labels]),
    }
