"""``foundation predict`` for image classification: image files -> the top classes with
their softmax scores, with the evaluation transform of training (timm's resize + centre
crop + normalisation) rebuilt from the model file."""
from __future__ import annotations

import torch
from timm.data import create_transform

from foundation.engine.predict import MAX_IMAGE_PIXELS, InputError, Predictor, image_side
from foundation_tasks.vision_common.images import ImageDataError, load_image


class ClassificationPredictor(Predictor):
    input_kind = "image"
    default_batch_size = 32

    def __init__(self, *args):
        super().__init__(*args)
        m = self.meta
        self.classes = list(m["classes"])
        size = image_side("img_size", m["img_size"])
        image_side("img_size / crop_pct", size / m["crop_pct"])  # the resize before the centre crop
        self.transform = create_transform(size, is_training=False, interpolation=m["interpolation"],
                                          crop_pct=m["crop_pct"], mean=tuple(m["mean"]), std=tuple(m["std"]))

    def load(self, source, **_) -> torch.Tensor:
        try:
            return self.transform(load_image(source, max_pixels=MAX_IMAGE_PIXELS))
        except ImageDataError as e:
            raise InputError(str(e)) from None

    def predict(self, items, top_k: int = 5, **_) -> list[dict]:
        logits = self.head.logits(self.backbone, torch.stack(items).to(self.device))
        scores, index = logits.float().softmax(-1).topk(min(top_k, len(self.classes)), dim=-1)
        return [{"classes": [{"label": self.classes[i], "score": s} for i, s in zip(idx.tolist(), sc.tolist())]}
                for idx, sc in zip(index, scores)]

    def describe(self, record) -> str:
        return ", ".join(f"{x['label']} {x['score']:.3f}" for x in record["classes"])
