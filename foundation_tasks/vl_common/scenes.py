"""The demo's scenes: 1 to 3 coloured shapes on a light, noisy background, the objects they
hold, how they are drawn (``render``) and outlined (``outline``, COCO polygons), and the facts
the questions and statements ask about (counts, unique objects, spatial relations)."""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

COLORS = {"red": (215, 45, 40), "green": (40, 160, 60), "blue": (45, 85, 215),
          "yellow": (230, 200, 30), "purple": (145, 60, 185), "gray": (120, 120, 120)}
SHAPES = ("circle", "square", "triangle")
SPLIT_CODES = {"train": 0, "val": 1, "text": 2}
VQA_FIRST_IMAGE_ID = {"train": 1, "val": 1_000_000}  # COCO-style image ids of scene 0
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five")
SUPERSAMPLE = 4
RELATIONS = {"left": "to the left of", "right": "to the right of", "above": "above", "below": "below"}


@dataclass(frozen=True)
class Obj:
    color: str
    shape: str
    x: float  # centre, in [0, 1] of the image width / height (y grows downwards)
    y: float

    @property
    def name(self) -> str:
        return f"{self.color} {self.shape}"


# --------------------------------------------------------------------------- scenes


@dataclass(frozen=True)
class SceneSpec:
    radius: float = 0.16  # object radius, a fraction of the image side
    min_objects: int = 1
    max_objects: int = 3

    def __post_init__(self) -> None:
        if not 0.02 <= self.radius <= 0.2:
            raise ValueError(f"object radius {self.radius} must be in [0.02, 0.2] of the image side")
        if not 1 <= self.min_objects <= self.max_objects <= 5:
            raise ValueError(f"objects per scene: need 1 <= min ({self.min_objects}) <= max ({self.max_objects}) <= 5")


def make_scene(rng: np.random.Generator, spec: SceneSpec) -> list[Obj]:
    n, radius = int(rng.integers(spec.min_objects, spec.max_objects + 1)), spec.radius
    for _ in range(100):  # random placement can paint itself into a corner: start over
        objs: list[Obj] = []
        for _ in range(200):
            x, y = rng.uniform(radius, 1 - radius, 2)
            if all(math.hypot(x - o.x, y - o.y) > 2.6 * radius for o in objs):
                objs.append(Obj(str(rng.choice(list(COLORS))), str(rng.choice(SHAPES)), float(x), float(y)))
                if len(objs) == n:
                    return objs
    raise ValueError(f"cannot place {n} objects of radius {radius} without overlap; use smaller or fewer objects")


def render(objs: list[Obj], size: int, radius: float, rng: np.random.Generator) -> Image.Image:
    big = size * SUPERSAMPLE
    shade = int(rng.integers(215, 245))
    im = Image.new("RGB", (big, big), (shade, shade, shade - int(rng.integers(0, 15))))
    draw = ImageDraw.Draw(im)
    r = radius * big
    for o in objs:
        cx, cy = o.x * big, o.y * big
        if o.shape == "circle":
            draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=COLORS[o.color])
        elif o.shape == "square":
            s = r * 0.88
            draw.rectangle([cx - s, cy - s, cx + s, cy + s], fill=COLORS[o.color])
        else:
            draw.polygon([(cx, cy - r), (cx + r * 1.05, cy + r * 0.8), (cx - r * 1.05, cy + r * 0.8)], fill=COLORS[o.color])
    im = im.resize((size, size), Image.BOX)
    noise = rng.normal(0, 4, (size, size, 3))
    return Image.fromarray(np.clip(np.asarray(im, dtype=np.float64) + noise, 0, 255).astype(np.uint8))


def count(objs: list[Obj], color: str | None = None, shape: str | None = None) -> int:
    return sum(1 for o in objs if (color is None or o.color == color) and (shape is None or o.shape == shape))


def unique_by(objs: list[Obj], attr: str) -> list[Obj]:
    c = Counter(getattr(o, attr) for o in objs)
    return [o for o in objs if c[getattr(o, attr)] == 1]


def relation(a: Obj, b: Obj, rel: str, radius: float) -> bool | None:
    """Whether ``a`` is ``rel`` of ``b``; None when too close to say."""
    d = {"left": b.x - a.x, "right": a.x - b.x, "above": b.y - a.y, "below": a.y - b.y}[rel]
    return None if abs(d) < radius else d > 0


def outline(o: Obj, size: int, radius: float) -> list[float]:
    """The object's outline as a COCO polygon ``[x1, y1, x2, y2, ...]`` in pixels of a
    ``size``-pixel image: the shape ``render`` fills (a circle as a 32-gon)."""
    cx, cy, r = o.x * size, o.y * size, radius * size
    if o.shape == "circle":
        points = [(cx + r * math.cos(2 * math.pi * i / 32), cy + r * math.sin(2 * math.pi * i / 32)) for i in range(32)]
    elif o.shape == "square":
        s = r * 0.88
        points = [(cx - s, cy - s), (cx + s, cy - s), (cx + s, cy + s), (cx - s, cy + s)]
    else:
        points = [(cx, cy - r), (cx + r * 1.05, cy + r * 0.8), (cx - r * 1.05, cy + r * 0.8)]
    return [round(v, 2) for p in points for v in p]


CATEGORIES = [f"{c} {s}" for c in COLORS for s in SHAPES]  # COCO category ids 1..18, in this order
