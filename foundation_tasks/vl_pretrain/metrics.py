"""Masked-token accuracy of masked data modeling: MLM over masked text tokens, MIM over
the visual tokens of masked patches, and both pooled (``accuracy``), with the loss per
masked token, from the sums of ``eval_step``."""
from __future__ import annotations

from typing import Mapping

import torch
import torch.nn.functional as F

PARTS = ("mlm", "mim")


def mdm_sums(predictions: Mapping[str, tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    sums = {"loss_sum": torch.zeros((), dtype=torch.float64)}
    for name, (logits, targets) in predictions.items():
        sums[f"{name}_correct"] = (logits.argmax(-1) == targets).sum().double().cpu()
        sums[f"{name}_count"] = torch.tensor(float(targets.numel()), dtype=torch.float64)
        sums["loss_sum"] = sums["loss_sum"] + F.cross_entropy(logits.float(), targets, reduction="sum").double().cpu()
    return sums


def mdm_metrics(totals: Mapping[str, torch.Tensor]) -> dict[str, float]:
    out, correct, count = {}, 0.0, 0.0
    for name in PARTS:
        if f"{name}_count" in totals:
            n, c = float(totals[f"{name}_count"]), float(totals[f"{name}_correct"])
            out[f"{name}_accuracy"] = c / max(n, 1.0)
            correct, count = correct + c, count + n
    out["accuracy"] = correct / max(count, 1.0)
    out["loss"] = float(totals["loss_sum"]) / max(count, 1.0)  # per masked token
    return out
