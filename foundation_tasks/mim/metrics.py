"""MIM accuracy and loss over masked patches, from sums the engine adds up."""
from __future__ import annotations

from typing import Mapping

import torch
import torch.nn.functional as F


def mim_sums(logits: torch.Tensor, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"masked": torch.tensor(float(ids.numel()), dtype=torch.float64, device=logits.device),
            "correct": (logits.argmax(-1) == ids).sum().double(),
            "loss_sum": F.cross_entropy(logits.float(), ids, reduction="sum").double()}


def pixel_sums(pred: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    """Masked patches and the sum of their mean squared errors (per patch over its pixels)."""
    return {"masked": torch.tensor(float(pred.shape[0]), dtype=torch.float64, device=pred.device),
            "sq_err_sum": (pred.float() - target.float()).pow(2).mean(-1).sum().double()}


def mim_metrics(totals: Mapping[str, torch.Tensor]) -> dict[str, float]:
    n = float(totals["masked"])
    if "sq_err_sum" in totals:  # the pixel target: MSE of the normalised patch pixels (1.0 = predicting 0)
        return {"pix_loss": float(totals["sq_err_sum"]) / n}
    return {"mim_acc": float(totals["correct"]) / n, "mim_loss": float(totals["loss_sum"]) / n}
