"""Images of the vision-language tasks: loading with errors that name the file and the
record, open_clip's transforms, and per-item random generators.

Transforms are open_clip's ``image_transform``: resize + center crop at evaluation; at
training a RandomResizedCrop with a configurable scale range and no flip (a flip turns
"left of" into "right of"). BEiT-3 normalises VL inputs with mean = std = 0.5, the default.

Per-item randomness (crops, masks) comes from a generator seeded by (a base seed, the
item index): the base is the DataLoader worker's seed, or without workers one draw of
torch's global RNG, which the engine saves and restores on resume; at evaluation the
base is fixed, so the evaluation is the same every time.
"""
from __future__ import annotations

import contextlib
import random
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from foundation.config import ConfigError


class DataError(ConfigError):
    """A record of a data set is malformed or points at something missing; the message
    names the file and the record. (A ``ConfigError``, so ``foundation train`` reports it
    in one line before training starts.)"""


def load_image(path: str | Path, record: str) -> Image.Image:
    """An RGB PIL image; ``DataError`` naming ``record`` (e.g. "question 17 in FILE") if
    the file is missing or not an image."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{record}: image not found: {path}")
    try:
        with Image.open(path) as im:
            return im.convert("RGB")
    except (UnidentifiedImageError, OSError) as e:
        raise DataError(f"{record}: {path} is not a readable image ({e})") from None


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


def item_seed(index: int, train: bool) -> int:
    """The seed of one item's randomness (see the module docstring)."""
    if train:
        info = torch.utils.data.get_worker_info()
        base = info.seed - info.id if info is not None else int(torch.randint(0, 2**62, ()).item())
    else:
        base = 12345
    return int(np.random.SeedSequence([base % 2**63, index]).generate_state(1, np.uint64)[0] >> 1)


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Python's, NumPy's and torch's CPU RNGs seeded inside, restored after (torchvision's
    random transforms draw from the global RNGs)."""
    py, npy = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)
        try:
            yield
        finally:
            random.setstate(py)
            np.random.set_state(npy)


def transform_image(transform: Callable, image: Image.Image, seed: int | None, record: str) -> torch.Tensor:
    try:
        if seed is None:
            return transform(image)
        with seeded(seed):
            return transform(image)
    except Exception as e:  # noqa: BLE001 - say which record's image failed
        raise DataError(f"{record}: the image transform failed ({type(e).__name__}: {e})") from e
