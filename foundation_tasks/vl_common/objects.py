"""Object annotations in COCO's instances layout, turned into one label per image patch.

    coco/annotations/instances_{split}.json
        {"images": [{"id": 9, "file_name": ..., "width": 640, "height": 480}, ...],
         "annotations": [{"image_id": 9, "category_id": 18, "segmentation": [[x1, y1, x2, y2, ...]],
                          "iscrowd": 0, ...}, ...],
         "categories": [{"id": 18, "name": "dog", "supercategory": "animal"}, ...]}

VQA v2's images are COCO's, so these are the real objects of the VQA images. A patch's label
is the category of the object that covers the largest part of it, if that is at least
``min_cover`` of the patch, else background (the last label), like the region labels of a
detector or a coarse segmentation mask. Polygons are filled in the coordinates of the image
the model sees (the evaluation transform: the shorter side resized to ``img_size``, then the
centre crop), supersampled 4x per pixel. Crowd regions (``iscrowd: 1``, RLE masks of many
objects) are left out, as detectors train without them. Filled with PIL's polygon fill
rather than pycocotools, which the project does not otherwise need and which builds from C
sources on some platforms.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from foundation_tasks.vl_common.images import DataError
from foundation_tasks.vl_common.official_json import read_json

SUPERSAMPLE = 4


@dataclass
class Objects:
    """The object categories (names, in the file's order: labels 0..K-1, background K) and
    each image's objects as (label, polygons in pixels of the original image)."""

    categories: list[str]
    by_image: dict[int, list[tuple[int, list[list[float]]]]]
    path: str

    def labels_of(self, image_id: int, width: int, height: int, img_size: int, patch_size: int,
                  min_cover: float = 0.25) -> torch.Tensor:
        """The (img_size // patch_size)^2 patch labels of an image, row-major."""
        if image_id not in self.by_image:
            raise DataError(f"{self.path}: image {image_id} is not among its images")
        return patch_labels(self.by_image[image_id], len(self.categories), width, height, img_size, patch_size,
                            min_cover)


def patch_labels(objects: list[tuple[int, list[list[float]]]], background: int, width: int, height: int,
                 img_size: int, patch_size: int, min_cover: float = 0.25) -> torch.Tensor:
    grid = img_size // patch_size
    scale = img_size / min(width, height)  # open_clip's evaluation transform: shorter side, then centre crop
    dx, dy = (width * scale - img_size) / 2, (height * scale - img_size) / 2
    big = img_size * SUPERSAMPLE
    labels = np.full(grid * grid, background, dtype=np.int64)
    best = np.zeros(grid * grid)
    for label, polygons in objects:
        mask = Image.new("L", (big, big), 0)
        draw = ImageDraw.Draw(mask)
        for poly in polygons:
            points = [((x * scale - dx) * SUPERSAMPLE, (y * scale - dy) * SUPERSAMPLE)
                      for x, y in zip(poly[0::2], poly[1::2])]
            draw.polygon(points, fill=255)
        cover = np.asarray(mask, dtype=np.float64) / 255
        cover = cover.reshape(grid, big // grid, grid, big // grid).mean((1, 3)).reshape(-1)
        wins = (cover > best) & (cover >= min_cover)
        labels[wins], best[wins] = label, cover[wins]
    return torch.from_numpy(labels)


def read_objects(path: str | Path) -> Objects:
    """The instances file's categories and objects (polygons; crowd regions left out). Errors
    name the file and the record."""
    path = Path(path)
    categories = read_json(path, "categories")
    index: dict[int, int] = {}
    names = []
    for i, c in enumerate(categories):
        if not isinstance(c, dict) or not isinstance(c.get("id"), int) or not isinstance(c.get("name"), str):
            raise DataError(f"{path}: categories[{i}]: expected {{\"id\": int, \"name\": str, ...}}, got {c!r}")
        index[c["id"]] = len(names)
        names.append(c["name"])
    by_image: dict[int, list] = {}
    for i, im in enumerate(read_json(path, "images")):
        if not isinstance(im, dict) or not isinstance(im.get("id"), int):
            raise DataError(f"{path}: images[{i}]: expected an object with an integer 'id', got {im!r}")
        by_image[im["id"]] = []
    for i, a in enumerate(read_json(path, "annotations")):
        where = f"{path}: annotations[{i}]"
        if not isinstance(a, dict) or a.get("image_id") not in by_image:
            raise DataError(f"{where}: 'image_id' must name one of the file's images (got {a!r:.200})")
        if a.get("iscrowd"):
            continue
        if a.get("category_id") not in index:
            raise DataError(f"{where}: 'category_id' {a.get('category_id')!r} is not among the file's categories")
        polygons = a.get("segmentation")
        if (not isinstance(polygons, list) or not polygons
                or not all(isinstance(p, list) and len(p) >= 6 and len(p) % 2 == 0 for p in polygons)):
            raise DataError(f"{where}: 'segmentation' must be a list of polygons [x1, y1, x2, y2, ...] of >= 3 points")
        by_image[a["image_id"]].append((index[a["category_id"]], polygons))
    return Objects(names, by_image, str(path))
