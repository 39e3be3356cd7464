"""Embedded demo data for the vision tasks: procedurally drawn scenes, ImageNet's layout.

    foundation data make vision --out data/vision-demo            (3000 + 500 images, ~10 s)
    foundation data make vision --out DIR --size 64 --train-per-class 500 --seed 1

Each image holds one object whose *shape* is the class (circle, ring, square, ...), drawn
near the centre at a random offset, size and rotation (within +-25 degrees), in a random colour (sometimes a texture: stripes,
checker, dots, gradient, smooth noise) over a random low-contrast textured background,
with a few thin distractor strokes. Colour, texture and background carry no class information, so
a model has to learn shape. Files are written as ImageNet's::

    DIR/train/<class>/<class>_00000.JPEG ...
    DIR/val/<class>/<class>_00000.JPEG ...

so the real ImageNet drops in by changing ``data_dir``. Every image is a pure function
of (seed, split, index): the same seed gives the same files on any machine.
``render_scene`` also returns the object's per-pixel mask for dense tasks.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from foundation.engine.demo_cli import demo_parser, free_out, item_count, timed

DEMO_DATA = {"name": "vision", "folder": "vision-demo"}  # foundation data make vision (engine/demo_cli.py)

CLASSES = ("circle", "ring", "square", "triangle", "star", "cross", "crescent", "heart", "arrow", "bowtie")
SPLITS = {"train": 0, "val": 1}
SUPERSAMPLE = 4  # shapes are drawn at 4x and box-filtered down: anti-aliased edges


# --------------------------------------------------------------------------- shapes


def _rotate(points: np.ndarray, theta: float) -> np.ndarray:
    c, s = math.cos(theta), math.sin(theta)
    return points @ np.array([[c, s], [-s, c]])


def _regular(n: int, inner: float | None = None) -> np.ndarray:
    """Unit regular n-gon, or an n-pointed star whose inner radius is ``inner``."""
    if inner is None:
        a = np.arange(n) * 2 * math.pi / n - math.pi / 2
        return np.stack([np.cos(a), np.sin(a)], 1)
    a = np.arange(2 * n) * math.pi / n - math.pi / 2
    r = np.where(np.arange(2 * n) % 2 == 0, 1.0, inner)
    return np.stack([r * np.cos(a), r * np.sin(a)], 1)


def _heart() -> np.ndarray:
    t = np.linspace(0, 2 * math.pi, 48, endpoint=False)
    x = 16 * np.sin(t) ** 3
    y = -(13 * np.cos(t) - 5 * np.cos(2 * t) - 2 * np.cos(3 * t) - np.cos(4 * t))
    pts = np.stack([x, y], 1)
    return (pts - pts.mean(0)) / 17.0


_POLYGONS = {
    "square": np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]]) * 0.78,
    "triangle": _regular(3) * 1.05,
    "star": _regular(5, inner=0.45),
    "cross": np.array([[-0.3, -1], [0.3, -1], [0.3, -0.3], [1, -0.3], [1, 0.3], [0.3, 0.3], [0.3, 1],
                       [-0.3, 1], [-0.3, 0.3], [-1, 0.3], [-1, -0.3], [-0.3, -0.3]]),
    "heart": _heart(),
    "arrow": np.array([[-1, -0.25], [0.2, -0.25], [0.2, -0.7], [1, 0], [0.2, 0.7], [0.2, 0.25], [-1, 0.25]]),
    "bowtie": np.array([[-1, -0.8], [0, 0], [-1, 0.8]]),  # with its mirror image, below
}


def shape_mask(name: str, size: int, cx: float, cy: float, radius: float, theta: float) -> np.ndarray:
    """Anti-aliased coverage in [0, 1], shape (size, size), of one object."""
    S = SUPERSAMPLE
    canvas = Image.new("L", (size * S, size * S), 0)
    draw = ImageDraw.Draw(canvas)
    c, r = np.array([cx, cy]) * S, radius * S

    def poly(points: np.ndarray, fill: int = 255) -> None:
        draw.polygon([tuple(p) for p in (_rotate(points, theta) * r + c)], fill=fill)

    def disc(center: np.ndarray, rad: float, fill: int = 255) -> None:
        draw.ellipse([center[0] - rad, center[1] - rad, center[0] + rad, center[1] + rad], fill=fill)

    if name == "circle":
        disc(c, r * 0.85)
    elif name == "ring":
        disc(c, r * 0.95)
        disc(c, r * 0.55, fill=0)
    elif name == "crescent":
        disc(c, r * 0.9)
        disc(c + _rotate(np.array([[0.45, -0.2]]), theta)[0] * r, r * 0.75, fill=0)
    elif name == "bowtie":
        poly(_POLYGONS["bowtie"])
        poly(_POLYGONS["bowtie"] * np.array([-1, 1]))
    else:
        poly(_POLYGONS[name])
    return np.asarray(canvas.resize((size, size), Image.BOX), dtype=np.float32) / 255.0


# --------------------------------------------------------------------------- textures


def _color(rng: np.random.Generator, value: tuple[float, float] = (0.25, 1.0)) -> np.ndarray:
    """A random RGB colour in [0, 1] of brightness (HSV value) in ``value``."""
    h, s, v = rng.random(), rng.uniform(0.3, 1.0), rng.uniform(*value)
    k = (np.array([5.0, 3.0, 1.0]) + h * 6) % 6
    return v - v * s * np.clip(np.minimum(k, 4 - k), 0, 1)


def texture(rng: np.random.Generator, size: int, c1: np.ndarray, c2: np.ndarray) -> np.ndarray:
    """(size, size, 3) in [0, 1]: one of solid / stripes / checker / dots / gradient / noise."""
    kind = rng.integers(6)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    angle = rng.uniform(0, math.pi)
    u = xx * math.cos(angle) + yy * math.sin(angle)
    v = -xx * math.sin(angle) + yy * math.cos(angle)
    freq = rng.uniform(3, 7)
    if kind == 0:
        t = np.zeros_like(xx)
    elif kind == 1:  # stripes
        t = (np.sin(2 * math.pi * freq * u) > 0).astype(np.float32)
    elif kind == 2:  # checker
        t = ((np.floor(u * freq) + np.floor(v * freq)) % 2).astype(np.float32)
    elif kind == 3:  # dots
        t = ((np.sin(2 * math.pi * freq * u) * np.sin(2 * math.pi * freq * v)) > 0.5).astype(np.float32)
    elif kind == 4:  # gradient
        t = (u - u.min()) / max(float(u.max() - u.min()), 1e-6)
    else:  # smooth noise: low-resolution noise, bilinearly enlarged
        low = rng.random((4, 4)).astype(np.float32)
        t = np.asarray(Image.fromarray(low).resize((size, size), Image.BILINEAR))
        t = (t - t.min()) / max(float(t.max() - t.min()), 1e-6)
    return c1 * (1 - t[..., None]) + c2 * t[..., None]


# --------------------------------------------------------------------------- scenes


def render_scene(rng: np.random.Generator, size: int, label: int) -> tuple[np.ndarray, np.ndarray]:
    """One scene: (uint8 RGB image (size, size, 3), object coverage (size, size) in [0, 1])."""
    # a bright object on a darker background, any hues: visible, and the same polarity
    bg1, bg2 = _color(rng, (0.1, 0.5)), _color(rng, (0.1, 0.5))
    fg1 = _color(rng, (0.7, 1.0))
    # most objects are one colour, some textured (two close colours); backgrounds are
    # low-contrast textures: the silhouette, i.e. the shape, stays the thing to see
    fg2 = fg1 if rng.random() < 0.6 else np.clip(fg1 + rng.uniform(-0.3, 0.3, 3), 0, 1)
    image = texture(rng, size, bg1, bg2 * 0.3 + bg1 * 0.7)
    # distractor strokes, behind the object
    strokes = Image.new("L", (size * SUPERSAMPLE,) * 2, 0)
    draw = ImageDraw.Draw(strokes)
    for _ in range(int(rng.integers(0, 3))):
        p = rng.uniform(0, size * SUPERSAMPLE, 4)
        draw.line(list(p), fill=255, width=max(1, int(size * SUPERSAMPLE * rng.uniform(0.02, 0.05))))
    a = np.asarray(strokes.resize((size, size), Image.BOX), dtype=np.float32)[..., None] / 255.0
    image = image * (1 - a) + _color(rng) * a
    # near the centre, large, mildly rotated: a tiny model learns the shapes in minutes
    radius = rng.uniform(0.32, 0.45) * size
    cx, cy = size / 2 + rng.uniform(-0.12, 0.12, 2) * size
    mask = shape_mask(CLASSES[label], size, cx, cy, radius, rng.uniform(-0.45, 0.45))
    image = image * (1 - mask[..., None]) + texture(rng, size, fg1, fg2) * mask[..., None]
    image = image + rng.normal(0, rng.uniform(0, 0.04), image.shape)  # sensor noise
    return (np.clip(image, 0, 1) * 255 + 0.5).astype(np.uint8), mask


def scene(seed: int, split: str, index: int, size: int, num_classes: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Image ``index`` of ``split``: (image, mask, label); classes take turns."""
    label = index % num_classes
    rng = np.random.default_rng([seed, SPLITS[split], index])
    image, mask = render_scene(rng, size, label)
    return image, mask, label


def write_dataset(out: Path, *, seed: int = 0, size: int = 32, train_per_class: int = 300,
                  val_per_class: int = 50, num_classes: int = len(CLASSES)) -> dict[str, int]:
    """Write the data set in ImageNet's layout; returns {split: number of images}."""
    if not 2 <= num_classes <= len(CLASSES):
        raise ValueError(f"num_classes must be in [2, {len(CLASSES)}] (got {num_classes})")
    if size < 8:
        raise ValueError(f"size must be >= 8 pixels (got {size})")
    counts = {}
    for split, per_class in (("train", train_per_class), ("val", val_per_class)):
        for name in CLASSES[:num_classes]:
            (out / split / name).mkdir(parents=True, exist_ok=True)
        n = per_class * num_classes
        for i in range(n):
            image, _, label = scene(seed, split, i, size, num_classes)
            name = CLASSES[label]
            Image.fromarray(image).save(out / split / name / f"{name}_{i // num_classes:05d}.JPEG",
                                        quality=95, subsampling=0)
        counts[split] = n
    return counts


def main(argv: list[str] | None = None) -> int:
    p = demo_parser("vision", "Write the vision demo data set (drawn shapes) in ImageNet's layout: "
                              "OUT/{train,val}/<class>/*.JPEG.")
    p.add_argument("--size", type=int, default=32, help="image side in pixels (default 32)")
    p.add_argument("--train-per-class", type=item_count, default=300)
    p.add_argument("--val-per-class", type=item_count, default=50)
    p.add_argument("--classes", type=int, default=len(CLASSES), help=f"number of classes, 2..{len(CLASSES)}")
    p.add_argument("--overwrite", dest="force", action="store_true", help="deprecated spelling of --force")
    a = p.parse_args(argv)
    if not free_out("vision", a.out, a.force):
        return 2
    done = timed("vision", lambda: write_dataset(a.out, seed=a.seed, size=a.size, train_per_class=a.train_per_class,
                                                 val_per_class=a.val_per_class, num_classes=a.classes),
                 (ValueError, OSError))
    if done is None:
        return 2
    counts, seconds = done
    print(f"wrote {counts['train']} train + {counts['val']} val images ({a.size}x{a.size}, {a.classes} classes: "
          f"{', '.join(CLASSES[:a.classes])}) to {a.out}/{{train,val}}/<class>/*.JPEG in {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
