"""Per-class loss weights from the training annotations of an ADE20k-layout folder, for the
``class_weight`` field of a segmentation config::

    python -m foundation_tasks.segmentation.class_weights data/ade-demo --num-classes 8
    class_weight: [0.7, 1.516, ...]     # pixel share per class on stderr

Median-frequency balancing (Eigen & Fergus 2015: w_c = median share / share of c) raised to
``--power`` (default 0.5, its square root): a class with a few per cent of the pixels then
weighs ~2x instead of ~5x, enough for it to be learnt early without trading away the
neighbouring classes (measured on the demo scenes, docs/segmentation.md). Labels follow the
dataset's reduce_zero_label: 0 ("other") and values above ``num_classes`` are not counted.
mmseg has no such tool; counting pixels is a few lines of numpy.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from foundation.config import ConfigError
from foundation_tasks.segmentation.data import SPLITS, check_layout


def pixel_shares(root: str | Path, num_classes: int) -> np.ndarray:
    """Share of the labelled training pixels per class (ADE value c + 1 is class c)."""
    counts = np.zeros(num_classes + 1, np.int64)
    for path in sorted((Path(root) / "annotations" / SPLITS["train"]).rglob("*.png")):
        label = np.asarray(Image.open(path))
        if label.ndim != 2:
            raise ConfigError(f"{path}: annotation of shape {label.shape}, expected one channel (H, W)")
        counts += np.bincount(label.ravel(), minlength=256)[:num_classes + 1]
    labelled = counts[1:]
    if not labelled.sum():
        raise ConfigError(f"{root}: no training pixel carries a label 1..{num_classes}")
    return labelled / labelled.sum()


def balanced_weights(shares: np.ndarray, power: float = 0.5) -> list[float]:
    """(median share / share) ** power per class, rounded to 3 decimals; a class that never occurs gets 1."""
    present = shares > 0
    median = np.median(shares[present])
    w = np.ones_like(shares)
    w[present] = (median / shares[present]) ** power
    return [round(float(x), 3) for x in w]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m foundation_tasks.segmentation.class_weights", description=__doc__.split("\n\n")[0])
    p.add_argument("data_root", help="ADEChallengeData2016-layout folder (images/, annotations/)")
    p.add_argument("--num-classes", type=int, required=True, help="the config's num_classes")
    p.add_argument("--power", type=float, default=0.5, help="1: median-frequency balancing; 0.5 (default): its square root")
    a = p.parse_args(argv)
    try:
        check_layout(a.data_root, "data_root")
        shares = pixel_shares(a.data_root, a.num_classes)
    except ConfigError as e:
        print(f"class_weights: {e}", file=sys.stderr)
        return 2
    print("pixel share (%): " + ", ".join(f"{100 * s:.1f}" for s in shares), file=sys.stderr)
    print(f"class_weight: {balanced_weights(shares, a.power)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
