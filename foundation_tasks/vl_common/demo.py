"""Embedded vision-language demo data: CLEVR-like scenes, questions, statements and
captions, written in the real data sets' layouts.

    foundation data make vl --out data/vl                       (~10 s)
    foundation data make vl --out DIR --image-size 64 --vqa-train 4000 --seed 1

A scene is 1 to 3 objects (``--objects``; 6 colours x 3 shapes, radius ``--object-size``
of the side) drawn at random, non-overlapping places on a light, slightly noisy
background; few, large objects, so that a tiny model trained for minutes on a CPU starts
to look at the image. Generated from it:

* VQA v2 layout (``DIR/vqa``): questions of five families (count, colour, shape,
  existence, spatial relation), each with 10 human answers (most are right, some are
  plausible mistakes, so soft scores matter), ``question_type`` / ``answer_type`` /
  ``multiple_choice_answer`` as in VQA v2. Images ``DIR/vqa/{train2014,val2014}/COCO_*.jpg``.
* NLVR2 layout (``DIR/nlvr2``): image pairs, each with one true and one false statement
  (so the text alone is at chance), ``data/{train,dev}.json`` (json lines),
  ``images/train/<directory>/*-img{0,1}.png`` and ``dev/*-img{0,1}.png``.
* COCO captions layout (``DIR/coco/annotations/captions_{train2014,val2014}.json``) over
  the VQA images, for image-text pretraining, and COCO instances
  (``DIR/coco/annotations/instances_{train2014,val2014}.json``: each object's polygon, box
  and category, one of the 18 colour x shape kinds, as COCO's 80 object classes), what the
  VQA recipe's per-patch object labels are read from; a text corpus (``DIR/text/{train,val}.txt``,
  one sentence per line) of descriptions of, questions about and statements on other scenes
  (no answers), for text-only MLM.

Every question family and statement kind has templates seen in training and held-out
templates that appear only in the evaluation split (half of its questions use one); the
``question_type`` of those starts with the held-out wording. As in VQA v2, whose validation
questions use the training questions' vocabulary, a held-out template is a new phrasing of
words the training templates use. Count questions draw their answer uniformly from the
counts the scene allows (so "1" is not most of the answers), in the spirit of VQA v2's balancing. Everything is a pure function
of (seed, split, index): the same seed writes the same files on any machine.
"""
from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

from foundation.engine.demo_cli import demo_parser, free_out, item_count, timed
from foundation_tasks.vl_common.scenes import (  # noqa: F401  (re-exported: the demo's scene vocabulary)
    CATEGORIES, COLORS, NUMBER_WORDS, RELATIONS, SHAPES, SPLIT_CODES, SUPERSAMPLE, VQA_FIRST_IMAGE_ID, Obj, SceneSpec,
    count, make_scene, outline, relation, render, unique_by,
)

DEMO_DATA = {"name": "vl", "folder": "vl"}  # foundation data make vl (engine/demo_cli.py)

# --------------------------------------------------------------------------- VQA questions

# (family, train templates, held-out templates); {x} is a plural noun phrase. As in VQA v2,
# whose validation questions use the training questions' words, a held-out template is a new
# phrasing made of words and word orders the training templates use (a model learns the words,
# never the phrasing). Each family has many training phrasings, as real questions do: with a
# handful, a model learns the templates instead of the words (e.g. "show" only in a count
# template would make the held-out "Does the image show any ...?" a count question).
QUESTION_TEMPLATES = {
    "count": (["How many {x} are there?", "How many {x} are in the picture?", "How many {x} are in the image?",
               "How many {x} can you see?", "How many {x} can you see in the picture?",
               "How many {x} does the image show?", "How many {x} does the picture contain?",
               "What is the number of {x} in the image?", "What is the number of {x}?",
               "In the image, how many {x} are there?", "How many {x} are visible?"],
              ["In the picture, how many {x} are there?", "How many {x} does the picture show?"]),
    "color": (["What color is the {shape}?", "What color is the {shape} in the image?", "What is the color of the {shape}?",
               "What is the color of the {shape} in the picture?", "Which color does the {shape} have?",
               "What color does the {shape} in the image have?", "In the picture, what color is the {shape}?",
               "Which color is the {shape}?", "The {shape} in the image is which color?"],
              ["The {shape} in the picture is which color?", "In the image, which color does the {shape} have?"]),
    "shape": (["What shape is the {color} object?", "What shape is the {color} thing?", "What is the shape of the {color} thing?",
               "What is the shape of the {color} object in the image?", "Which shape does the {color} object have?",
               "Which shape is the {color} thing in the picture?", "In the image, what shape is the {color} object?",
               "What shape does the {color} object in the image have?", "The {color} thing in the picture is which shape?"],
              ["What shape does the {color} thing in the picture have?", "The {color} object in the image is which shape?"]),
    "exist": (["Is there a {color} {shape}?", "Is there a {color} {shape} in the image?", "Is there a {color} {shape} in the picture?",
               "Are there any {color} {shape}s?", "Are there any {color} {shape}s in the picture?",
               "Does the picture contain a {color} {shape}?", "Does the image contain any {color} {shape}s?",
               "Does the picture show a {color} {shape}?", "Can you see a {color} {shape}?", "In the image, is there a {color} {shape}?",
               "Is a {color} {shape} visible?"],
              ["Does the image show any {color} {shape}s?", "Can you see any {color} {shape}s in the picture?"]),
    "spatial": (["Is the {a} {rel} the {b}?", "Is the {a} located {rel} the {b}?", "Would you say the {a} is {rel} the {b}?",
                 "In the image, is the {a} {rel} the {b}?", "Is the {a} {rel} the {b} in the picture?",
                 "Is the {a} placed {rel} the {b}?", "Would you say the {a} is located {rel} the {b}?",
                 "In the picture, is the {a} placed {rel} the {b}?"],
                ["In the picture, is the {a} located {rel} the {b}?", "Would you say the {a} is placed {rel} the {b} in the image?"]),
}
ANSWER_TYPES = {"count": "number", "color": "other", "shape": "other", "exist": "yes/no", "spatial": "yes/no"}


def _noun(rng, objs: list[Obj]) -> tuple[str, int]:
    """A plural noun phrase and how many objects it covers, the count drawn uniformly from the
    counts this scene's phrases can have (as VQA v2 balances answers: "1" is not most of them)."""
    phrases: dict[str, int] = {}
    for c in COLORS:
        phrases[f"{c} objects"] = count(objs, color=c)
        for s in SHAPES:
            phrases[f"{c} {s}s"] = count(objs, c, s)
    for s in SHAPES:
        phrases[f"{s}s"] = count(objs, shape=s)
    answers = sorted(set(phrases.values()))
    n = answers[int(rng.integers(len(answers)))]
    names = sorted(p for p, k in phrases.items() if k == n)
    return names[int(rng.integers(len(names)))], n


def question(rng, objs: list[Obj], family: str, held_out: bool, radius: float) -> tuple[str, str] | None:
    """(question, right answer) of ``family`` about the scene, or None when it has no such question."""
    templates = QUESTION_TEMPLATES[family][1 if held_out else 0]
    t = templates[int(rng.integers(len(templates)))]
    if family == "count":
        x, n = _noun(rng, objs)
        return t.format(x=x), str(n)
    if family == "color":
        cands = unique_by(objs, "shape")
        if not cands:
            return None
        o = cands[int(rng.integers(len(cands)))]
        return t.format(shape=o.shape), o.color
    if family == "shape":
        cands = unique_by(objs, "color")
        if not cands:
            return None
        o = cands[int(rng.integers(len(cands)))]
        return t.format(color=o.color), o.shape
    if family == "exist":
        if rng.random() < 0.5:
            o = objs[int(rng.integers(len(objs)))]
            return t.format(color=o.color, shape=o.shape), "yes"
        absent = [(c, s) for c in COLORS for s in SHAPES if not count(objs, c, s)]
        c, s = absent[int(rng.integers(len(absent)))]
        return t.format(color=c, shape=s), "no"
    named = unique_by(objs, "name") if len(objs) > 1 else []
    for _ in range(10):
        if len(named) < 2:
            return None
        i, j = rng.choice(len(named), 2, replace=False)
        rel = str(rng.choice(list(RELATIONS)))
        truth = relation(named[i], named[j], rel, radius)
        if truth is not None:
            return t.format(a=named[i].name, rel=RELATIONS[rel], b=named[j].name), "yes" if truth else "no"
    return None


def human_answers(rng, family: str, right: str, p_right: float = 0.88) -> list[str]:
    """10 answers: mostly ``right``, otherwise a plausible mistake of the same kind."""
    out = []
    for _ in range(10):
        if rng.random() < p_right:
            out.append(right)
        elif family == "count":
            out.append(str(max(0, int(right) + int(rng.choice([-1, 1])))))
        elif family == "color":
            out.append(str(rng.choice([c for c in COLORS if c != right])))
        elif family == "shape":
            out.append(str(rng.choice([s for s in SHAPES if s != right])))
        else:
            out.append("no" if right == "yes" else "yes")
    return out


def draw_scene(seed: int, split: str, k: int, spec: SceneSpec, size: int
               ) -> tuple[np.random.Generator, list[Obj], Image.Image]:
    """VQA image ``k`` of ``split`` as the generator draws it: the objects, the image, and the
    random generator where the questions about it continue (so a scene can be redrawn later)."""
    rng = np.random.default_rng([seed, SPLIT_CODES[split], k])
    objs = make_scene(rng, spec)
    return rng, objs, render(objs, size, spec.radius, rng)


def vqa_split(out: Path, split: str, coco_split: str, n_images: int, per_image: int, seed: int, size: int,
              spec: SceneSpec, id_offset: int) -> tuple[list[dict], list[tuple[int, list[Obj]]]]:
    radius = spec.radius
    img_dir = out / "vqa" / coco_split
    img_dir.mkdir(parents=True, exist_ok=True)
    questions, annotations, scenes = [], [], []
    for k in range(n_images):
        image_id = id_offset + k
        rng, objs, image = draw_scene(seed, split, k, spec, size)
        image.save(img_dir / f"COCO_{coco_split}_{image_id:012d}.jpg", quality=95)
        scenes.append((image_id, objs))
        made, asked = 0, set()
        for _ in range(50 * per_image):
            if made == per_image:
                break
            family = str(rng.choice(list(QUESTION_TEMPLATES)))
            held_out = split == "val" and rng.random() < 0.5
            qa = question(rng, objs, family, held_out, radius)
            if qa is None or qa[0] in asked:
                continue
            q, right = qa
            asked.add(q)
            entry = vqa_entry(image_id, image_id * 1000 + made, q, right, human_answers(rng, family, right),
                              ANSWER_TYPES[family], held_out)
            questions.append(entry[0])
            annotations.append(entry[1])
            made += 1
    write_vqa_files(out / "vqa", coco_split, questions, annotations, "foundation demo data in the VQA v2 layout")
    return annotations, scenes


def vqa_entry(image_id: int, qid: int, q: str, right: str, answers: list[str], answer_type: str,
              held_out: bool) -> tuple[dict, dict]:
    """A question and its annotation as VQA v2's files hold them; ``question_type`` is the
    first three words, prefixed ``held-out:`` for a held-out wording."""
    return {"image_id": image_id, "question": q, "question_id": qid}, {
        "question_type": ("held-out: " if held_out else "") + " ".join(q.lower().rstrip("?.").split()[:3]),
        "multiple_choice_answer": Counter(answers).most_common(1)[0][0],
        "answers": [{"answer": a, "answer_confidence": "yes" if a == right else "maybe", "answer_id": i + 1}
                    for i, a in enumerate(answers)],
        "image_id": image_id, "answer_type": answer_type, "question_id": qid,
    }


def write_vqa_files(vqa: Path, coco_split: str, questions: list[dict], annotations: list[dict],
                    description: str) -> None:
    """VQA v2's questions and annotations files of one split."""
    common = {"info": {"description": description, "version": "2.0"},
              "license": {"name": "generated", "url": ""}, "data_subtype": coco_split}
    _write_json(vqa / f"v2_OpenEnded_mscoco_{coco_split}_questions.json",
                {**common, "task_type": "Open-Ended", "data_type": "mscoco", "questions": questions})
    _write_json(vqa / f"v2_mscoco_{coco_split}_annotations.json",
                {**common, "data_type": "mscoco", "annotations": annotations})


# --------------------------------------------------------------------------- captions and text


def _listing(objs: list[Obj]) -> str:
    names = [f"a {o.name}" for o in objs]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def captions(rng, objs: list[Obj], radius: float, n: int) -> list[str]:
    """Up to ``n`` descriptions of a scene, each in a different style."""
    out = []
    for kind in rng.permutation(["list", "count", "relation", "color", "contains"]):
        o = objs[int(rng.integers(len(objs)))]
        if kind == "list":
            out.append(f"{_listing(objs)}.".capitalize())
        elif kind == "count":
            out.append(f"The picture contains {NUMBER_WORDS[len(objs)]} objects: {_listing(objs)}.")
        elif kind == "color":
            n_same = count(objs, shape=o.shape)
            out.append(f"The {o.shape} on the picture has a {o.color} color." if n_same == 1
                       else f"The number of {o.shape}s is {NUMBER_WORDS[n_same]}.")
        elif kind == "contains":
            others = len(objs) - 1
            out.append(f"The image contains a {o.name} and {NUMBER_WORDS[others]} other object{'s' * (others != 1)}.")
        elif len(objs) > 1:
            i, j = rng.choice(len(objs), 2, replace=False)
            rel = str(rng.choice(list(RELATIONS)))
            if relation(objs[i], objs[j], rel, radius):
                out.append(f"A {objs[i].name} is {RELATIONS[rel]} a {objs[j].name}.")
        if len(out) == n:
            break
    return out


def coco_captions(out: Path, coco_split: str, scenes, seed: int, radius: float) -> None:
    images, anns = [], []
    for image_id, objs in scenes:
        rng = np.random.default_rng([seed, 7, image_id])
        images.append({"id": image_id, "file_name": f"COCO_{coco_split}_{image_id:012d}.jpg", "height": 0, "width": 0})
        for c in captions(rng, objs, radius, 2):
            anns.append({"id": len(anns) + 1, "image_id": image_id, "caption": c})
    _write_json(out / "coco" / "annotations" / f"captions_{coco_split}.json",
                {"info": {"description": "foundation demo captions in the COCO layout"}, "images": images,
                 "annotations": anns, "licenses": []})


def coco_instances(out: Path, coco_split: str, scenes, size: int, radius: float) -> None:
    """COCO's ``instances_*.json`` over the VQA images: per object its polygon, box, area and
    category (the colour x shape kind; supercategory the shape)."""
    images, anns = [], []
    for image_id, objs in scenes:
        images.append({"id": image_id, "file_name": f"COCO_{coco_split}_{image_id:012d}.jpg", "height": size,
                       "width": size})
        for o in objs:
            poly = outline(o, size, radius)
            xs, ys = poly[0::2], poly[1::2]
            area = 0.5 * abs(sum(xs[i] * ys[i - 1] - xs[i - 1] * ys[i] for i in range(len(xs))))  # shoelace
            anns.append({"id": len(anns) + 1, "image_id": image_id, "category_id": CATEGORIES.index(o.name) + 1,
                         "segmentation": [poly], "area": round(area, 2), "iscrowd": 0,
                         "bbox": [round(min(xs), 2), round(min(ys), 2), round(max(xs) - min(xs), 2),
                                  round(max(ys) - min(ys), 2)]})
    categories = [{"id": i + 1, "name": name, "supercategory": name.split()[1]} for i, name in enumerate(CATEGORIES)]
    _write_json(out / "coco" / "annotations" / f"instances_{coco_split}.json",
                {"info": {"description": "foundation demo objects in the COCO instances layout"}, "images": images,
                 "annotations": anns, "categories": categories, "licenses": []})


def text_corpus(out: Path, name: str, lines: int, seed: int, spec: SceneSpec) -> None:
    """Sentences about other scenes, in every form the tasks' texts take, as a real text corpus
    holds questions and statements as well as descriptions: per two scenes, two captions of
    the first, a question about it and a statement about the pair (training phrasings only, no
    answers or labels). A corpus of captions alone leaves the words only questions use
    ("how", "many", "which", "there") to masked-language modeling's softmax, which pushes
    every word it never sees towards one shared vector (cosine 0.97 after 2,400 steps): a VQA
    model fine-tuned from it starts unable to tell "how many" from "is there"."""
    rng = np.random.default_rng([seed, SPLIT_CODES["text"], 0 if name == "train" else 1])
    text = []
    while len(text) < lines:
        first, second = make_scene(rng, spec), make_scene(rng, spec)
        text += captions(rng, first, spec.radius, 2)
        family = str(rng.choice(list(QUESTION_TEMPLATES)))
        for sentence in (question(rng, first, family, False, spec.radius), statement(rng, first, second, False, spec.radius)):
            if sentence is not None:
                text.append(sentence[0])
    path = out / "text" / f"{name}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(text[:lines]) + "\n")


# --------------------------------------------------------------------------- NLVR2 statements

# A noun phrase names objects by colour + shape, by shape or by colour: (colour, shape), None = any.
PHRASES = ([(c, s) for c in COLORS for s in SHAPES], [(None, s) for s in SHAPES], [(c, None) for c in COLORS])


def _np(color: str | None, shape: str | None, n: int) -> str:
    """The noun phrase for ``n`` objects of ``color`` / ``shape``: "red circle", "squares", "blue objects"."""
    word = f"{color} {shape}" if color and shape else shape or f"{color} object"
    return word if n == 1 else word + "s"


# The kinds of real NLVR2 sentences (Suhr et al. 2019, Table 3: existence, cardinality, universal
# / coordination over the two images, comparison, spatial relations inside one image).
# kind: (train templates, held-out templates: new phrasings of the training words). {x} / {xp} /
# {xs}: a noun phrase ({n} of them, plural, singular); {a} / {b}: objects by colour + shape.
STATEMENTS = {
    "exist": (["The {side} image contains a {xs}.", "There is a {xs} in the {side} image.", "The {side} image shows a {xs}."],
              ["There is at least one {xs} in the {side} image."]),
    "one": (["One image shows a {xs} and the other image does not.", "Only one of the two images has a {xs}.",
             "There is a {xs} in only one of the images."], ["Only one image contains a {xs}."]),
    "both": (["Both images contain a {xs}.", "Each image has at least one {xs}.", "There is a {xs} in each image."],
             ["In both images there is at least one {xs}."]),
    "atleast": (["The {side} image contains at least {n} {x}.", "There are at least {n} {x} in the {side} image.",
                 "The {side} image shows at least {n} {x}."], ["At least {n} {x} are in the {side} image."]),
    "exact": (["The {side} image contains exactly {n} {x}.", "There {be} exactly {n} {x} in the {side} image.",
               "In the {side} image there {be} exactly {n} {x}."], ["Exactly {n} {x} {be} in the {side} image."]),
    "more": (["There are more {xp} in the left image than in the right image.",
              "The right image has fewer {xp} than the left image.", "The left image has more {xp} than the right image."],
             ["The right image contains fewer {xp} than the left image."]),
    "total": (["There are {n} {x} in total.", "In total, the two images contain {n} {x}.",
               "The two images contain {n} {x} in total."], ["In total there are {n} {x} in the two images."]),
    "spatial": (["In the {side} image, a {a} is {rel} a {b}.", "The {side} image shows a {a} {rel} a {b}.",
                 "There is a {a} {rel} a {b} in the {side} image."], ["A {a} is {rel} a {b} in the {side} image."]),
}
COUNTING = ("atleast", "exact", "more", "total")  # a false statement names objects the pair has, when it can


def statement_truths(kind: str, n: int, left: list, right: list, side: str, phrases) -> dict[tuple, bool]:
    """Per noun phrase (colour, shape; None = any) of ``phrases``: whether the statement of ``kind``
    about ``n`` such objects (on ``side``) is true of the pair; for a counting kind, the phrases it
    is false of only where the pair has such objects, when it can (any objects with .color / .shape)."""
    scene = left if side == "left" else right
    truths, present = {}, {}
    for color, shape in phrases:
        cl, cr, cs = count(left, color, shape), count(right, color, shape), count(scene, color, shape)
        truths[color, shape] = {"exist": cs > 0, "one": (cl > 0) != (cr > 0), "both": cl > 0 and cr > 0,
                                "atleast": cs >= n, "exact": cs == n, "more": cl > cr, "total": cl + cr == n}[kind]
        present[color, shape] = (cs if kind in ("atleast", "exact") else cl + cr) > 0
    if kind in COUNTING and any(present[p] and not v for p, v in truths.items()):
        truths = {p: v for p, v in truths.items() if v or present[p]}
    return truths


def statement(rng, left: list[Obj], right: list[Obj], held_out: bool, radius: float) -> tuple[str, str] | None:
    """A true and a false statement about the pair that differ only in the objects they name
    (same kind, template, side and number), or None when this draw has no such two.

    The two share everything but the object words, and colours / shapes are symmetric, so the
    text alone is at chance; the image pair decides which statement is true."""
    kind = str(rng.choice(list(STATEMENTS)))
    return draw_statement(rng, left, right, kind, STATEMENTS[kind][1 if held_out else 0], PHRASES, RELATIONS,
                          lambda a, b, rel: relation(a, b, rel, radius),
                          lambda n, p: {"n": NUMBER_WORDS[n], "be": "is" if n == 1 else "are", "x": _np(*p, n),
                                        "xp": _np(*p, 2), "xs": _np(*p, 1)})


def draw_statement(rng, left: list, right: list, kind: str, templates: list[str], phrases: tuple,
                   relations: dict[str, str], relate: Callable, words: Callable) -> tuple[str, str] | None:
    """A true and a false statement of ``kind``: one of its ``templates`` filled in two ways, or None.
    ``phrases``: the noun phrases' three groups ((colour, shape), (None, shape), (colour, None));
    ``relate(a, b, rel)``: whether object ``a`` is ``rel`` of ``b`` (None: too close);
    ``words(n, (colour, shape))``: the template's fields for ``n`` objects of that noun phrase."""
    t = templates[int(rng.integers(len(templates)))]
    side = "left" if rng.random() < 0.5 else "right"
    scene = left if side == "left" else right
    if kind == "spatial":
        rel = str(rng.choice(list(relations)))
        named = unique_by(scene, "name")
        fills = [(a.name, b.name, relate(a, b, rel)) for a in named for b in named if a is not b]
        texts = {v: [t.format(side=side, a=a, rel=relations[rel], b=b) for a, b, truth in fills if truth is v]
                 for v in (True, False)}
    else:
        n = int(rng.integers(2, 4)) if kind == "atleast" else int(rng.integers(1, 5 if kind == "total" else 4))
        truths = statement_truths(kind, n, left, right, side, phrases[int(rng.integers(3))])
        texts = {v: [t.format(side=side, **words(n, p)) for p, truth in truths.items() if truth == v]
                 for v in (True, False)}
    if not texts[True] or not texts[False]:
        return None
    return tuple(texts[v][int(rng.integers(len(texts[v])))] for v in (True, False))


def nlvr2_split(out: Path, split: str, n_pairs: int, seed: int, size: int, spec: SceneSpec) -> int:
    return write_nlvr2_pairs(out, "train" if split == "train" else "dev", n_pairs,
                             lambda k: np.random.default_rng([seed, 10 + SPLIT_CODES[split], k]),
                             lambda rng: make_scene(rng, spec), lambda objs, rng: render(objs, size, spec.radius, rng),
                             lambda rng, left, right, held_out: statement(rng, left, right, held_out, spec.radius))


def write_nlvr2_pairs(out: Path, name: str, n_pairs: int, rng_for: Callable, make: Callable, draw: Callable,
                      say: Callable) -> int:
    """NLVR2 split ``name`` (train / dev) of ``n_pairs`` image pairs under ``out/nlvr2``: pair k's
    generator ``rng_for(k)``, its two scenes ``make(rng)``, their images ``draw(objs, rng)``, one
    true and one false statement ``say(rng, left, right, held_out)`` (None: draw again); half of
    the dev pairs in held-out wordings. Returns the number of statements."""
    records = []
    for k in range(n_pairs):
        rng = rng_for(k)
        scenes = [make(rng), make(rng)]
        directory = k % 100
        img_dir = out / "nlvr2" / (f"images/train/{directory}" if name == "train" else "dev")
        img_dir.mkdir(parents=True, exist_ok=True)
        prefix = f"{name}-{k}-0"
        for side, objs in enumerate(scenes):
            draw(objs, rng).save(img_dir / f"{prefix}-img{side}.png")
        held_out = name == "dev" and rng.random() < 0.5
        for _ in range(1000):  # one true and one false statement per pair, of one kind (real NLVR2: a
            pair = say(rng, *scenes, held_out)  # sentence is true of some pairs, false of others)
            if pair is not None:
                break
        else:
            raise ValueError(f"NLVR2 pair {k}: no true and false statement found")
        records += nlvr2_records(name, prefix, directory, pair, rng)
    return write_nlvr2_json(out, name, records)


def nlvr2_records(name: str, prefix: str, directory: int, pair: tuple[str, str], rng) -> list[dict]:
    """The two NLVR2 records of an image pair (its true and false statement, in a random order)."""
    records = []
    order = [True, False] if rng.random() < 0.5 else [False, True]
    for j, truth in enumerate(order):
        rec = {"identifier": f"{prefix}-{j}", "sentence": pair[0 if truth else 1], "label": str(truth),
               "left_url": "", "right_url": "", "writer": "demo", "synset": "", "query": "",
               "validation": {}, "extra_validations": {}}
        if name == "train":
            rec["directory"] = directory
        records.append(rec)
    return records


def write_nlvr2_json(out: Path, name: str, records: list[dict]) -> int:
    """``out/nlvr2/data/<name>.json``, json lines as NLVR2's; returns the number of records."""
    path = out / "nlvr2" / "data" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return len(records)


# --------------------------------------------------------------------------- held-out templates


def template_pattern(template: str) -> re.Pattern:
    """A regular expression matching the texts a template writes (its {fields} any text)."""
    parts = re.split(r"\{[a-z]+\}", template)
    return re.compile(".+".join(re.escape(p) for p in parts) + "$")


_HELD_OUT = [template_pattern(t) for table in (QUESTION_TEMPLATES, STATEMENTS) for _, held in table.values()
             for t in held]


def is_held_out(text: str) -> bool:
    """Whether a demo question or statement uses a template held out of training."""
    return any(p.match(text) for p in _HELD_OUT)


# the most specific template first: "There is a {a} {rel} a {b} in the {side} image." (spatial) also
# matches "There is a {xs} in the {side} image." (exist)
_KINDS = {name: [(kind, template_pattern(t)) for kind, t in sorted(
    ((kind, t) for kind, (train, held) in table.items() for t in train + held),
    key=lambda kt: -len(re.sub(r"\{[a-z]+\}", "", kt[1])))]
    for name, table in (("question", QUESTION_TEMPLATES), ("statement", STATEMENTS))}
_COLOR_WORD = re.compile(r"\b(?:%s)\b" % "|".join(COLORS))
_SHAPE_WORD = re.compile(r"\b(?:%s)s?\b" % "|".join(SHAPES))


def kind_of(text: str) -> str | None:
    """The family of a demo question (count, color, ...) or the kind of a demo statement
    (exist, total, ...); None for other text. For breaking a model's accuracy down."""
    table = _KINDS["statement" if text.rstrip().endswith(".") else "question"]
    return next((kind for kind, p in table if p.match(text)), None)


def names_objects_by(text: str) -> str:
    """How a demo text names objects: "colour + shape", "shape", "colour" or "-" (none)."""
    color, shape = bool(_COLOR_WORD.search(text)), bool(_SHAPE_WORD.search(text))
    return {(True, True): "colour + shape", (False, True): "shape", (True, False): "colour"}.get((color, shape), "-")


# --------------------------------------------------------------------------- writing


def _write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def write_dataset(out: Path, *, seed: int = 0, image_size: int = 48, vqa_train: int = 2000, vqa_val: int = 300,
                  questions_per_image: int = 5, nlvr2_train: int = 2000, nlvr2_dev: int = 300,
                  text_lines: int = 20000, scene: SceneSpec = SceneSpec()) -> dict[str, int]:
    r = scene.radius
    train_ann, train_scenes = vqa_split(out, "train", "train2014", vqa_train, questions_per_image, seed, image_size,
                                        scene, id_offset=VQA_FIRST_IMAGE_ID["train"])
    val_ann, val_scenes = vqa_split(out, "val", "val2014", vqa_val, questions_per_image, seed, image_size, scene,
                                    id_offset=VQA_FIRST_IMAGE_ID["val"])
    coco_captions(out, "train2014", train_scenes, seed, r)
    coco_captions(out, "val2014", val_scenes, seed, r)
    coco_instances(out, "train2014", train_scenes, image_size, r)
    coco_instances(out, "val2014", val_scenes, image_size, r)
    text_corpus(out, "train", text_lines, seed, scene)
    text_corpus(out, "val", max(1, text_lines // 20), seed, scene)
    return {
        "vqa train questions": len(train_ann), "vqa val questions": len(val_ann),
        "nlvr2 train statements": nlvr2_split(out, "train", nlvr2_train, seed, image_size, scene),
        "nlvr2 dev statements": nlvr2_split(out, "val", nlvr2_dev, seed, image_size, scene),
        "caption images": len(train_scenes) + len(val_scenes), "text lines": text_lines,
    }


def main(argv: list[str] | None = None) -> int:
    p = demo_parser("vl", __doc__.split("\n\n")[0], out_help="output directory (vqa/, nlvr2/, coco/, text/)",
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--image-size", type=int, default=48)
    p.add_argument("--vqa-train", type=item_count, default=2000, help="training images (questions-per-image questions each)")
    p.add_argument("--vqa-val", type=item_count, default=300)
    p.add_argument("--questions-per-image", type=item_count, default=5)
    p.add_argument("--nlvr2-train", type=item_count, default=2000, help="training image pairs (two statements each)")
    p.add_argument("--nlvr2-dev", type=item_count, default=300)
    p.add_argument("--text-lines", type=item_count, default=20000)
    p.add_argument("--objects", type=int, nargs=2, default=[1, 3], metavar=("MIN", "MAX"), help="objects per scene (<= 5)")
    p.add_argument("--object-size", type=float, default=0.16, help="object radius, a fraction of the image side")
    a = p.parse_args(argv)
    if a.image_size < 16:
        p.error("--image-size must be >= 16")
    try:
        scene = SceneSpec(a.object_size, *a.objects)
    except ValueError as e:
        p.error(str(e))
    if not free_out("vl", a.out, a.force):
        return 2
    counts, seconds = timed("vl", lambda: write_dataset(
        a.out, seed=a.seed, image_size=a.image_size, vqa_train=a.vqa_train, vqa_val=a.vqa_val,
        questions_per_image=a.questions_per_image, nlvr2_train=a.nlvr2_train, nlvr2_dev=a.nlvr2_dev,
        text_lines=a.text_lines, scene=scene))
    print(f"wrote {a.out} in {seconds:.1f} s: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    print(f"  {a.out}/vqa      VQA v2 layout (train2014 / val2014)     -> configs/vl/tiny_vqa.yaml")
    print(f"  {a.out}/nlvr2    NLVR2 layout (train / dev)              -> configs/vl/tiny_nlvr2.yaml")
    print(f"  {a.out}/coco     COCO captions layout (images in vqa/)    -> configs/vl/tiny_pretrain_pairs.yaml, tiny_pretrain.yaml")
    print(f"  {a.out}/coco     COCO instances (objects in vqa/ images)  -> configs/vl/tiny_vqa.yaml")
    print(f"  {a.out}/text     text corpus, one sentence per line      -> configs/vl/tiny_pretrain.yaml")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
