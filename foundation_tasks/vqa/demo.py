"""A second VQA and NLVR2 demo set in another style than ``foundation data make vl``, for
checking that the tiny VQA and NLVR2 recipes hold on data they were not tuned on.

    foundation data make vqa-shifted --out data/vqa-shifted            (~10 s)
    foundation data make vqa-shifted --style textured --out data/vqa-textured

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

``--style textured`` draws a third look, for checking what was tuned on the outlined one: four
other shapes again (hexagon, arrow, moon, heart), turned at random, six other colours, shaded
fills without outlines on a light mottled background, 2 to 5 objects, coarser JPEG, and
wordings of its own ("Which hue is the heart?", "The left panel holds exactly 2 arrows.").
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

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
    angle: float = 0.0  # the textured style's turn, in radians

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


def question(rng, things: list[Thing], family: str, held_out: bool, style: Style | None = None
             ) -> tuple[str, str] | None:
    """(question, right answer) of ``family`` about the scene, or None when it has none."""
    style = style or STYLES["outlined"]
    colors, shapes, relations = style.colors, style.shapes, style.relations
    options = style.templates[family][1 if held_out else 0]
    t = options[int(rng.integers(len(options)))]
    if family == "count":
        phrases = {f"{c} {style.item}s": count(things, color=c) for c in colors}
        phrases.update({f"{s}s": count(things, shape=s) for s in shapes})
        phrases.update({f"{c} {s}s": count(things, c, s) for c in colors for s in shapes})
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
                else [(c, s) for c in colors for s in shapes if not count(things, c, s)])
        c, s = pool[int(rng.integers(len(pool)))]
        return t.format(color=c, shape=s), "yes" if present else "no"
    named = unique_by(things, "name")
    if len(named) < 2:
        return None
    i, j = rng.choice(len(named), 2, replace=False)
    a, b = named[i], named[j]
    rel = str(rng.choice(["left", "right"] if "{side}" in t else list(relations)))
    d = {"left": b.x - a.x, "right": a.x - b.x, "above": b.y - a.y, "below": a.y - b.y}[rel]
    if abs(d) < max(a.r, b.r):  # too close to say
        return None
    return t.format(a=a.name, b=b.name, rel=relations[rel], side=rel), "yes" if d > 0 else "no"


def human_answers(rng, family: str, right: str, style: Style | None = None) -> list[str]:
    """10 answers, mostly ``right``, otherwise a plausible mistake of the same kind."""
    style = style or STYLES["outlined"]
    wrong = {"count": lambda: str(max(0, int(right) + int(rng.choice([-1, 1])))),
             "color": lambda: str(rng.choice([c for c in style.colors if c != right])),
             "shape": lambda: str(rng.choice([s for s in style.shapes if s != right]))}.get(
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


def noun(color: str | None, shape: str | None, n: int, item: str = "item") -> str:
    """``n`` objects of ``color`` / ``shape``, as the count questions name them: "orange star", "rings", "cyan items"."""
    word = f"{color} {shape}" if color and shape else shape or f"{color} {item}"
    return word if n == 1 else word + "s"


def side_of(a: Thing, b: Thing, rel: str) -> bool | None:
    """Whether ``a`` is ``rel`` (left, right, above, below) of ``b``; None when too close to say."""
    d = {"left": b.x - a.x, "right": a.x - b.x, "above": b.y - a.y, "below": a.y - b.y}[rel]
    return None if abs(d) < max(a.r, b.r) else d > 0


def statement(rng, left: list[Thing], right: list[Thing], held_out: bool, style: Style | None = None
              ) -> tuple[str, str] | None:
    """A true and a false statement about the pair that differ only in the objects they name (so
    the text alone is at chance), or None when this draw has no such two."""
    style = style or STYLES["outlined"]
    kind = str(rng.choice(list(style.statements)))
    phrases = ([(c, s) for c in style.colors for s in style.shapes], [(None, s) for s in style.shapes],
               [(c, None) for c in style.colors])
    return draw_statement(rng, left, right, kind, style.statements[kind][1 if held_out else 0], phrases,
                          style.relations, side_of,
                          lambda n, p: {"n": n, "verb": style.verbs[n != 1], "x": noun(*p, n, style.item),
                                        "xp": noun(*p, 2, style.item), "xs": noun(*p, 1, style.item)})


# --------------------------------------------------------------------------- the textured style
# A third look for checking a recipe tuned on the outlined style: other shapes (turned at random),
# colours and wordings again, shaded fills without outlines on a light mottled background, 2-5
# objects, coarser JPEG. Nothing in it is shared with the ``vl`` set or the outlined style.
TEXTURED_COLORS = {"teal": (0, 140, 135), "maroon": (125, 20, 45), "navy": (30, 40, 140),
                   "olive": (125, 125, 25), "coral": (245, 115, 85), "violet": (165, 95, 225)}
TEXTURED_SHAPES = ("hexagon", "arrow", "moon", "heart")
TEXTURED_TEMPLATES = dict(
    count=(["How many {x} appear?", "Count how many {x} appear.", "What number of {x} appear here?",
            "How many {x} does this scene hold?", "The scene holds how many {x}?", "Say how many {x} appear."],
           ["What number of {x} does this scene hold?", "Say how many {x} this scene holds."]),
    color=(["Which hue is the {shape}?", "Say the hue of the {shape}.", "The {shape} is which hue?",
            "What hue does the {shape} show?", "Hue of this {shape}?"],
           ["Say which hue the {shape} shows.", "Which hue does the {shape} show?"]),
    shape=(["Which figure is the {color} piece?", "Say which figure the {color} piece is.",
            "The {color} piece is which figure?", "What figure does the {color} piece make?",
            "Figure of this {color} piece?"],
           ["Say what figure the {color} piece makes.", "Which figure does the {color} piece make?"]),
    exist=(["Does this scene hold a {color} {shape}?", "Is any {color} {shape} present?", "Does a {color} {shape} appear?",
            "Do any {color} {shape}s appear here?", "Is there some {color} {shape} present?"],
           ["Do any {color} {shape}s appear in this scene?", "Is a {color} {shape} present here?"]),
    spatial=(["Does the {a} appear {rel} the {b}?", "Is the {a} positioned {rel} the {b}?",
              "Seen from the front, is the {a} {rel} the {b}?", "Does the {a} stand on the {side} of the {b}?"],
             ["Is the {a} standing {rel} the {b}?", "Does the {a} appear on the {side} of the {b}?"]),
)

TEXTURED_RELATIONS = {"left": "to the left of", "right": "to the right of", "above": "over", "below": "under"}
TEXTURED_STATEMENTS = dict(
    exist=(["The {side} panel holds a {xs}.", "A {xs} is present in the {side} panel."],
           ["In the {side} panel a {xs} is present."]),
    one=(["A {xs} is present in exactly one panel.", "One panel holds a {xs}, the other does not."],
         ["Exactly one panel holds a {xs}."]),
    both=(["Both panels hold a {xs}.", "A {xs} is present in each panel."], ["Each panel holds a {xs}."]),
    atleast=(["The {side} panel holds {n} or more {x}.", "At least {n} {x} are present in the {side} panel."],
             ["In the {side} panel {n} or more {x} are present."]),
    exact=(["The {side} panel holds exactly {n} {x}.", "Exactly {n} {x} {verb} present in the {side} panel."],
           ["In the {side} panel exactly {n} {x} {verb} present."]),
    more=(["The left panel holds more {xp} than the right panel.", "The right panel holds fewer {xp} than the left panel."],
          ["Fewer {xp} are present in the right panel than in the left panel."]),
    total=(["The two panels hold {n} {x} altogether.", "Together the panels hold {n} {x}."],
           ["Altogether {n} {x} {verb} present in the two panels."]),
    spatial=(["In the {side} panel, the {a} is {rel} the {b}.", "The {side} panel shows the {a} {rel} the {b}."],
             ["The {a} is {rel} the {b} in the {side} panel."]),
)



def make_textured_scene(rng: np.random.Generator) -> list[Thing]:
    n = int(rng.integers(2, 6))
    while True:
        things: list[Thing] = []
        for _ in range(300):
            r = float(rng.uniform(0.08, 0.13))
            x, y = rng.uniform(r, 1 - r, 2)
            if all(math.hypot(x - t.x, y - t.y) > 1.3 * (r + t.r) for t in things):
                things.append(Thing(str(rng.choice(list(TEXTURED_COLORS))), str(rng.choice(TEXTURED_SHAPES)),
                                    float(x), float(y), r, float(rng.uniform(0, 2 * math.pi))))
                if len(things) == n:
                    return things


_HEART = [(16 * math.sin(s) ** 3 / 16, (-(13 * math.cos(s) - 5 * math.cos(2 * s) - 2 * math.cos(3 * s)
                                         - math.cos(4 * s)) / 16 - 0.17)) for s in np.linspace(0, 2 * math.pi, 40)]
_OUTLINES = {"hexagon": [(math.cos(k * math.pi / 3), math.sin(k * math.pi / 3)) for k in range(6)],
             "arrow": [(-1, -0.3), (0.15, -0.3), (0.15, -0.75), (1, 0), (0.15, 0.75), (0.15, 0.3), (-1, 0.3)],
             "heart": _HEART}


def _figure(draw: ImageDraw.ImageDraw, t: Thing, side: int) -> None:
    """``t``'s silhouette (255) on a mask ``side`` px wide."""
    cx, cy, r = t.x * side, t.y * side, t.r * side
    c, s = math.cos(t.angle), math.sin(t.angle)
    if t.shape == "moon":  # a disc less a disc shifted along the turn
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=255)
        dx, dy = 0.55 * r * c, 0.55 * r * s
        draw.ellipse([cx + dx - r, cy + dy - r, cx + dx + r, cy + dy + r], fill=0)
        return
    draw.polygon([(cx + r * (px * c - py * s), cy + r * (px * s + py * c)) for px, py in _OUTLINES[t.shape]], fill=255)


def render_textured(things: list[Thing], size: int, rng: np.random.Generator) -> Image.Image:
    big = size * 2
    tint = rng.uniform(170, 235, 3)  # a light background, mottled, with grain
    blobs = Image.fromarray(np.clip(tint + rng.normal(0, 18, (5, 5, 3)), 0, 255).astype(np.uint8))
    ground = np.asarray(blobs.resize((big, big), Image.BICUBIC), dtype=np.float64) + rng.normal(0, 10, (big, big, 1))
    im = Image.fromarray(np.clip(ground, 0, 255).astype(np.uint8))
    light = np.linspace(1.15, 0.8, big)[:, None, None] * np.ones((1, big, 1))  # lit from above
    for t in things:
        mask = Image.new("L", (big, big), 0)
        _figure(ImageDraw.Draw(mask), t, big)
        base = np.asarray(TEXTURED_COLORS[t.color], dtype=np.float64) + rng.integers(-15, 16, 3)
        im.paste(Image.fromarray(np.clip(base * light, 0, 255).astype(np.uint8)), (0, 0), mask)
    return im.resize((size, size), Image.BILINEAR)


@dataclass(frozen=True)
class Style:
    colors: dict
    shapes: tuple
    templates: dict  # VQA question families: (training wordings, held-out wordings)
    statements: dict  # NLVR2 statement kinds, the same
    relations: dict
    make_scene: Callable
    render: Callable
    item: str = "item"  # the noun of colour-only phrases ("cyan items")
    verbs: tuple = ("appears", "appear")  # {verb} for one object, for several
    quality: int = 95  # JPEG quality of the VQA images
    codes: tuple = (7,)  # mixed into every generator seed, so styles draw apart


STYLES = {"outlined": Style(COLORS, SHAPES, TEMPLATES, STATEMENTS, RELATIONS, make_scene, render),
          "textured": Style(TEXTURED_COLORS, TEXTURED_SHAPES, TEXTURED_TEMPLATES, TEXTURED_STATEMENTS,
                            TEXTURED_RELATIONS, make_textured_scene, render_textured, item="piece",
                            verbs=("is", "are"), quality=75, codes=(7, 1))}
_HELD_OUT = [template_pattern(t) for st in STYLES.values() for table in (st.templates, st.statements)
             for _, held in table.values() for t in held]


def is_held_out(text: str) -> bool:
    """Whether a question or statement of this set (either style) uses a wording held out of training."""
    return any(p.match(text) for p in _HELD_OUT)


def write_nlvr2_split(out: Path, split: str, n_pairs: int, seed: int, size: int, style: Style) -> int:
    _, _, code = SPLITS[split]
    return write_nlvr2_pairs(out, "train" if split == "train" else "dev", n_pairs,
                             lambda k: np.random.default_rng([seed, 10 + code, k, *style.codes]), style.make_scene,
                             lambda things, rng: style.render(things, size, rng),
                             lambda rng, left, right, held_out: statement(rng, left, right, held_out, style))


def write_split(out: Path, split: str, n_images: int, per_image: int, seed: int, size: int, style: Style) -> int:
    coco_split, first_id, code = SPLITS[split]
    (out / "vqa" / coco_split).mkdir(parents=True, exist_ok=True)
    questions, annotations = [], []
    for k in range(n_images):
        rng = np.random.default_rng([seed, code, k, *style.codes])
        things = style.make_scene(rng)
        image_id = first_id + k
        style.render(things, size, rng).save(out / "vqa" / coco_split / f"COCO_{coco_split}_{image_id:012d}.jpg",
                                             quality=style.quality)
        asked: set[str] = set()
        for _ in range(50 * per_image):
            if len(asked) == per_image:
                break
            family = str(rng.choice(list(style.templates)))
            held_out = split == "val" and rng.random() < 0.5
            qa = question(rng, things, family, held_out, style)
            if qa is None or qa[0] in asked:
                continue
            q, right = qa
            entry = vqa_entry(image_id, image_id * 1000 + len(asked), q, right, human_answers(rng, family, right, style),
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
    p.add_argument("--style", choices=sorted(STYLES), default="outlined",
                   help="the look: outlined (the set the off-home-data results use) or textured (a third one)")
    a = p.parse_args(argv)
    style = STYLES[a.style]
    if a.image_size < 16:
        p.error("--image-size must be >= 16")
    if not free_out("vqa-shifted", a.out, a.force):
        return 2
    counts, seconds = timed("vqa-shifted", lambda: {
        **{split: write_split(a.out, split, n, a.questions_per_image, a.seed, a.image_size, style)
           for split, n in (("train", a.train_images), ("val", a.val_images))},
        **{f"nlvr2 {split}": write_nlvr2_split(a.out, split, n, a.seed, a.image_size, style)
           for split, n in (("train", a.nlvr2_train), ("val", a.nlvr2_dev))}})
    print(f"wrote {a.out} in {seconds:.1f} s: {counts['train']} train and {counts['val']} val questions, "
          f"{counts['nlvr2 train']} train and {counts['nlvr2 val']} dev statements")
    print(f"  {a.out}/vqa     VQA v2 layout, no object annotations -> configs/vl/tiny_vqa_unannotated.yaml "
          f"tasks.vqa.data_dir={a.out}/vqa")
    print(f"  {a.out}/nlvr2   NLVR2 layout (train / dev)            -> configs/vl/tiny_nlvr2_unannotated.yaml "
          f"tasks.nlvr2.data_dir={a.out}/nlvr2")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
