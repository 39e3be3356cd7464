"""MIM accuracy and loss over masked patches, from sums the engine adds up."""
from __future__ import annotations

from typing import Mapping

import torch
import torch.nn.functional as F


def mim_sums(logits: torch.Tensor, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"masked": torch.tensor(float(ids.numel()), dtype=torch.float64, device=logits.device),
            "correct": (logits.argmax(-1) == ids).sum().double(),
            "loss_sum": F.cross_entropy(logits.float(), ids, reduction="sum").double()}


def mim_metrics(totals: Mapping[str, torch.Tensor]) -> dict[str, float]:
    n = float(totals["masked"])
    return {"mim_acc": float(totals["correct"]) / n, "mim_loss": float(totals["loss_sum"]) / n}
