"""Top-1 / top-5 accuracy and loss, from sums the engine adds over batches and ranks."""
from __future__ import annotations

from typing import Mapping

import torch
import torch.nn.functional as F


def topk_sums(logits: torch.Tensor, labels: torch.Tensor, ks: tuple[int, ...] = (1, 5)) -> dict[str, torch.Tensor]:
    """{"count", "top1", "top5", "loss_sum"} over one batch; top-k with k above the number
    of classes counts as top-C."""
    k_max = min(max(ks), logits.shape[-1])
    top = logits.topk(k_max, dim=-1).indices
    hit = top == labels[:, None]
    out = {f"top{k}": hit[:, : min(k, k_max)].any(-1).sum().double() for k in ks}
    out["count"] = torch.tensor(float(labels.shape[0]), dtype=torch.float64, device=logits.device)
    out["loss_sum"] = F.cross_entropy(logits.float(), labels, reduction="sum").double()
    return out


def classification_metrics(totals: Mapping[str, torch.Tensor]) -> dict[str, float]:
    n = float(totals["count"])
    return {"top1": float(totals["top1"]) / n, "top5": float(totals["top5"]) / n, "loss": float(totals["loss_sum"]) / n}
