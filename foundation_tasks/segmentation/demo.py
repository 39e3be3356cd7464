"""Demo data for semantic segmentation, written in the ADEChallengeData2016 layout::

    OUT/images/training/ADE_train_00000001.jpg      RGB scene
    OUT/annotations/training/ADE_train_00000001.png per-pixel labels (8-bit, one channel)
    OUT/images/validation/ADE_val_00000001.jpg ...

Labels follow ADE20k: 0 = "other" (ignored with ``reduce_zero_label=True``), then the
classes by their ADE20k ids. The scenes use the first ``NUM_CLASSES`` = 8 ADE20k classes -
1 wall, 2 building, 3 sky, 4 floor, 5 tree, 6 ceiling, 7 road, 8 bed - so ``num_classes: 8``
in a config names them with ADE20KDataset's own class list, and the real data set drops in
by pointing ``data_root`` at it (``num_classes: 150``).

Scenes are procedural: outdoor (sky, buildings, trees, ground, road) or indoor (ceiling,
wall, floor, beds, furniture). Colours are jittered per image and overlap between classes
(sky / ceiling, wall / building, floor / road), so a model needs layout and texture, not
just colour. Image i of a split is a pure function of (seed, split, i).

``--unlabelled N`` adds a pool for pretraining, in the ImageNet layout the MIM task reads
(labels unused): the training scenes and N more, without annotations::

    OUT/unlabelled/train/scenes/ADE_train_00000001.jpg   the training scenes, the same files
    OUT/unlabelled/train/scenes/pool_00000001.jpg        N scenes of another seed (seed + 7)
    OUT/unlabelled/val/scenes/ADE_val_00000001.jpg       20 of that seed's validation scenes

    foundation data make segmentation --out data/ade-demo [--seed 0] [--train 400] [--val 100] [--height 72 --width 96]
        [--unlabelled 4000]
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from foundation.engine.demo_cli import demo_parser, free_out, item_count, timed

DEMO_DATA = {"name": "segmentation", "folder": "ade-demo"}  # foundation data make segmentation (engine/demo_cli.py)

WALL, BUILDING, SKY, FLOOR, TREE, CEILING, ROAD, BED = range(1, 9)
NUM_CLASSES = 8
SPLITS = {"training": ("train", 0), "validation": ("val", 1)}
POOL_SEED_OFFSET = 7  # the unlabelled pool's scenes: another seed's, so that none is an annotated scene
POOL_VAL = 20  # the pool's validation scenes (MIM's held-out loss)


class Canvas:
    """An RGB float image and its label map, painted region by region."""

    def __init__(self, height: int, width: int, rng: np.random.Generator):
        self.height, self.width, self.rng = height, width, rng
        yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
        self.yy, self.xx = yy / height, xx / width  # both in [0, 1)
        self.img = np.zeros((height, width, 3), np.float32)
        self.label = np.zeros((height, width), np.uint8)

    def color(self, base, jitter: float = 0.12) -> np.ndarray:
        return np.clip(np.asarray(base, np.float32) + self.rng.uniform(-jitter, jitter, 3), 0, 1)

    def noise(self, scale: float, cells: int = 8) -> np.ndarray:
        """Smooth blotchy noise (bilinear upsampling of a coarse random grid), (H, W, 1)."""
        coarse = self.rng.normal(0, 1, (cells, cells)).astype(np.float32)
        up = np.asarray(Image.fromarray(coarse).resize((self.width, self.height), Image.BILINEAR))
        return (scale * up)[..., None]

    def paint(self, mask: np.ndarray, label: int, rgb: np.ndarray) -> None:
        self.img[mask] = rgb[mask] if rgb.ndim == 3 else rgb
        self.label[mask] = label

    def rect(self, y0, y1, x0, x1) -> np.ndarray:
        return (self.yy >= y0) & (self.yy < y1) & (self.xx >= x0) & (self.xx < x1)

    def disk(self, cy, cx, r) -> np.ndarray:
        return (self.yy - cy) ** 2 + (self.xx - cx) ** 2 < r * r


def outdoor(c: Canvas) -> None:
    r = c.rng
    horizon, road_top = r.uniform(0.3, 0.55), r.uniform(0.72, 0.88)
    sky = c.color([0.45, 0.65, 0.95], 0.15)
    c.paint(c.yy < horizon, SKY, sky + (c.yy[..., None] * 0.35) + c.noise(0.02))
    ground = c.color([0.45, 0.55, 0.3], 0.15) + c.noise(0.08)
    c.paint(c.yy >= horizon, 0, ground)
    road = c.color([0.45, 0.45, 0.45], 0.1) + c.noise(0.03)
    lane = (np.abs(c.xx - 0.5) < 0.015) & ((c.yy * 12 % 1) < 0.5)
    road[lane] = 0.95
    c.paint(c.yy >= road_top, ROAD, road)
    for _ in range(r.integers(1, 4)):
        x0, w, top = r.uniform(-0.1, 0.85), r.uniform(0.12, 0.35), r.uniform(0.05, horizon - 0.05)
        body = c.color([0.6, 0.5, 0.45], 0.2)
        windows = ((c.xx * 20 % 1) < 0.45) & ((c.yy * 14 % 1) < 0.5)
        rgb = np.where(windows[..., None], body * 0.55, body) + c.noise(0.03)
        c.paint(c.rect(top, horizon + 0.03, x0, x0 + w), BUILDING, rgb)
    for _ in range(r.integers(0, 4)):
        cx, base = r.uniform(0.05, 0.95), r.uniform(horizon + 0.05, road_top)
        crown = r.uniform(0.06, 0.14)
        trunk = c.rect(base - crown * 1.6, base, cx - 0.015, cx + 0.015)
        c.paint(trunk, TREE, c.color([0.35, 0.22, 0.1], 0.05) + np.zeros_like(c.img))
        leaves = c.color([0.15, 0.5, 0.15], 0.12) + c.noise(0.12, cells=16)
        c.paint(c.disk(base - crown * 1.6, cx, crown), TREE, leaves)


def indoor(c: Canvas) -> None:
    r = c.rng
    ceiling, floor = r.uniform(0.12, 0.3), r.uniform(0.6, 0.8)
    c.paint(c.yy < ceiling, CEILING, c.color([0.85, 0.85, 0.85], 0.1) - (c.yy[..., None] * 0.4) + c.noise(0.02))
    c.paint((c.yy >= ceiling) & (c.yy < floor), WALL, c.color([0.75, 0.65, 0.55], 0.2) + c.noise(0.04))
    wood = c.color([0.55, 0.38, 0.22], 0.12)
    stripes = ((c.xx + 0.3 * c.yy) * 16 % 1 < 0.12)[..., None]
    c.paint(c.yy >= floor, FLOOR, np.where(stripes, wood * 0.7, wood) + c.noise(0.03))
    for _ in range(r.integers(0, 3)):  # furniture that is "other"
        x0, w, h = r.uniform(0, 0.85), r.uniform(0.08, 0.2), r.uniform(0.1, 0.3)
        c.paint(c.rect(floor - h, floor + 0.02, x0, x0 + w), 0, c.color(r.uniform(0.2, 0.8, 3), 0.0) + np.zeros_like(c.img))
    for _ in range(r.integers(1, 3)):
        x0, w, h = r.uniform(-0.1, 0.7), r.uniform(0.25, 0.45), r.uniform(0.12, 0.22)
        y1 = r.uniform(floor + 0.02, min(0.98, floor + 0.2))
        sheet = c.color(r.uniform(0.3, 0.9, 3), 0.05)
        check = (((c.xx * 10).astype(int) + (c.yy * 10).astype(int)) % 2 == 0)[..., None]
        rgb = np.where(check, sheet, sheet * 0.8)
        c.paint(c.rect(y1 - h, y1, x0, x0 + w), BED, rgb)
        c.paint(c.rect(y1 - h - 0.05, y1 - h + 0.02, x0 + 0.02, x0 + 0.12), BED, np.ones_like(c.img) * 0.95)


def scene(seed: int, split: int, index: int, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(RGB uint8 image, uint8 label map) of one scene: a pure function of its arguments."""
    rng = np.random.default_rng([seed, split, index])
    c = Canvas(height, width, rng)
    (outdoor if rng.random() < 0.5 else indoor)(c)
    img = c.img * rng.uniform(0.8, 1.2) + rng.normal(0, 0.03, c.img.shape)
    return (np.clip(img, 0, 1) * 255).round().astype(np.uint8), c.label


def write(out: Path, seed: int, n_train: int, n_val: int, height: int, width: int) -> dict[str, int]:
    counts = {}
    for split, n in (("training", n_train), ("validation", n_val)):
        prefix, split_id = SPLITS[split]
        img_dir, ann_dir = out / "images" / split, out / "annotations" / split
        img_dir.mkdir(parents=True, exist_ok=True)
        ann_dir.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            img, label = scene(seed, split_id, i, height, width)
            name = f"ADE_{prefix}_{i + 1:08d}"
            Image.fromarray(img).save(img_dir / f"{name}.jpg", quality=92)
            Image.fromarray(label, mode="L").save(ann_dir / f"{name}.png")
        counts[split] = n
    return counts


def write_pool(out: Path, seed: int, n: int, height: int, width: int) -> None:
    """OUT/unlabelled: the training scenes (copied) and ``n`` scenes of seed + POOL_SEED_OFFSET,
    in the ImageNet layout (one folder, ``scenes``)."""
    train, val = out / "unlabelled" / "train" / "scenes", out / "unlabelled" / "val" / "scenes"
    train.mkdir(parents=True, exist_ok=True)
    val.mkdir(parents=True, exist_ok=True)
    for f in sorted((out / "images" / "training").glob("*.jpg")):
        (train / f.name).write_bytes(f.read_bytes())
    pool = seed + POOL_SEED_OFFSET
    for folder, split_id, count, prefix in ((train, 0, n, "pool"), (val, 1, POOL_VAL, "ADE_val")):
        for i in range(count):
            Image.fromarray(scene(pool, split_id, i, height, width)[0]).save(folder / f"{prefix}_{i + 1:08d}.jpg",
                                                                             quality=92)


def main(argv: list[str] | None = None) -> int:
    p = demo_parser("segmentation", "Write procedural scenes with per-pixel labels in the ADE20k layout "
                                    "(0 = other, 1..8 = the first 8 ADE20k classes).",
                    out_help="data root (becomes the ADEChallengeData2016 equivalent)")
    p.add_argument("--train", type=item_count, default=400, help="training images")
    p.add_argument("--val", type=item_count, default=100, help="validation images")
    p.add_argument("--height", type=int, default=72, help="image height in pixels")
    p.add_argument("--width", type=int, default=96, help="image width in pixels (ADE20k images are mostly landscape)")
    p.add_argument("--unlabelled", type=int, default=0, metavar="N",
                   help="also write OUT/unlabelled: the training scenes and N more without annotations, in the "
                        "ImageNet layout, for MIM pretraining (foundation compare labels' 'scenes'); default 0: none")
    a = p.parse_args(argv)
    if min(a.height, a.width) < 16 or a.train < 1 or a.val < 1 or a.unlabelled < 0:
        p.error("--height / --width must be >= 16, --train / --val >= 1 and --unlabelled >= 0")
    if not free_out("segmentation", a.out, a.force):
        return 2

    def make() -> dict[str, int]:
        counts = write(a.out, a.seed, a.train, a.val, a.height, a.width)
        if a.unlabelled:
            write_pool(a.out, a.seed, a.unlabelled, a.height, a.width)
        return counts

    counts, seconds = timed("segmentation", make)
    pool = f", and {a.train + a.unlabelled} unlabelled in {a.out / 'unlabelled'}" if a.unlabelled else ""
    print(f"wrote {counts['training']} training and {counts['validation']} validation scenes{pool} "
          f"({a.width}x{a.height}, {NUM_CLASSES} classes + other) to {a.out} in {seconds:.1f} s")
    print(f"  train: foundation train configs/segmentation/tiny.yaml tasks.segmentation.data_root={a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
