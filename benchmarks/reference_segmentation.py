"""A plain timm ViT + linear decoder on the segmentation demo data, at the tiny recipe's budget.

    python benchmarks/reference_segmentation.py --data data/ade-demo                  # 400 steps of 16, seed 0
    python benchmarks/reference_segmentation.py --data data/ade-demo --seed 1
    python benchmarks/reference_segmentation.py --data data/ade-demo --steps 20       # a smoke test

The reference is deliberately plain and independent of the project's pipeline (no mmseg, no
engine): PIL / numpy read the ADEChallengeData2016 layout (``foundation_tasks/segmentation/demo.py``:
``images/{training,validation}/*.jpg`` and ``annotations/.../*.png``; label 0 = "other" is
ignored and 1..8 become classes 0..7, as mmseg's ``reduce_zero_label``; 255 stays ignored).
Training: every image resized so its short side is 48 (as our eval resize), random 48x48 crops
and horizontal flips - no scale jitter, no photometric distortion, no ``cat_max_ratio``
(ours has all three). Model: ``timm.create_model`` ViT of the tiny recipe's size (64 dim,
4 blocks, 2 heads, patch 4, 48x48 input, no class token), the 12x12 grid of patch tokens
through one linear layer (a 1x1 conv, SETR-naive without its hidden layer) and bilinearly
upsampled to the crop. Cross-entropy with ignore index 255, AdamW (lr 2e-3, weight decay
0.05), linear warmup over 50 steps then poly (power 1) to 0, as configs/segmentation/tiny_*.yaml.
Evaluation as ours (short side resized to 48, sliding 48x48 windows with stride 32, the logits
upsampled to the label's full size) and mIoU over the 8 classes of the whole validation split,
from its own confusion matrix (``confusion`` / ``iou_from_confusion``; a test holds them
against ``foundation_tasks.segmentation.metrics``). Prints one line with mIoU, the per-class IoU and
the training time.

Our recipe, for comparison: ``foundation train configs/segmentation/tiny.yaml
tasks.0.data_root=DIR`` (UPerHead, mmseg's full augmentation); docs/segmentation.md has both.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

CLASSES = ("wall", "building", "sky", "floor", "tree", "ceiling", "road", "bed")  # ADE20k ids 1..8
IGNORE = 255
MEAN = np.array([123.675, 116.28, 103.53], np.float32)  # ImageNet, 0-255, RGB (as ours)
STD = np.array([58.395, 57.12, 57.375], np.float32)
SPLITS = ("training", "validation")


def reduce_zero_label(raw: np.ndarray) -> np.ndarray:
    """ADE20k labels -> class ids: 0 ("other") -> ignore, k -> k - 1, 255 stays ignore."""
    out = raw.astype(np.int64) - 1
    out[(raw == 0) | (raw == IGNORE)] = IGNORE
    return out


def short_side_size(w: int, h: int, short: int) -> tuple[int, int]:
    """(w, h) scaled so the short side is ``short`` (the long side at most 4x that, as mmseg's keep_ratio)."""
    scale = min(short / min(w, h), 4 * short / max(w, h))
    return int(w * scale + 0.5), int(h * scale + 0.5)


def load_split(root: Path, split: str, short: int, resize_label: bool) -> list[tuple[np.ndarray, np.ndarray]]:
    """[(image HxWx3 float32 normalised at short side ``short``, label as class ids)] for one split.
    Labels are resized (nearest) with the image for training and kept at full size for evaluation."""
    items = []
    for img_path in sorted((root / "images" / split).glob("*.jpg")):
        ann_path = root / "annotations" / split / (img_path.stem + ".png")
        img, raw = Image.open(img_path).convert("RGB"), Image.open(ann_path)
        if raw.size != img.size:
            raise ValueError(f"{ann_path}: annotation is {raw.size}, its image {img.size}")
        size = short_side_size(*img.size, short)
        image = (np.asarray(img.resize(size, Image.BILINEAR), np.float32) - MEAN) / STD
        label = raw.resize(size, Image.NEAREST) if resize_label else raw
        items.append((image, reduce_zero_label(np.asarray(label))))
    if not items:
        raise ValueError(f"{root / 'images' / split}: no .jpg images (the ADEChallengeData2016 layout; "
                         f"foundation data make segmentation --out {root})")
    return items


class PlainSegmenter(nn.Module):
    """timm's VisionTransformer (no class token) -> 12x12 patch tokens -> linear -> bilinear upsample."""

    def __init__(self, num_classes: int, img_size: int = 48, patch: int = 4, dim: int = 64, depth: int = 4,
                 heads: int = 2):
        super().__init__()
        import timm

        self.vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=img_size, patch_size=patch,
                                     embed_dim=dim, depth=depth, num_heads=heads, mlp_ratio=4.0, num_classes=0,
                                     class_token=False, global_pool="")
        self.grid = img_size // patch
        self.decode = nn.Conv2d(dim, num_classes, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.vit.forward_features(x)  # (B, grid * grid, dim): patch tokens only
        fmap = tokens.transpose(1, 2).reshape(len(x), -1, self.grid, self.grid)
        return F.interpolate(self.decode(fmap), size=x.shape[-2:], mode="bilinear", align_corners=False)


def random_crops(items, batch: int, crop: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` random crop x crop windows (+ horizontal flips) of random training items."""
    xs, ys = [], []
    for i in rng.integers(len(items), size=batch):
        image, label = items[i]
        h, w = label.shape
        top, left = rng.integers(h - crop + 1), rng.integers(w - crop + 1)
        x, y = image[top:top + crop, left:left + crop], label[top:top + crop, left:left + crop]
        if rng.random() < 0.5:
            x, y = x[:, ::-1], y[:, ::-1]
        xs.append(np.ascontiguousarray(x.transpose(2, 0, 1)))
        ys.append(np.ascontiguousarray(y))
    return torch.from_numpy(np.stack(xs)), torch.from_numpy(np.stack(ys))


def lr_factor(step: int, warmup: int, total: int, power: float = 1.0) -> float:
    """Linear warmup from 0 over ``warmup`` steps, then poly decay to 0 at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    return (1.0 - min(1.0, (step - warmup) / max(1, total - warmup))) ** power


@torch.no_grad()
def predict(model: nn.Module, image: np.ndarray, out_size: tuple[int, int], crop: int = 48,
            stride: int = 32) -> np.ndarray:
    """Sliding crop x crop windows (stride ``stride``) over a resized image, logits averaged where they
    overlap and bilinearly upsampled to ``out_size`` (the label's full size) -> class ids (H, W)."""
    x = torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1)))[None]
    h, w = x.shape[-2:]
    ph, pw = max(crop - h, 0), max(crop - w, 0)  # smaller than a window: pad (0 = the mean colour)
    x = F.pad(x, (0, pw, 0, ph))
    H, W = x.shape[-2:]
    logits, count = None, torch.zeros(1, 1, H, W)
    for y0 in range(0, max(H - crop + stride - 1, 0) // stride * stride + 1, stride):
        for x0 in range(0, max(W - crop + stride - 1, 0) // stride * stride + 1, stride):
            y1, x1 = min(y0 + crop, H), min(x0 + crop, W)
            ya, xa = y1 - crop, x1 - crop  # the last window ends at the border
            out = model(x[..., ya:y1, xa:x1])
            if logits is None:
                logits = torch.zeros(1, out.shape[1], H, W)
            logits[..., ya:y1, xa:x1] += out
            count[..., ya:y1, xa:x1] += 1
    logits = (logits / count)[..., :h, :w]
    return F.interpolate(logits, size=out_size, mode="bilinear", align_corners=False)[0].argmax(0).numpy()


def confusion(pred: np.ndarray, label: np.ndarray, num_classes: int, ignore: int = IGNORE) -> np.ndarray:
    """Our own metric, independent of mmseg's: a (true, predicted) pixel-count matrix over the
    labelled pixels (label != ignore)."""
    keep = label != ignore
    idx = label[keep].astype(np.int64) * num_classes + pred[keep].astype(np.int64)
    return np.bincount(idx, minlength=num_classes ** 2).reshape(num_classes, num_classes)


def iou_from_confusion(conf: np.ndarray) -> tuple[float, np.ndarray]:
    """(mIoU %, per-class IoU %): intersection / union per class; a class absent from both the labels
    and the predictions is NaN and left out of the mean (as mmseg)."""
    inter = np.diag(conf).astype(np.float64)
    union = conf.sum(0) + conf.sum(1) - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = np.where(union > 0, inter / union, np.nan) * 100
    return (float(np.nanmean(iou)) if np.isfinite(iou).any() else float("nan")), iou


def evaluate(model: nn.Module, val, num_classes: int, crop: int, stride: int) -> tuple[float, np.ndarray]:
    model.eval()
    conf = sum(confusion(predict(model, image, label.shape, crop, stride), label, num_classes) for image, label in val)
    model.train()
    return iou_from_confusion(conf)


def train(a: argparse.Namespace, train_items) -> tuple[nn.Module, float]:
    torch.manual_seed(a.seed)
    rng = np.random.default_rng(a.seed)
    model = PlainSegmenter(len(CLASSES), a.crop, 4, a.dim, a.depth, a.heads)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, a.warmup, a.steps))
    start = time.perf_counter()
    for step in range(1, a.steps + 1):
        x, y = random_crops(train_items, a.batch_size, a.crop, rng)
        loss = F.cross_entropy(model(x), y, ignore_index=IGNORE)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if a.log_every and (step % a.log_every == 0 or step == a.steps):
            print(f"  step {step}: loss {loss.item():.3f}", flush=True)
    return model, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/reference_segmentation.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="data/ade-demo", help="ADEChallengeData2016 layout (foundation data make segmentation)")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=2e-3, help="AdamW peak lr")
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--warmup", type=int, default=50, help="linear warmup steps, then poly (power 1) to 0")
    p.add_argument("--crop", type=int, default=48, help="training crop = sliding window = short side at eval")
    p.add_argument("--stride", type=int, default=32, help="sliding-window stride at eval")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--log-every", type=int, default=100, help="steps between loss lines (0: none)")
    a = p.parse_args(argv)
    root = Path(a.data)
    try:
        for split in SPLITS:
            if not (root / "images" / split).is_dir():
                raise ValueError(f"{root / 'images' / split}: no such folder "
                                 f"(foundation data make segmentation --out {root})")
        train_items = load_split(root, "training", a.crop, resize_label=True)
        val = load_split(root, "validation", a.crop, resize_label=False)
    except (OSError, ValueError) as e:  # a missing folder / annotation, an unreadable file: one line
        print(f"reference_segmentation: error: {e}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    model, seconds = train(a, train_items)
    miou, iou = evaluate(model, val, len(CLASSES), a.crop, a.stride)
    per_class = ", ".join(f"{c} {v:.1f}" for c, v in zip(CLASSES, iou))
    print(f"segmentation reference (timm ViT + linear decoder, {a.steps} steps of {a.batch_size}, seed {a.seed}): "
          f"mIoU {miou:.1f} (per class {per_class}), {seconds:.0f} s training", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
