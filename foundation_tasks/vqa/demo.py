"""A second VQA and NLVR2 demo set in another style than ``foundation data make vl``, for
checking that the tiny VQA and NLVR2 recipes hold on data they were not tuned on.

    foundation data make vqa-shifted --out data/vqa-shifted            (~10 s)

Everything the recipes were tuned on changes: 1 to 4 objects of four other shapes (star,
diamond, cross, ring) in six other colours (each object's shade jittered), of different
sizes in one scene, outlined, on a dark striped gradient instead of a light plain
background; questions of the same five families (count, colour, shape, existence, spatial)
in wordings of their own, and no object annotations (the recipe's per-patch object labels
have nothing to read). Written in the VQA v2 layout: ``DIR/vqa/{train2014,val2014}/COCO_*.jpg``,
``v2_OpenEnded_mscoco_*_questions.json`` and ``v2_mscoco_*_annotations.json``; half of the
validation questions use held-out wordings (``question_type`` starting ``held-out:``).

NLVR2 (``DIR/nlvr2``, the NLVR2 layout as ``foundation data make vl`` writes it): pairs of
such scenes, each with one true and one false statement of real NLVR2's kinds (existence,
cardinality, coordination over the two pictures, comparison, total, spatial), in wordings of
their own (digits for numbers, "picture" for image), half of the dev pairs in held-out ones.
A pure function of (seed, split, index), like the other demo sets.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from foundation.engine.demo_cli import demo_parser, free_out, item_count, timed
from foundation_tasks.vl_common.demo import (draw_statement, template_pattern, vqa_entry, write_nlvr2_pairs,
                                             write_vqa_files)
from foundation_tasks.vl_common.scenes import count, unique_by  # any objects with .color / .shape / .name

DEMO_DATA = {"name": "vqa-shifted", "folder": "vqa-shifted"}  # foundation data make vqa-shifted

COLORS = {"orange": (240, 130, 20), "pink": (245, 120, 190), "cyan": (40, 200, 215),
          "brown": (130, 80, 40), "white": (235, 235, 235), "lime": (150, 230, 40)}
SHAPES = ("star", "diamond", "cross", "ring")
SPLITS = {"train": ("train2014", 1, 0), "val": ("val2014", 1_000_000, 1)}  # COCO split, first image id, seed code
SUPERSAMPLE = 4
# (family, training wordings, held-out wordings), none shared with ``foundation data make vl``
TEMPLATES = {
    "count": (["Count the {x}.", "What's the total of {x}?", "How many {x} do you count?", "Number of {x}?",
               "Give the count of {x}.", "Tell me how many {x} there are."],
              ["What total of {x} do you count?", "Tell me the number of {x}."]),
    "color": (["Tell me the colour of the {shape}.", "What's the {shape}'s colour?", "Colour of the {shape}?",
               "Name the colour of the {shape}.", "The {shape} has what colour?"],
              ["Name the {shape}'s colour.", "What's the colour of the {shape}?"]),
    "shape": (["Which form has the {color} item?", "Name the form of the {color} item.", "The {color} item is what form?",
               "Form of the {color} item?", "What's the {color} item's form?"],
              ["Tell me the form of the {color} item.", "What form has the {color} item?"]),
    "exist": (["Do you spot a {color} {shape}?", "Any {color} {shape} here?", "Is some {color} {shape} shown?",
               "Do you spot any {color} {shape}s?", "Is a {color} {shape} shown here?"],
              ["Any {color} {shape}s shown?", "Is some {color} {shape} here?"]),
    "spatial": (["Is the {a} on the {side} side of the {b}?", "Does the {a} lie {rel} the {b}?",
                 "Is the {a} found {rel} the {b}?", "Relative to the {b}, is the {a} {rel} it?"],
                ["Does the {a} sit {rel} the {b}?", "Is the {a} found on the {side} side of the {b}?"]),
}
ANSWER_TYPES = {"count": "number", "color": "other", "shape": "other", "exist": "yes/no", "spatial": "yes/no"}
RELATIONS = {"left": "left of", "right": "right of", "above": "higher than", "below": "lower than"}


@dataclass(frozen=True)
class Thing:
    color: str
    shape: str
    x: float  # centre in [0, 1] (y grows downwards)
    y: float
    r: float  # radius, a fraction of the side

    @property
    def name(self) -> str:
        return f"{self.color} {self.shape}"


def make_scene(rng: np.random.Generator) -> list[Thing]:
    n = int(rng.integers(1, 5))
    while True:  # sizes differ within a scene; start over when placement paints itself into a corner
        things: list[Thing] = []
        for _ in range(300):
            r = float(rng.uniform(0.09, 0.16))
            x, y = rng.uniform(r, 1 - r, 2)
            if all(math.hypot(x - t.x, y - t.y) > 1.3 * (r + t.r) for t in things):
                things.append(Thing(str(rng.choice(list(COLORS))), str(rng.choice(SHAPES)), float(x), float(y), r))
                if len(things) == n:
                    return things


def _star(cx, cy, r, points=5):
    return [(cx + (r if i % 2 == 0 else 0.45 * r) * math.sin(math.pi * i / points),
             cy - (r if i % 2 == 0 else 0.45 * r) * math.cos(math.pi * i / points)) for i in range(2 * points)]


def render(things: list[Thing], size: int, rng: np.random.Generator) -> Image.Image:
    big = size * SUPERSAMPLE
    base = rng.uniform(20, 90, 3)  # a dark background of random hue, lighter towards one corner
    ramp = np.linspace(0, 1, big)
    grad = base[None, None] + 45 * (ramp[:, None, None] * rng.uniform(0.3, 1) + ramp[None, :, None] * rng.uniform(0, 0.7))
    stripes = 10 * (((np.arange(big)[:, None] + np.arange(big)[None, :]) // (big // 8)) % 2)
    im = Image.fromarray(np.clip(grad + stripes[..., None], 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(im)
    for t in things:
        cx, cy, r = t.x * big, t.y * big, t.r * big
        fill = tuple(int(np.clip(c + rng.integers(-20, 21), 0, 255)) for c in COLORS[t.color])
        edge, width = (15, 15, 15), max(1, big // 64)
        if t.shape == "star":
            draw.polygon(_star(cx, cy, r), fill=fill, outline=edge, width=width)
        elif t.shape == "diamond":
            draw.polygon([(cx, cy - r), (cx + 0.75 * r, cy), (cx, cy + r), (cx - 0.75 * r, cy)], fill=fill,
                         outline=edge, width=width)
        elif t.shape == "cross":
            a = 0.35 * r
            draw.polygon([(cx - a, cy - r), (cx + a, cy - r), (cx + a, cy - a), (cx + r, cy - a), (cx + r, cy + a),
                          (cx + a, cy + a), (cx + a, cy + r), (cx - a, cy + r), (cx - a, cy + a), (cx - r, cy + a),
                          (cx - r, cy - a), (cx - a, cy - a)], fill=fill, outline=edge, width=width)
        else:
            draw.ellipse([cx - r, cy - r, cx + r, cy + r], outline=fill, width=int(0.4 * r))
    im = im.resize((size, size), Image.BOX)
    noise = rng.normal(0, 8, (size, size, 3))
    return Image.fromarray(np.clip(np.asarray(im, dtype=np.float64) + noise, 0, 255).astype(np.uint8))


def question(rng, things: list[Thing], family: str, held_out: bool) -> tuple[str, str] | None:
    """(question, right answer) of ``family`` about the scene, or None when it has none."""
    options = TEMPLATES[family][1 if held_out else 0]
    t = options[int(rng.integers(len(options)))]
    if family == "count":
        phrases = {f"{c} items": count(things, color=c) for c in COLORS}
        phrases.update({f"{s}s": count(things, shape=s) for s in SHAPES})
        phrases.update({f"{c} {s}s": count(things, c, s) for c in COLORS for s in SHAPES})
        n = sorted(set(phrases.values()))[int(rng.integers(len(set(phrases.values()))))]  # answers balanced
        names = sorted(p for p, k in phrases.items() if k == n)
        return t.format(x=names[int(rng.integers(len(names)))]), str(n)
    if family in ("color", "shape"):
        cands = unique_by(things, "shape" if family == "color" else "color")
        if not cands:
            return None
        o = cands[int(rng.integers(len(cands)))]
        return (t.format(shape=o.shape), o.color) if family == "color" else (t.format(color=o.color), o.shape)
    if family == "exist":  # half about an object in the scene, half about a kind it lacks
        present = bool(rng.random() < 0.5)
        pool = ([(o.color, o.shape) for o in things] if present
                else [(c, s) for c in COLORS for s in SHAPES if not count(things, c, s)])
        c, s = pool[int(rng.integers(len(pool)))]
        return t.format(color=c, shape=s), "yes" if present else "no"
    named = unique_by(things, "name")
    if len(named) < 2:
        return None
    i, j = rng.choice(len(named), 2, replace=False)
    a, b = named[i], named[j]
    rel = str(rng.choice(["left", "right"] if "{side}" in t else list(RELATIONS)))
    d = {"left": b.x - a.x, "right": a.x - b.x, "above": b.y - a.y, "below": a.y - b.y}[rel]
    if abs(d) < max(a.r, b.r):  # too close to say
        return None
    return t.format(a=a.name, b=b.name, rel=RELATIONS[rel], side=rel), "yes" if d > 0 else "no"


def human_answers(rng, family: str, right: str) -> list[str]:
    """10 answers, mostly ``right``, otherwise a plausible mistake of the same kind."""
    wrong = {"count": lambda: str(max(0, int(right) + int(rng.choice([-1, 1])))),
             "color": lambda: str(rng.choice([c for c in COLORS if c != right])),
             "shape": lambda: str(rng.choice([s for s in SHAPES if s != right]))}.get(
        family, lambda: "no" if right == "yes" else "yes")
    return [right if rng.random() < 0.85 else wrong() for _ in range(10)]


# NLVR2 statement kinds (Suhr et al. 2019, Table 3) as ``foundation data make vl`` has them, in wordings of
# their own: (training wordings, held-out wordings). {x}: {n} objects of a noun phrase; {xp} / {xs}: its
# plural / singular; {a} / {b}: objects by colour + shape; {verb}: "appears" / "appear" as {n} needs.
STATEMENTS = {
    "exist": (["A {xs} appears in the {side} picture.", "The {side} picture features a {xs}."],
              ["The {side} picture has a {xs} in it."]),
    "one": (["Just one picture features a {xs}.", "A {xs} appears in one picture but not in the other."],
            ["Only a single picture has a {xs} in it."]),
    "both": (["Each picture features a {xs}.", "A {xs} appears in both pictures."],
             ["Both pictures have a {xs} in them."]),
    "atleast": (["The {side} picture features {n} or more {x}.", "No fewer than {n} {x} are seen in the {side} picture."],
                ["The {side} picture has {n} or more {x} in it."]),
    "exact": (["The {side} picture features precisely {n} {x}.", "Precisely {n} {x} {verb} in the {side} picture."],
              ["The {side} picture has precisely {n} {x} in it."]),
    "more": (["The left picture features more {xp} than the right one.",
              "The right picture features fewer {xp} than the left one."],
             ["Fewer {xp} are seen in the right picture than in the left one."]),
    "total": (["Across both pictures, {n} {x} {verb}.", "The pictures feature {n} {x} altogether."],
              ["Altogether the pictures have {n} {x} in them."]),
    "spatial": (["In the {side} picture, the {a} sits {rel} the {b}.", "The {side} picture puts the {a} {rel} the {b}."],
                ["The {a} sits {rel} the {b} in the {side} picture."]),
}
_HELD_OUT = [template_pattern(t) for table in (TEMPLATES, STATEMENTS) for _, held in table.values() for t in held]


def is_held_out(text: str) -> bool:
    """Whether a question or statement of this set uses a wording held out of training."""
    return any(p.match(text) for p in _HELD_OUT)


PHRASES = ([(c, s) for c in COLORS for s in SHAPES], [(None, s) for s in SHAPES], [(c, None) for c in COLORS])


def noun(color: str | None, shape: str | None, n: int) -> str:
    """``n`` objects of ``color`` / ``shape``, as the count questions name them: "orange star", "rings", "cyan items"."""
    word = f"{color} {shape}" if color and shape else shape or f"{color} item"
    return word if n == 1 else word + "s"


def side_of(a: Thing, b: Thing, rel: str) -> bool | None:
    """Whether ``a`` is ``rel`` (left, right, above, below) of ``b``; None when too close to say."""
    d = {"left": b.x - a.x, "right": a.x - b.x, "above": b.y - a.y, "below": a.y - b.y}[rel]
    return None if abs(d) < max(a.r, b.r) else d > 0


def statement(rng, left: list[Thing], right: list[Thing], held_out: bool) -> tuple[str, str] | None:
    """A true and a false statement about the pair that differ only in the objects they name (so
    the text alone is at chance), or None when this draw has no such two."""
    kind = str(rng.choice(list(STATEMENTS)))
    return draw_statement(rng, left, right, kind, STATEMENTS[kind][1 if held_out else 0], PHRASES, RELATIONS,
                          side_of, lambda n, p: {"n": n, "verb": "appears" if n == 1 else "appear", "x": noun(*p, n),
                                                 "xp": noun(*p, 2), "xs": noun(*p, 1)})


def write_nlvr2_split(out: Path, split: str, n_pairs: int, seed: int, size: int) -> int:
    _, _, code = SPLITS[split]
    return write_nlvr2_pairs(out, "train" if split == "train" else "dev", n_pairs,
                             lambda k: np.random.default_rng([seed, 10 + code, k, 7]), make_scene,
                             lambda things, rng: render(things, size, rng), statement)


def write_split(out: Path, split: str, n_images: int, per_image: int, seed: int, size: int) -> int:
    coco_split, first_id, code = SPLITS[split]
    (out / "vqa" / coco_split).mkdir(parents=True, exist_ok=True)
    questions, annotations = [], []
    for k in range(n_images):
        rng = np.random.default_rng([seed, code, k, 7])
        things = make_scene(rng)
        image_id = first_id + k
        render(things, size, rng).save(out / "vqa" / coco_split / f"COCO_{coco_split}_{image_id:012d}.jpg", quality=95)
        asked: set[str] = set()
        for _ in range(50 * per_image):
            if len(asked) == per_image:
                break
            family = str(rng.choice(list(TEMPLATES)))
            held_out = split == "val" and rng.random() < 0.5
            qa = question(rng, things, family, held_out)
            if qa is None or qa[0] in asked:
                continue
            q, right = qa
            entry = vqa_entry(image_id, image_id * 1000 + len(asked), q, right, human_answers(rng, family, right),
                              ANSWER_TYPES[family], held_out)
            asked.add(q)
            questions.append(entry[0])
            annotations.append(entry[1])
    write_vqa_files(out / "vqa", coco_split, questions, annotations,
                    "foundation vqa-shifted demo data in the VQA v2 layout")
    return len(questions)


def main(argv: list[str] | None = None) -> int:
    p = demo_parser("vqa-shifted", __doc__.split("\n\n")[0], out_help="output directory (vqa/)")
    p.add_argument("--image-size", type=int, default=48, help="the tiny VQA recipe's input size")
    p.add_argument("--train-images", type=item_count, default=2000)
    p.add_argument("--val-images", type=item_count, default=300)
    p.add_argument("--questions-per-image", type=item_count, default=5)
    p.add_argument("--nlvr2-train", type=item_count, default=2000, help="training image pairs (two statements each)")
    p.add_argument("--nlvr2-dev", type=item_count, default=300)
    a = p.parse_args(argv)
    if a.image_size < 16:
        p.error("--image-size must be >= 16")
    if not free_out("vqa-shifted", a.out, a.force):
        return 2
    counts, seconds = timed("vqa-shifted", lambda: {
        **{split: write_split(a.out, split, n, a.questions_per_image, a.seed, a.image_size)
           for split, n in (("train", a.train_images), ("val", a.val_images))},
        **{f"nlvr2 {split}": write_nlvr2_split(a.out, split, n, a.seed, a.image_size)
           for split, n in (("train", a.nlvr2_train), ("val", a.nlvr2_dev))}})
    print(f"wrote {a.out} in {seconds:.1f} s: {counts['train']} train and {counts['val']} val questions, "
          f"{counts['nlvr2 train']} train and {counts['nlvr2 val']} dev statements")
    print(f"  {a.out}/vqa     VQA v2 layout, no object annotations -> configs/vl/tiny_vqa.yaml "
          f"tasks.vqa.data_dir={a.out}/vqa tasks.vqa.object_annotations=null")
    print(f"  {a.out}/nlvr2   NLVR2 layout (train / dev)            -> configs/vl/tiny_nlvr2.yaml "
          f"tasks.nlvr2.data_dir={a.out}/nlvr2")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
