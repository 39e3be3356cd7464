"""BEiT-3's NLVR2 head: each image paired with the sentence through the multiway backbone,
the image class token (``pool: max``: the max over its patch tokens, as the VQA head's) and
the text's first token of each pair concatenated, the two
pairs' representations concatenated (4 x dim), and a two-layer MLP to True / False.
As BEiT-3, the MLP starts near zero (its Linear layers scaled by 0.001)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from foundation_tasks.vl_common.beit3 import POOLS, BEiT3Embedding, encode, image_summary, init_head


class TwoLayerMLP(nn.Module):
    """LN -> dense -> LN -> GELU -> dense (BEiT-3's names: norm1, dense1, norm2, dense2)."""

    def __init__(self, dim: int, hidden: int, out: int, eps: float = 1e-5):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.dense1 = nn.Linear(dim, hidden)
        self.norm2 = nn.LayerNorm(hidden, eps=eps)
        self.act = nn.GELU()
        self.dense2 = nn.Linear(hidden, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense2(self.act(self.norm2(self.dense1(self.norm1(x)))))


class NLVR2Head(nn.Module):
    def __init__(self, embed: BEiT3Embedding, dim: int, eps: float = 1e-5, init_std: float = 0.02,
                 init_scale: float = 0.001, pool: str = "cls"):
        super().__init__()
        if pool not in POOLS:
            raise ValueError(f"NLVR2Head: pool must be one of {POOLS}, got {pool!r}")
        self.embed = embed  # shared with the model's other VL heads
        self.pool = pool
        self.head = TwoLayerMLP(4 * dim, 2 * dim, 2, eps)
        init_head(self.head, scale=init_scale, std=init_std)

    def logits(self, backbone: nn.Module, batch: dict) -> torch.Tensor:
        B = batch["text_ids"].shape[0]
        x = encode(self.embed, backbone, images=torch.cat([batch["left"], batch["right"]]),
                   text_ids=batch["text_ids"].repeat(2, 1), text_padding_mask=batch["text_padding_mask"].repeat(2, 1))
        n = self.embed.num_vision_tokens
        pair = torch.cat([image_summary(x, self.pool, n)[:, 0], x[:, n]], dim=-1)  # (2B, 2 dim)
        return self.head(torch.cat([pair[:B], pair[B:]], dim=-1))

    def forward(self, backbone: nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
        logits = self.logits(backbone, batch)
        acc = (logits.argmax(1) == batch["labels"]).float().mean()
        return F.cross_entropy(logits.float(), batch["labels"]), {"accuracy": acc.detach()}

    def no_weight_decay(self) -> list[str]:
        return [f"embed.{n}" for n in self.embed.no_weight_decay()]
