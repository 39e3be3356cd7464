"""What the VQA and NLVR2 predictors share: the text tokenizer and the evaluation image
transform, rebuilt from what the model file carries (``VLTask.export_meta``)."""
from __future__ import annotations

import torch

from foundation.engine.predict import MAX_IMAGE_PIXELS, InputError, Predictor, image_side
from foundation_tasks.vision_common.images import ImageDataError, load_image
from foundation_tasks.vl_common.images import image_transform
from foundation_tasks.vl_common.text import SentencePieceTokenizer, get_tokenizer, pad_texts


class VLPredictor(Predictor):
    input_kind = "image"

    def __init__(self, *args):
        super().__init__(*args)
        m = self.meta
        self.tokenizer = (SentencePieceTokenizer(model_proto=m["spm_model"]) if m["tokenizer"] == "sentencepiece"
                          else get_tokenizer(m["tokenizer"]))
        size = image_side("img_size", m["img_size"])
        self.transform = image_transform(size, False, m["image_mean"], m["image_std"])

    def image(self, source) -> torch.Tensor:
        try:
            return self.transform(load_image(source, max_pixels=MAX_IMAGE_PIXELS))
        except ImageDataError as e:
            raise InputError(str(e)) from None

    def text(self, text: str, n: int, field: str) -> dict[str, torch.Tensor]:
        """``text_ids`` / ``text_padding_mask`` of ``text`` repeated ``n`` times."""
        try:
            ids = self.tokenizer.encode(text, self.meta["max_text_len"])
        except ValueError as e:
            raise InputError(f"--{field}: {e}") from None
        ids, pad = pad_texts([ids] * n, self.tokenizer.pad_id)
        return {"text_ids": ids.to(self.device), "text_padding_mask": pad.to(self.device)}
