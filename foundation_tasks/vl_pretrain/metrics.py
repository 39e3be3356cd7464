"""Masked-token accuracy of masked data modeling: MLM over masked text tokens, MIM over
the visual tokens of masked patches, and both pooled (``accuracy``), with the loss per
masked token, from the sums of ``eval_step``; image-text matching reports ``itm_accuracy``
(chance 50) and its loss per pair. With the pixels target, MIM reports
``mim_pix_loss`` (the mean squared error of the normalised pixels; 1.0 is what predicting
each patch's mean scores) instead, and ``accuracy`` / ``loss`` are MLM's."""
from __future__ import annotations

from typing import Mapping

import torch
import torch.nn.functional as F

PARTS = ("mlm", "mim", "itm", "word")


def mdm_sums(predictions: Mapping[str, tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    sums = {"loss_sum": torch.zeros((), dtype=torch.float64)}
    for name, (logits, targets) in predictions.items():
        if targets.is_floating_point():  # the pixels target: squared error per value
            sums[f"{name}_sq_sum"] = F.mse_loss(logits.float(), targets, reduction="sum").double().cpu()
            sums[f"{name}_values"] = torch.tensor(float(targets.numel()), dtype=torch.float64)
            continue
        sums[f"{name}_correct"] = (logits.argmax(-1) == targets).sum().double().cpu()
        sums[f"{name}_count"] = torch.tensor(float(targets.numel()), dtype=torch.float64)
        sums["loss_sum"] = sums["loss_sum"] + F.cross_entropy(logits.float(), targets, reduction="sum").double().cpu()
    return sums


def mdm_metrics(totals: Mapping[str, torch.Tensor]) -> dict[str, float]:
    out, correct, count = {}, 0.0, 0.0
    for name in PARTS:
        if f"{name}_values" in totals:
            out[f"{name}_pix_loss"] = float(totals[f"{name}_sq_sum"]) / max(float(totals[f"{name}_values"]), 1.0)
        if f"{name}_count" in totals:
            n, c = float(totals[f"{name}_count"]), float(totals[f"{name}_correct"])
            out[f"{name}_accuracy"] = c / max(n, 1.0)
            correct, count = correct + c, count + n
    if count:
        out["accuracy"] = correct / count
        out["loss"] = float(totals["loss_sum"]) / count  # per masked token
    return out
