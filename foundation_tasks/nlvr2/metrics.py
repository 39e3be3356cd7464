"""NLVR2 accuracy (the official metric) and the loss, from the sums of ``eval_step``."""
from __future__ import annotations

from typing import Mapping

import torch
import torch.nn.functional as F


def nlvr2_sums(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
    return {
        "statements": torch.tensor(float(labels.shape[0])),
        "correct": (logits.argmax(1) == labels).sum().double(),
        "loss_sum": F.cross_entropy(logits.float(), labels, reduction="sum").double(),
    }


def nlvr2_metrics(totals: Mapping[str, torch.Tensor]) -> dict[str, float]:
    n = float(totals["statements"])
    return {"accuracy": float(totals["correct"]) / n, "loss": float(totals["loss_sum"]) / n}
