"""BEiT-3's VQA head around the shared backbone: the image-question pair through the
multiway backbone, the pooler on the first (image class) token, an MLP over the answers,
and binary cross-entropy on the soft scores, scaled by the number of answers as BEiT-3
does (``BCEWithLogits(mean) * num_answers``: per question, the sum over answers)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tasks.vl_common.beit3 import BEiT3Embedding, Pooler, encode, init_head


class VQAHead(nn.Module):
    def __init__(self, embed: BEiT3Embedding, dim: int, num_answers: int, eps: float = 1e-5, init_std: float = 0.02):
        super().__init__()
        self.embed = embed  # shared with the model's other VL heads
        self.pooler = Pooler(dim, eps)
        self.head = nn.Sequential(nn.Linear(dim, 2 * dim), nn.LayerNorm(2 * dim, eps=eps), nn.GELU(),
                                  nn.Linear(2 * dim, num_answers))  # BEiT-3's names: head.0, head.1, head.3
        init_head(self.pooler, std=init_std)
        init_head(self.head, std=init_std)

    def logits(self, backbone: nn.Module, batch: dict) -> torch.Tensor:
        x = encode(self.embed, backbone, text_ids=batch["text_ids"], text_padding_mask=batch["text_padding_mask"],
                   images=batch["images"])
        return self.head(self.pooler(x))

    @staticmethod
    def loss(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        per_question = F.binary_cross_entropy_with_logits(logits.float(), targets, reduction="none").sum(1)
        return per_question.mean() if reduction == "mean" else per_question.sum()

    def forward(self, backbone: nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
        logits = self.logits(backbone, batch)
        score = batch["targets"].gather(1, logits.argmax(1, keepdim=True)).mean()
        return self.loss(logits, batch["targets"]), {"score": score.detach()}

    def no_weight_decay(self) -> list[str]:
        return [f"embed.{n}" for n in self.embed.no_weight_decay()]
