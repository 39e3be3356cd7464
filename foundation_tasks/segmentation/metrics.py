"""mIoU, aAcc, mAcc and per-class IoU with mmseg's ``IoUMetric``, from sums the engine adds up.

mmseg's ``IoUMetric`` keeps a list of per-image (intersection, union, predicted, label)
pixel histograms and sums them at the end; the engine sums over batches and ranks
instead (so the metric is exact under data parallelism), then ``seg_metrics`` hands the
totals to mmseg's own ``total_area_to_metrics``. Values are percentages, as mmseg and
the papers report them; a class absent from both predictions and labels has IoU NaN and
is left out of the mean (mmseg's ``nanmean``).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import torch

from foundation_tasks.segmentation import mmseg_compat

mmseg_compat.import_mmseg()

from mmseg.evaluation import IoUMetric  # noqa: E402

IGNORE = 255
SUM_KEYS = ("area_intersect", "area_union", "area_pred", "area_label")


def iou_sums(pred: torch.Tensor, label: torch.Tensor, num_classes: int, ignore_index: int = IGNORE) -> dict[str, torch.Tensor]:
    """Per-class pixel histograms of one image: (H, W) predicted and true class ids."""
    parts = IoUMetric.intersect_and_union(pred, label.to(pred), num_classes, ignore_index)
    return {k: v.double() for k, v in zip(SUM_KEYS, parts)}


def seg_metrics(totals: Mapping[str, torch.Tensor], class_names: Sequence[str]) -> dict[str, float]:
    """{mIoU, aAcc, mAcc, IoU.<class> ...} in percent from summed histograms."""
    areas = [totals[k].cpu().double() for k in SUM_KEYS]
    per_class = IoUMetric.total_area_to_metrics(*areas, metrics=["mIoU"])
    iou, acc = np.asarray(per_class["IoU"], np.float64), np.asarray(per_class["Acc"], np.float64)
    with np.errstate(invalid="ignore"):
        out = {
            "mIoU": float(np.nanmean(iou) * 100) if np.isfinite(iou).any() else float("nan"),
            "aAcc": float(np.asarray(per_class["aAcc"]) * 100),
            "mAcc": float(np.nanmean(acc) * 100) if np.isfinite(acc).any() else float("nan"),
        }
    out.update({f"IoU.{name}": float(v * 100) for name, v in zip(class_names, iou)})
    return out
