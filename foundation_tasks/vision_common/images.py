"""Image files to the model's RGB input, for every mode PIL opens, with errors that name the file.

PIL's own ``convert("RGB")`` is right for most modes (L, 1-bit, palette P, CMYK, YCbCr)
but not for two kinds of file:

* 16-bit (and 32-bit integer) greyscale, modes ``I;16*`` and ``I``: PIL clips the values
  to 0..255, so a 16-bit image, whose values run to 65535, comes out nearly all white.
  Here they are scaled from 0..65535 down to 0..255 (value / 257, so 65535 -> 255).
* images with transparency (LA, RGBA, PA, a palette or greyscale with a transparent
  colour): PIL drops the alpha, showing whatever colour the transparent pixels happen to
  hold (often black). Here they are composited over white, as a viewer shows them.

``open_rgb`` decodes the whole file at once, so a truncated JPEG or PNG fails there, with
the file's name, rather than silently (OpenCV) or later without a name. It applies the EXIF
orientation as every viewer does (a phone photo stored sideways with orientation 6 reads
upright), for training and prediction alike.
"""
from __future__ import annotations

import warnings
from collections import Counter
from pathlib import Path
from typing import BinaryIO, Callable

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

WHITE = (255, 255, 255, 255)


def has_alpha(image: Image.Image) -> bool:
    return image.mode in ("RGBA", "LA", "PA", "RGBa", "La") or (
        image.mode in ("P", "L", "RGB") and "transparency" in image.info)


def to_rgb(image: Image.Image) -> Image.Image:
    """The RGB image of ``image``, whatever its mode (see the module docstring)."""
    if image.mode == "I" or image.mode.startswith("I;16"):
        values = np.asarray(image).astype(np.float64)
        grey = np.clip(np.rint(values / 257.0), 0, 255).astype(np.uint8)
        return Image.fromarray(grey, "L").convert("RGB")
    if has_alpha(image):
        return Image.alpha_composite(Image.new("RGBA", image.size, WHITE), image.convert("RGBA")).convert("RGB")
    return image.convert("RGB")  # a copy even for RGB: the caller may close the file's image


def open_rgb(source: str | Path | BinaryIO, error: type[Exception] = ValueError, modes: Counter | None = None,
             name: str | Path | None = None, max_pixels: int | None = None) -> Image.Image:
    """The RGB image in the file ``source`` (a path, or an open binary file called
    ``name``); ``error`` naming the file when it is missing, not an image, truncated or too
    large to decode (``max_pixels``: more pixels than that, refused from the header before
    anything is decoded). ``modes`` counts the modes met."""
    name = source if name is None else name
    try:
        with warnings.catch_warnings():
            if max_pixels is not None:  # a stricter limit than PIL's bomb warning, which would print two lines first
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            opened = Image.open(source)
        with opened as im:
            w, h = im.size
            if max_pixels is None or w * h <= max_pixels:
                im.load()  # decode now: a truncated file fails here
                if modes is not None:
                    modes[im.mode] += 1
                ImageOps.exif_transpose(im, in_place=True)  # the image as shown, not as stored
                return to_rgb(im)
    except FileNotFoundError:
        raise error(f"{name}: image not found") from None
    except UnidentifiedImageError:
        raise error(f"{name}: not an image file (or a format PIL cannot read)") from None
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise error(f"{name}: cannot read the image ({e})") from None
    raise error(f"{name}: the image is {w}x{h} pixels ({w * h / 1e6:.0f} megapixels), more than the "
                f"{max_pixels / 1e6:.0f} megapixels read at most; downscale it first")


class ImageDataError(ValueError):
    """An image file or folder cannot be used; the message names it."""


def load_image(path: str | Path, min_size: int = 1, modes: Counter | None = None,
               max_pixels: int | None = None) -> Image.Image:
    """The RGB image at ``path`` (any PIL mode converted as ``vision_common.images.to_rgb``
    says: 16-bit scaled down, alpha over white); ``ImageDataError`` naming the file if it
    cannot be read (missing, unreadable, not an image, truncated), is smaller than
    ``min_size`` or has more than ``max_pixels``. ``modes`` counts the file modes met."""
    image = open_rgb(path, ImageDataError, modes, max_pixels=max_pixels)
    if min(image.size) < min_size:
        raise ImageDataError(f"{path}: the image is {image.size[0]}x{image.size[1]} pixels, smaller than "
                             f"min_image_size={min_size}")
    return image


class DecodedImages:
    """Decoded images kept in memory by path after their first read, when ``enabled`` (the
    tasks' ``cache_images: true``); off, ``get`` is ``load()`` itself.

    For small data sets read for many epochs on CPU, such as the demo's 32- and 48-pixel
    scenes (measured on VQA: ~5 % of a one-core step, 300 steps 41.7 -> 39.6 s). A plain dict,
    not a bounded cache: a set too large to keep whole gains nothing from a bounded one under
    random access. Transforms still run on every item, so augmentation is unchanged; each
    DataLoader worker keeps its own copy."""

    def __init__(self, enabled: bool = False):
        self.images: dict[str, Image.Image] | None = {} if enabled else None

    def get(self, path: str | Path, load: Callable[[], Image.Image]) -> Image.Image:
        if self.images is None:
            return load()
        key = str(path)
        image = self.images.get(key)
        if image is None:
            image = self.images[key] = load()
        return image.copy()  # a transform that edits its input in place cannot change the kept image
