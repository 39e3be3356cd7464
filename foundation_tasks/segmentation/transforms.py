"""``LoadCheckedImageFromFile`` and ``LoadCheckedAnnotations``: mmseg's loaders with
checks that name the file.

mmcv's ``LoadImageFromFile`` decodes with OpenCV, which returns nothing for a truncated
JPEG or PNG (the pipeline then fails without the file's name) and drops the alpha of a
transparent image. ``LoadCheckedImageFromFile`` decodes with PIL through
``foundation_tasks.vision_common.images`` (every mode to RGB: 16-bit scaled down, alpha over white;
a truncated file an error naming it) and hands mmseg the BGR array it expects.

mmseg reads an annotation PNG, squeezes it and casts it to uint8 without checks: a
missing file fails deep in the file backend, an RGB (colour) mask or a 16-bit map with
values above 255 is silently mangled, an annotation of another size than its image
fails later in a crop with a shape error, and values beyond the class range become
class ids the head does not have. This transform raises a clear error naming the file
for each of these, then runs ``LoadAnnotations`` unchanged. Use it in place of
``LoadAnnotations`` in any mmseg pipeline (``num_classes`` added)::

    dict(type='LoadCheckedAnnotations', num_classes=150, reduce_zero_label=True)

Raw values allowed: 0 ("other", ignored) and 1..num_classes with ``reduce_zero_label``
(ADE20k), 0..num_classes-1 without; 255 (ignore) always.
"""
from __future__ import annotations

from pathlib import Path

import io

import numpy as np
from mmcv import imfrombytes
from mmcv.transforms import BaseTransform
from mmengine import fileio
from mmseg.datasets.transforms import LoadAnnotations
from mmseg.registry import TRANSFORMS

from foundation_tasks.vision_common.images import ImageDataError, open_rgb


class AnnotationError(ValueError):
    """An annotation file does not fit its image or the class range; the message names it."""


@TRANSFORMS.register_module()
class LoadCheckedImageFromFile(BaseTransform):
    """``LoadImageFromFile`` (``img``, BGR uint8; ``img_shape``, ``ori_shape``) decoded by PIL,
    with every image mode converted to RGB first and a bad file named."""

    def __init__(self, backend_args=None):
        self.backend_args = backend_args

    def transform(self, results: dict) -> dict:
        path = results["img_path"]
        try:
            data = fileio.get(path, backend_args=self.backend_args)
        except FileNotFoundError:
            raise ImageDataError(f"{path}: image not found") from None
        rgb = open_rgb(io.BytesIO(data), ImageDataError, name=path)
        img = np.ascontiguousarray(np.asarray(rgb)[..., ::-1])  # mmseg's images are BGR, as OpenCV reads them
        results.update(img=img, img_shape=img.shape[:2], ori_shape=img.shape[:2])
        return results


def check_label_map(raw: np.ndarray, num_classes: int, reduce_zero_label: bool, path: str,
                    image_shape: tuple[int, int] | None = None, image_path: str | None = None) -> None:
    """Raise ``AnnotationError`` naming ``path`` if ``raw`` (the PNG as stored) is not a
    single-channel label map of the image's size with values in the class range."""
    if raw.ndim == 3 and raw.shape[2] == 1:
        raw = raw[..., 0]
    if raw.ndim != 2:
        raise AnnotationError(f"{path}: an annotation must be a single-channel label map (one class id per "
                              f"pixel), got an array of shape {raw.shape} (a colour-coded mask?)")
    if image_shape is not None and tuple(raw.shape) != tuple(image_shape):
        raise AnnotationError(f"{path}: annotation is {raw.shape[1]}x{raw.shape[0]} (WxH) but its image "
                              f"{image_path or ''} is {image_shape[1]}x{image_shape[0]}")
    top = num_classes if reduce_zero_label else num_classes - 1
    values = np.unique(raw)
    bad = values[(values > top) & (values != 255)]
    if bad.size:
        rule = (f"0 = other (ignored), 1..{num_classes} the classes" if reduce_zero_label
                else f"0..{num_classes - 1} the classes")
        raise AnnotationError(f"{path}: label values {bad[:10].tolist()} are outside the class range "
                              f"({rule}, 255 = ignore); num_classes={num_classes}")


@TRANSFORMS.register_module()
class LoadCheckedAnnotations(LoadAnnotations):
    def __init__(self, num_classes: int, reduce_zero_label: bool | None = None, backend_args=None,
                 imdecode_backend: str = "pillow"):
        super().__init__(reduce_zero_label=reduce_zero_label, backend_args=backend_args,
                         imdecode_backend=imdecode_backend)
        if num_classes < 1:
            raise ValueError(f"LoadCheckedAnnotations: num_classes must be >= 1, got {num_classes}")
        self.num_classes = num_classes

    def transform(self, results: dict) -> dict:
        path = results["seg_map_path"]
        image = results.get("img_path")
        if not fileio.exists(path, backend_args=self.backend_args):
            raise FileNotFoundError(f"annotation not found: {path}" + (f" (for image {image})" if image else ""))
        try:
            raw = imfrombytes(fileio.get(path, backend_args=self.backend_args), flag="unchanged",
                              backend=self.imdecode_backend)
        except (OSError, ValueError, SyntaxError) as e:  # a truncated or damaged PNG
            raise AnnotationError(f"{path}: cannot read the annotation ({e})") from None
        if raw is None:  # OpenCV's answer to a file it cannot decode
            raise AnnotationError(f"{path}: cannot read the annotation (not a decodable image)")
        reduce = self.reduce_zero_label if self.reduce_zero_label is not None else results.get("reduce_zero_label", False)
        shape = results.get("ori_shape")  # the image as loaded, before any resize
        check_label_map(np.asarray(raw), self.num_classes, bool(reduce), str(path), shape, image)
        return super().transform(results)

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + f", num_classes={self.num_classes})"


def missing_annotations(img_dir: Path, ann_dir: Path, img_suffix: str = ".jpg", seg_suffix: str = ".png") -> list[Path]:
    """Annotation files that the images under ``img_dir`` need and ``ann_dir`` lacks
    (mmseg pairs ``a/b.jpg`` with ``a/b.png``)."""
    missing = []
    for image in sorted(img_dir.rglob(f"*{img_suffix}")):
        rel = image.relative_to(img_dir)
        ann = ann_dir / rel.parent / (image.name[: -len(img_suffix)] + seg_suffix)
        if not ann.is_file():
            missing.append(ann)
    return missing
