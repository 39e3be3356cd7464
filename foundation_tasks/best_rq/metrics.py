"""Masked-prediction accuracy and loss of BEST-RQ, from sums the engine adds up."""
from __future__ import annotations

from typing import Mapping

import torch
import torch.nn.functional as F


def best_rq_sums(logits: torch.Tensor, targets: torch.Tensor, masked_input: torch.Tensor,
                 input_frames: torch.Tensor) -> dict[str, torch.Tensor]:
    """``logits`` (M, K, V) and ``targets`` (M, K) of the masked encoder frames; the counts of
    masked and of all (unpadded) input frames."""
    flat, ids = logits.float().flatten(0, 1), targets.flatten()
    return {"predictions": torch.tensor(float(ids.numel()), dtype=torch.float64),
            "correct": (flat.argmax(-1) == ids).sum().double().cpu(),
            "loss_sum": F.cross_entropy(flat, ids, reduction="sum").double().cpu() if ids.numel() else
            torch.zeros((), dtype=torch.float64),
            "masked_input": masked_input.double().cpu(), "input_frames": input_frames.double().cpu()}


def best_rq_metrics(totals: Mapping[str, torch.Tensor]) -> dict[str, float]:
    n = max(float(totals["predictions"]), 1.0)
    return {"accuracy": float(totals["correct"]) / n, "loss": float(totals["loss_sum"]) / n,
            "mask_ratio": float(totals["masked_input"]) / max(float(totals["input_frames"]), 1.0)}
