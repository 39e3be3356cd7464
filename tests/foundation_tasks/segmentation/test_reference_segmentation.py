"""benchmarks/reference_segmentation.py: its own mIoU agrees with the project's (mmseg's IoUMetric
sums) on random arrays and on one real prediction; a few steps on a tiny ADE tree print the
one-line result; a missing data folder is one line and exit 2."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from support import load_benchmark
from foundation_tasks.segmentation.metrics import iou_sums, seg_metrics

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def ref():
    return load_benchmark("reference_segmentation")


@pytest.fixture(scope="module")
def ade_tree(write_ade_tree) -> Path:
    return write_ade_tree(n_train=4, n_val=2, height=40, width=56)


def project_metric(pred: np.ndarray, label: np.ndarray, n: int) -> dict[str, float]:
    sums = iou_sums(torch.from_numpy(pred), torch.from_numpy(label), n)
    return seg_metrics(sums, [str(c) for c in range(n)])


def assert_same_metric(ref, pred: np.ndarray, label: np.ndarray, n: int) -> None:
    miou, iou = ref.iou_from_confusion(ref.confusion(pred, label, n))
    theirs = project_metric(pred, label, n)
    assert miou == pytest.approx(theirs["mIoU"])
    np.testing.assert_allclose(iou, [theirs[f"IoU.{c}"] for c in range(n)], equal_nan=True)


def test_own_miou_matches_the_projects_metric_on_random_arrays(ref):
    rng = np.random.default_rng(0)
    for n in (3, 8):
        label = rng.integers(0, n, (20, 30))
        label[rng.random(label.shape) < 0.2] = ref.IGNORE
        pred = np.where(rng.random(label.shape) < 0.6, label, rng.integers(0, n, label.shape))
        pred[pred == ref.IGNORE] = 0
        assert_same_metric(ref, pred, label, n)
    # by hand: class 3 absent (its prediction sits on an ignored pixel) is NaN, left out of the mean
    label, pred = np.array([[0, 0, 1, 1, 2, 255]]), np.array([[0, 1, 1, 2, 1, 3]])
    miou, iou = ref.iou_from_confusion(ref.confusion(pred, label, 4))
    np.testing.assert_allclose(iou, [50, 100 / 4, 0, np.nan], equal_nan=True)
    assert miou == pytest.approx((50 + 25 + 0) / 3)
    assert_same_metric(ref, pred, label, 4)


def test_reduce_zero_label_and_short_side_resize(ref):
    assert ref.reduce_zero_label(np.array([0, 1, 8, 255], np.uint8)).tolist() == [255, 0, 7, 255]
    assert ref.short_side_size(96, 72, 48) == (64, 48) and ref.short_side_size(40, 56, 48) == (48, 67)


def test_a_few_steps_print_the_line_and_a_real_prediction_scores_alike(ref, ade_tree, capsys):
    assert ref.main(["--data", str(ade_tree), "--steps", "3", "--batch-size", "4", "--log-every", "0"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    m = re.fullmatch(r"segmentation reference \(timm ViT \+ linear decoder, 3 steps of 4, seed 0\): "
                     r"mIoU ([\d.]+) \(per class (.*)\), \d+ s training", line)
    assert m, line
    assert 0 <= float(m[1]) <= 100 and m[2].startswith("wall ") and len(m[2].split(", ")) == 8
    # one prediction at the label's full size, scored by both metrics
    torch.manual_seed(0)
    model = ref.PlainSegmenter(8).eval()
    image, label = ref.load_split(ade_tree, "validation", 48, resize_label=False)[0]
    assert image.shape[:2] == (48, 67) and label.shape == (40, 56)
    pred = ref.predict(model, image, label.shape)
    assert pred.shape == label.shape and pred.max() < 8
    assert_same_metric(ref, pred, label, 8)


def test_missing_data_is_one_line_and_exit_2(ref, tmp_path, capsys):
    assert ref.main(["--data", str(tmp_path / "nowhere"), "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such folder" in err and "data make segmentation" in err
