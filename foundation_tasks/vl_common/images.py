"""Images of the vision-language tasks: loading with errors that name the file and the
record, open_clip's transforms, run under per-item seeds.

Transforms are open_clip's ``image_transform``: resize + center crop at evaluation; at
training a RandomResizedCrop with a configurable scale range and no flip (a flip turns
"left of" into "right of"). BEiT-3 normalises VL inputs with mean = std = 0.5, the default.

Per-item randomness (crops, masks) comes from a generator seeded by (a base seed, the
item index): ``foundation.engine.data.item_seed``, the same for every task.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import torch
from PIL import Image

from foundation.config import ConfigError
from foundation.engine.data import seeded
from foundation_tasks.vision_common.images import open_rgb


class DataError(ConfigError):
    """A record of a data set is malformed or points at something missing; the message
    names the file and the record. (A ``ConfigError``, so ``foundation train`` reports it
    in one line before training starts.)"""


def load_image(path: str | Path, record: str) -> Image.Image:
    """An RGB PIL image (any mode converted by ``vision_common.images.to_rgb``); ``DataError``
    naming ``record`` (e.g. "question 17 in FILE") and the file if it is missing, not an
    image or truncated."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{record}: image not found: {path}")
    try:
        return open_rgb(path)  # every PIL mode to RGB, as the vision tasks read it
    except ValueError as e:
        raise DataError(f"{record}: {e}") from None


def image_transform(img_size: int, train: bool, mean: Sequence[float], std: Sequence[float],
                    crop_scale: Sequence[float] = (1.0, 1.0), color_jitter: float | None = None) -> Callable:
    """open_clip's transform; at training RandomResizedCrop over ``crop_scale`` of the area
    and, with ``color_jitter`` j, ColorJitter(j, j, j) (BEiT-3 pretraining: 0.4)."""
    from open_clip import image_transform as clip_transform

    aug = None
    if train:
        aug = {"scale": tuple(crop_scale)}
        if color_jitter:
            aug.update(color_jitter=(color_jitter, color_jitter, color_jitter, 0.0), color_jitter_prob=1.0)
    return clip_transform(img_size, is_train=train, mean=tuple(mean), std=tuple(std), aug_cfg=aug)


def transform_image(transform: Callable, image: Image.Image, seed: int | None, record: str) -> torch.Tensor:
    try:
        if seed is None:
            return transform(image)
        with seeded(seed):
            return transform(image)
    except Exception as e:  # noqa: BLE001 - say which record's image failed
        raise DataError(f"{record}: the image transform failed ({type(e).__name__}: {e})") from e
