"""ImageNet-layout image folders, read with errors that name the file (transforms: ``transforms``).

The layout is ImageNet's (``ILSVRC/Data/CLS-LOC`` after the usual val re-sort)::

    ROOT/train/<class>/*.JPEG
    ROOT/val/<class>/*.JPEG

Class indices are the sorted train folder names (torchvision's ``ImageFolder`` and timm's
order), so a checkpoint's outputs mean the same classes on any copy of the data. A val
folder must hold only classes that train has. Problems are found early and named:
a missing split, an empty class folder, a file that is not an image, an image too
small to use, a transform that returns the wrong size.

Augmentation is per item and reproducible: every ``__getitem__`` runs the transform with
Python's, NumPy's and torch's RNGs seeded from (a base seed, the index): the engine's
``item_seed`` / ``seeded`` (``foundation.engine.data``). ``python -m foundation_tasks.classification.data
verify ROOT`` (or ``python -m foundation_tasks.vision_common.folder verify ROOT``) opens and converts
every image once, lists the bad ones and counts the images that were not RGB (16-bit,
palette, CMYK, with alpha ...: see ``foundation_tasks.vision_common.images``).
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from collections import Counter
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch
from PIL import Image
from torch.utils.data import Dataset

from foundation.config import ConfigError
from foundation.engine.data import item_seed, seeded
from foundation_tasks.vision_common.images import DecodedImages, ImageDataError, load_image
from foundation_tasks.vision_common.transforms import flip_of_bytes

# what timm and torchvision read; ImageNet's own files are .JPEG
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
SPLITS = ("train", "val")


# --------------------------------------------------------------------------- the folders


def _is_image(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_EXTENSIONS and not path.name.startswith(".")


def find_classes(root: str | Path) -> list[str]:
    """Sorted class folder names of ``root/train``."""
    split = Path(root) / "train"
    if not split.is_dir():
        raise ImageDataError(f"{split}: no such folder; expected the ImageNet layout ROOT/train/<class>/*.JPEG, "
                             "ROOT/val/<class>/*.JPEG (a demo set: foundation data make vision --out ROOT)")
    classes = sorted(p.name for p in split.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise ImageDataError(f"{split}: no class folders (expected {split}/<class>/*.JPEG)")
    return classes


def scan_split(root: str | Path, split: str, classes: Sequence[str]) -> list[tuple[Path, int]]:
    """[(file, class index)] of ``root/split``, files sorted within each class."""
    folder = Path(root) / split
    if not folder.is_dir():
        raise ImageDataError(f"{folder}: no such folder (expected {folder}/<class>/*.JPEG)")
    index = {name: i for i, name in enumerate(classes)}
    found = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    stray = [p.name for p in folder.iterdir() if p.is_file() and _is_image(p)]
    if stray:
        raise ImageDataError(f"{folder}: image files directly in the split folder ({', '.join(sorted(stray)[:3])}); "
                             f"put each image in its class folder, {folder}/<class>/")
    unknown = [p.name for p in found if p.name not in index]
    if unknown:
        raise ImageDataError(f"{folder}: class folder(s) {', '.join(unknown[:5])} are not in "
                             f"{Path(root) / 'train'} ({len(classes)} classes)")
    samples = []
    for class_dir in found:
        files = sorted(p for p in class_dir.iterdir() if p.is_file() and _is_image(p))
        if not files:
            raise ImageDataError(f"{class_dir}: empty class folder (no {', '.join(IMAGE_EXTENSIONS[:3])}, ... files)")
        samples.extend((f, index[class_dir.name]) for f in files)
    if not samples:
        raise ImageDataError(f"{folder}: no class folders with images")
    return samples


def labelled_subset(samples: Sequence[tuple[Path, int]], per_class: int, seed: int,
                    where: str = "") -> list[tuple[Path, int]]:
    """``per_class`` items of each class, drawn by a permutation seeded by (seed, class): the
    same subset for the same seed on any machine, and nested across sizes (the 10 of a seed
    are among its 100), so label budgets differ only in the labels added."""
    import numpy as np

    by_class: dict[int, list[tuple[Path, int]]] = {}
    for item in samples:
        by_class.setdefault(item[1], []).append(item)
    out = []
    for label, items in sorted(by_class.items()):
        if len(items) < per_class:
            raise ImageDataError(f"{where or 'the split'}: class {label} has {len(items)} images, fewer than the "
                                 f"{per_class} per class asked for (train_per_class)")
        order = np.random.default_rng([seed, label]).permutation(len(items))[:per_class]
        out.extend(items[i] for i in sorted(order))
    return out


# --------------------------------------------------------------------------- the data set


class ImageFolderDataset(Dataset):
    """``(image tensor, class index)`` items of one split of an ImageNet-layout folder."""

    def __init__(self, root: str | Path, split: str, transform: Callable, *, classes: Sequence[str] | None = None,
                 min_image_size: int = 1, random_transform: bool = False,
                 expected_shape: Sequence[int] | None = None, cache_images: bool = False,
                 per_class: int | None = None, subset_seed: int = 0):
        self.root, self.split = Path(root), split
        self.decoded = DecodedImages(cache_images)
        self.classes = list(classes) if classes is not None else find_classes(root)
        self.samples = scan_split(root, split, self.classes)
        if per_class is not None:  # a label budget: the same classes, fewer images each
            self.samples = labelled_subset(self.samples, per_class, subset_seed, where=str(self.root / split))
        self.transform, self.min_image_size = transform, min_image_size
        self.random_transform = random_transform  # seed it per item (training augmentation)
        self.expected_shape = tuple(expected_shape) if expected_shape is not None else None
        # kept images whose items are a flip of their bytes (transforms.FlipOfBytes) keep those bytes instead:
        # path -> uint8 CHW tensor, or None for an image that goes through the transform
        self.split_flip = flip_of_bytes(transform) if cache_images else None
        self.kept_bytes: dict[str, Optional[torch.Tensor]] = {}

    def __len__(self) -> int:
        return len(self.samples)

    def load(self, i: int) -> tuple[Image.Image, int]:
        path, label = self.samples[i]
        return self.decoded.get(path, lambda: load_image(path, self.min_image_size)), label

    def sample(self, i: int) -> tuple[torch.Tensor, int, int | None]:
        """(transformed image, label, the item's augmentation seed or None)."""
        kept = self.kept_bytes_of(i)
        image, label = (None, self.samples[i][1]) if kept is not None else self.load(i)
        seed = item_seed(i) if self.random_transform else None
        try:
            if kept is not None:
                with seeded(seed) if seed is not None else contextlib.nullcontext():
                    x = self.split_flip.flip(kept)
            elif seed is None:
                x = self.transform(image)
            else:
                with seeded(seed):
                    x = self.transform(image)
        except Exception as e:  # noqa: BLE001 - a transform failing on one image: say which
            raise ImageDataError(f"{self.samples[i][0]}: the transform failed ({type(e).__name__}: {e})") from e
        check_tensor(x, self.samples[i][0], self.expected_shape)
        return x, label, seed

    def kept_bytes_of(self, i: int) -> Optional[torch.Tensor]:
        """Image ``i``'s bytes (uint8 CHW) where ``split_flip`` applies to it (read once, then kept
        in place of the image), else None."""
        if self.split_flip is None:
            return None
        key = str(self.samples[i][0])
        if key not in self.kept_bytes:
            image, _ = self.load(i)
            self.kept_bytes[key] = self.split_flip.chw(image) if self.split_flip.applies(image) else None
            if self.kept_bytes[key] is not None:
                self.decoded.images.pop(key, None)  # the tensor stands in for the image
        return self.kept_bytes[key]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        x, label, _ = self.sample(i)
        return x, label


def check_tensor(x, path: Path, shape: tuple[int, ...] | None) -> None:
    if not isinstance(x, torch.Tensor):
        raise ImageDataError(f"{path}: the transform returned {type(x).__name__}, not a tensor")
    if shape is not None and tuple(x.shape) != tuple(shape):
        raise ImageDataError(f"{path}: the transform gave an image of shape {tuple(x.shape)}, expected {tuple(shape)}")


def verify_images(root: str | Path, min_size: int = 1, modes: Counter | None = None) -> tuple[int, list[str]]:
    """(number of images, [error messages]) after opening every image of every split and
    converting it as training does; ``modes`` counts the file modes met."""
    classes = find_classes(root)
    errors, n = [], 0
    for split in SPLITS:
        if not (Path(root) / split).is_dir():
            errors.append(f"{Path(root) / split}: no such folder")
            continue
        for path, _ in scan_split(root, split, classes):
            n += 1
            try:
                load_image(path, min_size, modes)
            except ImageDataError as e:
                errors.append(str(e))
    return n, errors


def check_root(root: str | None, field: str = "data_dir") -> None:
    """ConfigError naming ``field`` unless ``root`` holds the ImageNet layout."""
    if root is None:
        raise ConfigError(f"field {field!r}: set it to an ImageNet-layout folder ROOT/{{train,val}}/<class>/*.JPEG "
                          "(a demo set: foundation data make vision --out ROOT)")
    try:
        classes = find_classes(root)
        for split in SPLITS:
            scan_split(root, split, classes)
    except ImageDataError as e:
        raise ConfigError(f"field {field!r}: {e}") from None


def main(argv: list[str] | None = None, prog: str = "python -m foundation_tasks.vision_common.folder") -> int:
    p = argparse.ArgumentParser(prog=prog,
                                description="Check an ImageNet-layout folder: open every image once.")
    p.add_argument("command", choices=["verify"])
    p.add_argument("root")
    p.add_argument("--min-size", type=int, default=1)
    a = p.parse_args(argv)
    modes: Counter = Counter()
    try:
        n, errors = verify_images(a.root, a.min_size, modes)
    except ImageDataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for e in errors:
        print(e, file=sys.stderr)
    converted = ", ".join(f"{m} {k}" for m, k in sorted(modes.items()) if m != "RGB")
    print(f"{n} images, {len(errors)} bad" + (f"; converted to RGB from: {converted}" if converted else ""))
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
