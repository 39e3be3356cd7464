"""timm's ImageNet transforms for the image-folder tasks, and the statistics they normalise with.

Training: RandomResizedCrop + flip + RandAugment + normalise + random erasing (fine-tuning,
``build_transform``) or BEiT's pretraining augmentation (``pretrain_transform``);
evaluation: resize + centre crop + normalise.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence

import numpy as np
import torch
from PIL import Image, ImageOps
from timm.data import auto_augment
from timm.data import create_transform
from timm.data.transforms import MaybeToTensor, RandomResizedCropAndInterpolation
from torchvision import transforms as T
from timm.data.constants import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

MEAN, STD = IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD


@dataclass
class TransformConfig:
    """timm ``create_transform`` settings (their names where they have one)."""

    img_size: int = 224
    auto_augment: Optional[str] = "rand-m9-mstd0.5-inc1"  # RandAugment 9/0.5 (BEiT, DeiT); null = off
    # only when auto_augment is off (timm's rule); 0 leaves the op out (timm would add a
    # ColorJitter(0, 0, 0) that changes nothing and costs ~40 us an image)
    color_jitter: float = 0.4
    re_prob: float = 0.25  # random erasing
    re_mode: str = "pixel"
    re_count: int = 1
    scale: List[float] = field(default_factory=lambda: [0.08, 1.0])  # RandomResizedCrop area range
    hflip: float = 0.5
    interpolation: str = "bicubic"
    crop_pct: float = 0.875  # eval: resize to img_size / crop_pct, then centre-crop


def _posterize(img: Image.Image, bits_to_keep: int, **_) -> Image.Image:
    """timm's posterize, for Pillow >= 12, which refuses to keep 0 bits: keeping 0 bits is
    a black image, as older Pillow gave (RandAugment's ``PosterizeIncreasing`` at high
    magnitude asks for 0 bits)."""
    if bits_to_keep >= 8:
        return img
    if bits_to_keep <= 0:
        return Image.new(img.mode, img.size)
    return ImageOps.posterize(img, bits_to_keep)


def _fix_posterize(transform: Callable) -> Callable:
    for t in getattr(transform, "transforms", [transform]):
        for op in getattr(t, "ops", ()):
            if getattr(op, "aug_fn", None) is auto_augment.posterize:
                op.aug_fn = _posterize
    return transform


class ToNormalizedTensor:
    """timm's ``MaybeToTensor`` + torchvision's ``Normalize`` as one op, bit for bit: an RGB
    image's bytes as float32 / 255, minus the mean, over the std, in their order and dtype.
    The pair costs ~220 us on a 32-px image, mostly the per-call checks and tensor building of
    two generic ops; this ~90 (a 64-image batch of the tiny vision recipe: 34 -> 29 ms). Anything
    but an 8-bit RGB PIL image goes through the pair unchanged."""

    def __init__(self, to_tensor: Callable, normalize: T.Normalize):
        self.to_tensor, self.normalize = to_tensor, normalize
        self.mean = torch.as_tensor(normalize.mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.as_tensor(normalize.std, dtype=torch.float32).view(-1, 1, 1)

    def __call__(self, pic):
        if not isinstance(pic, Image.Image) or pic.mode != "RGB":
            return self.normalize(self.to_tensor(pic))
        return self.normalized(self.chw_bytes(pic))

    @staticmethod
    def chw_bytes(pic: Image.Image) -> torch.Tensor:
        """An RGB image's bytes as a uint8 CHW tensor (a view of one HWC copy)."""
        return torch.from_numpy(np.array(pic, np.uint8)).permute(2, 0, 1)

    def normalized(self, chw: torch.Tensor) -> torch.Tensor:
        """uint8 CHW -> contiguous float32 in one copy, then the pair's arithmetic in place."""
        x = chw.to(torch.float32, memory_format=torch.contiguous_format).div_(255)
        return x.sub_(self.mean).div_(self.std)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(mean={self.normalize.mean}, std={self.normalize.std})"


def _fuse_to_tensor(transform: Callable) -> Callable:
    """``transform`` (a timm ``Compose``) with its MaybeToTensor + Normalize pair fused."""
    ops = getattr(transform, "transforms", None)
    if ops is None:
        return transform
    for i in range(len(ops) - 1):
        if type(ops[i]) is MaybeToTensor and type(ops[i + 1]) is T.Normalize and not ops[i + 1].inplace:
            ops[i:i + 2] = [ToNormalizedTensor(ops[i], ops[i + 1])]
            break
    return transform


class WholeImageCrop:
    """timm's RandomResizedCrop at area scale (1, 1) with the ops after it drawing nothing from
    Python's RNG: on a square image already of the output size the crop is the whole image
    whatever its draws (an aspect ratio off 1 cannot fit, and the fallback is the whole image)
    and the resize returns a copy, so this returns the copy without the ten attempts' draws
    (~100 us of a 32-px image's ~300). The draws it skips are Python's global RNG's, reseeded
    for every item (``foundation.engine.data.seeded``) and read by nothing after it; any other
    image goes through the crop."""

    def __init__(self, crop: RandomResizedCropAndInterpolation):
        self.crop = crop

    def passes_whole(self, img) -> bool:
        """Whether ``img`` is a square image already of the output size (returned whole)."""
        return isinstance(img, Image.Image) and img.size == self.crop.size[::-1] and img.width == img.height

    def __call__(self, img):
        return img.copy() if self.passes_whole(img) else self.crop(img)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.crop!r})"


# ops after the crop that draw nothing from Python's RNG (the flip draws torch's)
_NO_PYTHON_DRAWS = (T.RandomHorizontalFlip, MaybeToTensor, T.Normalize, ToNormalizedTensor)


def _whole_image_crop(transform: Callable) -> Callable:
    """``transform`` with a RandomResizedCrop of area scale (1, 1) wrapped in ``WholeImageCrop``
    where that changes no output: nothing after it reads Python's RNG."""
    ops = getattr(transform, "transforms", None)
    if not ops or type(ops[0]) is not RandomResizedCropAndInterpolation:
        return transform
    crop = ops[0]
    # the aspect ratio range must hold 1: otherwise the fallback crops a square image narrower
    if (tuple(crop.scale) == (1.0, 1.0) and crop.ratio[0] <= 1.0 <= crop.ratio[1]
            and not isinstance(crop.interpolation, (tuple, list))
            and all(type(op) in _NO_PYTHON_DRAWS for op in ops[1:])):
        ops[0] = WholeImageCrop(crop)
    return transform


class FlipOfBytes:
    """A transform of a whole-image crop, an optional horizontal flip and the normalising
    ``ToNormalizedTensor``, split at the flip: on an image already square at the output size its
    items are ``flip(chw(image))`` bit for bit, the flip drawn as torchvision's
    ``RandomHorizontalFlip`` draws it (``torch.rand(1) < p``) and applied to the image's bytes
    before they are normalised, each pixel as before. ``chw(image)`` depends on the image alone,
    so a data set that keeps its decoded images (``cache_images``) keeps those bytes instead, the
    same memory, and pays per item only the flip and the arithmetic, as the plain loop of
    ``benchmarks/reference_vision.py`` flips a stored batch: the per-image PIL flip and byte
    conversion are ~60 % of the tiny vision recipe's data time."""

    def __init__(self, crop: WholeImageCrop, flip_p: Optional[float], to_tensor: ToNormalizedTensor):
        self.crop, self.flip_p, self.to_tensor = crop, flip_p, to_tensor

    def applies(self, img) -> bool:
        """Whether ``img``'s items are ``flip(chw(img))``: an RGB image the crop passes whole."""
        return self.crop.passes_whole(img) and img.mode == "RGB"

    def chw(self, img: Image.Image) -> torch.Tensor:
        return self.to_tensor.chw_bytes(img).contiguous()

    def flip(self, chw: torch.Tensor) -> torch.Tensor:
        """The item: ``chw`` mirrored where the flip's draw says so, normalised (a new tensor)."""
        if self.flip_p is not None and torch.rand(1) < self.flip_p:
            chw = chw.flip(-1)
        return self.to_tensor.normalized(chw)


def flip_of_bytes(transform: Callable) -> Optional[FlipOfBytes]:
    """``transform``'s ``FlipOfBytes`` when it is exactly [WholeImageCrop, (RandomHorizontalFlip),
    ToNormalizedTensor]; None for any other."""
    ops = list(getattr(transform, "transforms", None) or ())
    if len(ops) not in (2, 3) or type(ops[0]) is not WholeImageCrop or type(ops[-1]) is not ToNormalizedTensor:
        return None
    if len(ops) == 3 and type(ops[1]) is not T.RandomHorizontalFlip:
        return None
    return FlipOfBytes(ops[0], ops[1].p if len(ops) == 3 else None, ops[-1])


def build_transform(cfg: TransformConfig, train: bool) -> Callable:
    """timm's ImageNet transform: RandomResizedCrop + flip + RandAugment + normalise + random
    erasing for training; resize + centre crop + normalise for evaluation."""
    if train:
        return _whole_image_crop(_fuse_to_tensor(_fix_posterize(create_transform(
            cfg.img_size, is_training=True, auto_augment=cfg.auto_augment, color_jitter=cfg.color_jitter or None,
            re_prob=cfg.re_prob, re_mode=cfg.re_mode, re_count=cfg.re_count, scale=tuple(cfg.scale),
            hflip=cfg.hflip, interpolation=cfg.interpolation, mean=MEAN, std=STD))))
    return _fuse_to_tensor(create_transform(cfg.img_size, is_training=False, interpolation=cfg.interpolation,
                                            crop_pct=cfg.crop_pct, mean=MEAN, std=STD))


def pretrain_transform(img_size: int, scale: Sequence[float] = (0.08, 1.0), color_jitter: float = 0.4,
                       hflip: float = 0.5, interpolation: str = "bicubic") -> Callable:
    """BEiT's pretraining augmentation (Magneto Table 13): random resized crop, colour
    jitter 0.4, horizontal flip; no RandAugment, no erasing."""
    return _whole_image_crop(_fuse_to_tensor(create_transform(
        img_size, is_training=True, auto_augment=None, color_jitter=color_jitter or None, re_prob=0.0,
        scale=tuple(scale), hflip=hflip, interpolation=interpolation, mean=MEAN, std=STD)))


def uncropped_eval_transform(img_size: int, interpolation: str = "bicubic") -> Callable:
    """The evaluation transform of the pretraining tasks and probes: resize, no crop margin."""
    return build_transform(TransformConfig(img_size=img_size, interpolation=interpolation, crop_pct=1.0), train=False)


def unnormalize(images: torch.Tensor) -> torch.Tensor:
    """ImageNet-normalised images -> [0, 1]."""
    mean = torch.tensor(MEAN, device=images.device, dtype=images.dtype)[:, None, None]
    std = torch.tensor(STD, device=images.device, dtype=images.dtype)[:, None, None]
    return images * std + mean
