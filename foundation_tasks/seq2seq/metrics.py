"""Exact match and token accuracy of decoded sequences, from sums the engine adds up."""
from __future__ import annotations

from typing import Mapping

import torch

from foundation_tasks.seq2seq.data import PAD


def decode_sums(pred: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
    """Sums over a batch. ``labels`` is target + EOS, PAD-padded; ``pred`` is greedy
    output (B, L) with L >= labels' length. A sequence matches exactly when every label
    position (EOS included) is predicted; tokens count label positions predicted right."""
    T = labels.shape[1]
    real = labels != PAD
    hit = (pred[:, :T] == labels) & real
    exact = hit.sum(1) == real.sum(1)
    return {
        "sequences": torch.tensor(float(labels.shape[0])),
        "exact": exact.sum().double(),
        "tokens": real.sum().double(),
        "token_correct": hit.sum().double(),
    }


def seq2seq_metrics(totals: Mapping[str, torch.Tensor]) -> dict[str, float]:
    tokens = float(totals["tokens"])
    return {
        "exact_match": float(totals["exact"]) / float(totals["sequences"]),
        "token_accuracy": float(totals["token_correct"]) / tokens,
        "loss": float(totals["loss_sum"]) / tokens,  # teacher-forced cross-entropy per token
    }
