"""``foundation predict`` for NLVR2: a pair of images + a sentence -> is the sentence true
of the pair? (``label``, and ``score``: the model's probability of that label)."""
from __future__ import annotations

import torch

from foundation_tasks.vl_common.predict import VLPredictor


class NLVR2Predictor(VLPredictor):
    input_kind = "image pair"
    required = ("sentence",)
    pairs = True
    default_batch_size = 16

    def load(self, source, **_) -> tuple[torch.Tensor, torch.Tensor]:
        left, right = source
        return self.image(left), self.image(right)

    def predict(self, items, sentence: str = "", **_) -> list[dict]:
        batch = {"left": torch.stack([x[0] for x in items]).to(self.device),
                 "right": torch.stack([x[1] for x in items]).to(self.device),
                 **self.text(sentence, len(items), "sentence")}
        p_true = self.head.logits(self.backbone, batch).float().softmax(-1)[:, 1]  # label 1 = True
        return [{"sentence": sentence, "label": p >= 0.5, "score": p if p >= 0.5 else 1 - p}
                for p in p_true.tolist()]

    def describe(self, record) -> str:
        return f"{str(record['label']).lower()} ({record['score']:.3f})"
