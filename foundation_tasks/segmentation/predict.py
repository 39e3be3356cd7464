"""``foundation predict`` for semantic segmentation: an image -> a label PNG in the data
set's palette and an overlay PNG, named after the input, under ``out``.

The image goes through what evaluation does (mmseg's ``Resize`` to the training scale
keeping the aspect ratio, ImageNet normalisation), whole-image or sliding-window
inference as the config says, and the logits are resized back to the image. The label
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

from foundation.engine.predict import InputError, Predictor, image_side
from foundation_tasks.vision_common.images import ImageDataError, load_image

DEFAULT_OUT = "predictions"
OVERLAY_ALPHA = 0.5  # weight of the class colours over the image


class SegmentationPredictor(Predictor):
    input_kind = "image"
    default_batch_size = 4  # images differ in size: each goes through the model alone

    def __init__(self, *args):
        super().__init__(*args)
        m = self.meta
        self.classes, self.offset = list(m["classes"]), int(m["label_offset"])
        for key in ("scale", "crop", "stride"):
            image_side(key, m[key])
        self.colors = np.asarray(m["palette"], np.uint8)
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
            image = np.asarray(load_image(source))
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
            logits = F.interpolate(logits.float(), size=item["image"].shape[:2], mode="bilinear", align_corners=False)
            labels = logits.argmax(1)[0].cpu().numpy()
            records.append(self._write(item, labels, folder))
        return records

    def _write(self, item: dict, labels: np.ndarray, folder: Path) -> dict:
        stem, n = item["source"].stem, 1
        # a/x.jpg and b/x.jpg in one run; an input named like an output
        while {(folder / f"{stem}_{kind}.png").resolve() for kind in ("mask", "overlay")} & self.written:
            n += 1
            stem = f"{item['source'].stem}_{n}"
        mask_path, overlay_path = folder / f"{stem}_mask.png", folder / f"{stem}_overlay.png"
        self.written |= {mask_path.resolve(), overlay_path.resolve()}
        mask = Image.fromarray((labels + self.offset).astype(np.uint8)).convert("P")
        palette = np.zeros((256, 3), np.uint8)
        palette[self.offset:self.offset + len(self.colors)] = self.colors
        mask.putpalette(palette.flatten().tolist())
        mask.save(mask_path)
        blend = (1 - OVERLAY_ALPHA) * item["image"] + OVERLAY_ALPHA * self.colors[labels]
        Image.fromarray(blend.round().astype(np.uint8)).save(overlay_path)
        counts = np.bincount(labels.ravel(), minlength=len(self.classes)) / labels.size
        areas = [{"label": self.classes[i], "fraction": round(float(counts[i]), 4)} for i in np.argsort(-counts)
                 if counts[i] > 0]
        return {"mask": str(mask_path), "overlay": str(overlay_path), "areas": areas}

    def describe(self, record) -> str:
        areas = ", ".join(f"{a['label']} {100 * a['fraction']:.0f}%" for a in record["areas"][:4])
        return f"{record['mask']} and {record['overlay']} ({areas})"
