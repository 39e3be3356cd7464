"""``foundation predict`` for semantic segmentation: an image -> a label PNG in the data
set's palette and an overlay PNG, named after the input, under ``out``.

The image goes through what evaluation does (mmseg's ``Resize`` to the training scale
keeping the aspect ratio, ImageNet normalisation), whole-image or sliding-window
inference as the config says, and the logits are resized back to the image (bilinear, a
band of rows at a time: memory beyond the image itself does not grow with the photo; an
image above ``MAX_IMAGE_PIXELS`` is refused from its header). The label
PNG holds the annotation's own values (ADE20k: class index + 1, 0 = unlabelled), as a
palette image: it opens as a colour picture and reads back as class ids. An ``out`` inside
an input folder is refused (its masks would be read, or overwrite files read, as inputs),
and an output never takes an input's name.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from foundation.engine.predict import MAX_IMAGE_PIXELS, InputError, Predictor, image_side
from foundation_tasks.vision_common.images import ImageDataError, load_image

DEFAULT_OUT = "predictions"
OVERLAY_ALPHA = 0.5  # weight of the class colours over the image
BAND = 2**24  # logits resized to the image at most this many at a time (64 MB of float32)


class SegmentationPredictor(Predictor):
    input_kind = "image"
    default_batch_size = 1  # images differ in size, each goes through the model alone: one image in memory

    def __init__(self, *args):
        super().__init__(*args)
        m = self.meta
        self.classes, self.offset = list(m["classes"]), int(m["label_offset"])
        for key in ("scale", "crop", "stride"):
            image_side(key, m[key])
        self.colors = np.asarray(m["palette"], np.uint8)
        if len(self.classes) + self.offset > 256:
            raise ValueError(f"{len(self.classes)} classes from label {self.offset} do not fit a label PNG (256 values)")
        self.written: set[Path] = set()  # inputs and outputs of this call: same-named inputs get _2, _3 ...
        self.mean = torch.tensor(m["mean"]).view(3, 1, 1)
        self.std = torch.tensor(m["std"]).view(3, 1, 1)

    def run(self, inputs, *args, out: str | Path | None = None, **kwargs):
        folder = Path(out or DEFAULT_OUT)
        inside = [x for x in inputs if Path(x).is_dir() and folder.resolve().is_relative_to(Path(x).resolve())]
        if inside:  # its masks would be read as inputs by the next call, or overwrite files it reads
            raise InputError(f"--out {folder} is inside the input folder {inside[0]}; write the masks elsewhere")
        if folder.exists() and not folder.is_dir():
            raise InputError(f"--out {folder} is a file; segmentation writes a mask and an overlay per image "
                             "into a folder")
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InputError(f"--out {folder}: {e.strerror or e}") from None
        if not os.access(folder, os.W_OK | os.X_OK):
            raise InputError(f"--out {folder}: not writable")
        yield from super().run(inputs, *args, out=folder, **kwargs)

    def expand(self, inputs):
        items = super().expand(inputs)
        # names are unique within one call (a later call overwrites its outputs), and an
        # input's name is taken from the start: no output overwrites an input
        self.written = {Path(x).resolve() for x in items}
        return items

    def load(self, source, **_) -> dict:
        from mmcv import imrescale

        try:
            image = np.asarray(load_image(source, max_pixels=MAX_IMAGE_PIXELS))
        except ImageDataError as e:
            raise InputError(str(e)) from None
        s = self.meta["scale"]
        resized = imrescale(image, (4 * s, s), interpolation="bilinear", backend="cv2")  # mmseg's Resize
        x = (torch.from_numpy(np.ascontiguousarray(resized)).permute(2, 0, 1).float() - self.mean) / self.std
        return {"source": Path(source), "image": image, "x": x}

    def predict(self, items, out: str | Path | None = None, **_) -> list[dict]:
        m = self.meta
        folder = Path(out or DEFAULT_OUT)
        records = []
        for item in items:
            logits = self.head.predict_logits(self.backbone, item["x"][None].to(self.device), m["mode"], m["crop"],
                                              m["stride"])
            records.append(self._write(item, *self._paint(logits[0].float(), item["image"]), folder))
        return records

    def _paint(self, logits: torch.Tensor, image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The label map (the annotation's values) and the overlay of ``image``: ``logits``
        (C, h, w) resized to the image as ``F.interpolate(mode="bilinear")`` does, then argmax,
        a band of rows at a time (a 48 MP photo at full size would be C x 192 MB of logits)."""
        H, W = image.shape[:2]
        # the sampling points of a bilinear resize with align_corners=False, in grid_sample's -1..1
        gx = (2 * torch.arange(W, dtype=torch.float32, device=logits.device) + 1) / W - 1
        gy = (2 * torch.arange(H, dtype=torch.float32, device=logits.device) + 1) / H - 1
        mask, overlay = np.empty((H, W), np.uint8), np.empty_like(image)
        rows = max(1, BAND // (logits.shape[0] * W))
        for r in range(0, H, rows):
            y = gy[r:r + rows]
            grid = torch.stack([gx.expand(len(y), W), y[:, None].expand(len(y), W)], -1)[None]
            band = F.grid_sample(logits[None], grid, mode="bilinear", padding_mode="border", align_corners=False)
            labels = band.argmax(1)[0].cpu().numpy()
            mask[r:r + rows] = labels + self.offset
            overlay[r:r + rows] = ((1 - OVERLAY_ALPHA) * image[r:r + rows] + OVERLAY_ALPHA * self.colors[labels]).round()
        return mask, overlay

    def _write(self, item: dict, mask: np.ndarray, overlay: np.ndarray, folder: Path) -> dict:
        stem, n = item["source"].stem, 1
        # a/x.jpg and b/x.jpg in one run; an input named like an output
        while {(folder / f"{stem}_{kind}.png").resolve() for kind in ("mask", "overlay")} & self.written:
            n += 1
            stem = f"{item['source'].stem}_{n}"
        mask_path, overlay_path = folder / f"{stem}_mask.png", folder / f"{stem}_overlay.png"
        self.written |= {mask_path.resolve(), overlay_path.resolve()}
        image = Image.fromarray(mask, "L").convert("P")
        palette = np.zeros((256, 3), np.uint8)
        palette[self.offset:self.offset + len(self.colors)] = self.colors
        image.putpalette(palette.flatten().tolist())
        image.save(mask_path)
        Image.fromarray(overlay).save(overlay_path)
        counts = np.bincount(mask.ravel(), minlength=256)[self.offset:self.offset + len(self.classes)] / mask.size
        areas = [{"label": self.classes[i], "fraction": round(float(counts[i]), 4)} for i in np.argsort(-counts)
                 if counts[i] > 0]
        return {"mask": str(mask_path), "overlay": str(overlay_path), "areas": areas}

    def describe(self, record) -> str:
        areas = ", ".join(f"{a['label']} {100 * a['fraction']:.0f}%" for a in record["areas"][:4])
        return f"{record['mask']} and {record['overlay']} ({areas})"
