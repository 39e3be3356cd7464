"""BEiT-3's VQA head around the shared backbone: the image-question pair through the
multiway backbone, the pooler on the first (image class) token (``pool: max``: on the max
over the image's patch tokens), an MLP over the answers, and binary cross-entropy on the
soft scores, scaled by the number of answers as BEiT-3 does (``BCEWithLogits(mean) *
num_answers``: per question, the sum over answers).

With ``num_objects`` (the VQA config's ``object_annotations``), a linear layer also names the
object category (or background, the last class) of every patch token after block
``object_block`` (0-based), like a segmentation or detection classifier over the tokens; its
cross-entropy with the batch's ``object_labels``, weighted ``object_weight``, is added where
the batch has labels (training). One class per category: predicting the words of the
category names instead (multi-hot, "red circle" -> red, circle) gave NLVR2 starts 10-15
points worse on the demo data (docs/findings.md, Vision-language)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from foundation_tasks.vl_common.beit3 import POOLS, BEiT3Embedding, Pooler, encode, image_summary, init_head


class VQAHead(nn.Module):
    def __init__(self, embed: BEiT3Embedding, dim: int, num_answers: int, eps: float = 1e-5, init_std: float = 0.02,
                 num_objects: int = 0, object_block: int = 1, object_weight: float = 1.0, pool: str = "cls"):
        super().__init__()
        if pool not in POOLS:
            raise ValueError(f"VQAHead: pool must be one of {POOLS}, got {pool!r}")
        self.embed = embed  # shared with the model's other VL heads
        self.pool = pool
        self.pooler = Pooler(dim, eps)
        self.head = nn.Sequential(nn.Linear(dim, 2 * dim), nn.LayerNorm(2 * dim, eps=eps), nn.GELU(),
                                  nn.Linear(2 * dim, num_answers))  # BEiT-3's names: head.0, head.1, head.3
        init_head(self.pooler, std=init_std)
        init_head(self.head, std=init_std)
        # torch's default Linear init, as for a segmentation / detection classifier over tokens
        self.objects = nn.Linear(dim, num_objects + 1) if num_objects else None
        self.object_block, self.object_weight = object_block, object_weight

    def logits(self, backbone: nn.Module, batch: dict) -> torch.Tensor:
        return self._forward(backbone, batch)[0]

    def _forward(self, backbone: nn.Module, batch: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(answer logits, the object loss or None)."""
        inputs = dict(text_ids=batch["text_ids"], text_padding_mask=batch["text_padding_mask"], images=batch["images"])
        if self.objects is None or "object_labels" not in batch:
            return self.head(self.pooler(self.pooled(encode(self.embed, backbone, **inputs)))), None
        x, hidden = encode(self.embed, backbone, return_layers=[self.object_block], **inputs)
        labels = batch["object_labels"]
        patches = hidden[self.object_block][:, 1:1 + labels.shape[1]]  # the image's class token first
        objects = F.cross_entropy(self.objects(patches).flatten(0, 1).float(), labels.flatten())
        return self.head(self.pooler(self.pooled(x))), objects

    def pooled(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, dim) -> (B, 1, dim), the token the pooler reads: the image's class token
        (``cls``) or the max over its patch tokens (``max``)."""
        return image_summary(x, self.pool, self.embed.num_vision_tokens)

    @staticmethod
    def loss(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean",
             weights: torch.Tensor | None = None) -> torch.Tensor:
        """BEiT-3's loss; with per-question ``weights``, their weighted mean."""
        per_question = F.binary_cross_entropy_with_logits(logits.float(), targets, reduction="none").sum(1)
        if reduction != "mean":
            return per_question.sum()
        return per_question.mean() if weights is None else (per_question * weights).sum() / weights.sum()

    def forward(self, backbone: nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
        logits, objects = self._forward(backbone, batch)
        score = batch["targets"].gather(1, logits.argmax(1, keepdim=True)).mean()
        loss = self.loss(logits, batch["targets"], weights=batch.get("loss_weight"))
        if objects is None:
            return loss, {"score": score.detach()}
        return loss + self.object_weight * objects, {"score": score.detach(), "object_loss": objects.detach()}

    def no_weight_decay(self) -> list[str]:
        return [f"embed.{n}" for n in self.embed.no_weight_decay()]
