"""The demo's NLVR2 statements: their truth on hand-made scenes, and a pair's true and false
statements differ only in the objects they name (so the text alone is at chance)."""
import json
import re
from collections import Counter

import numpy as np

from foundation_tasks.vl_common.demo import COLORS, SHAPES, STATEMENTS, Obj, statement

LEFT = [Obj("red", "circle", 0.2, 0.5), Obj("blue", "square", 0.8, 0.5)]  # red circle left of the blue square
RIGHT = [Obj("red", "circle", 0.5, 0.2), Obj("red", "triangle", 0.5, 0.8)]  # red circle above the red triangle
OBJECT_WORDS = re.compile(r"\b(?:%s)s?\b" % "|".join([*COLORS, *SHAPES, "object"]))


def phrase_count(scene, phrase):
    words = phrase.split()
    color = next((w for w in words if w in COLORS), None)
    shape = next((w.rstrip("s") for w in words if w.rstrip("s") in SHAPES), None)
    return sum(1 for o in scene if color in (None, o.color) and shape in (None, o.shape))


def draws(n=3000, held_out=False):
    rng = np.random.default_rng(0)
    for _ in range(n):
        pair = statement(rng, LEFT, RIGHT, held_out, 0.16)
        if pair is not None:
            yield pair


def test_statements_are_true_and_false_of_the_scenes():
    checked = Counter()
    side = {"left": LEFT, "right": RIGHT}
    for pair in draws():
        for text, truth in zip(pair, (True, False)):
            if m := re.fullmatch(r"The (left|right) image (?:contains|shows) a (\w+(?: \w+)?)\.", text):
                assert (phrase_count(side[m[1]], m[2]) > 0) == truth, text
                checked["exist"] += 1
            elif m := re.fullmatch(r"Both images contain a ([a-z ]+)\.", text):
                assert (phrase_count(LEFT, m[1]) > 0 and phrase_count(RIGHT, m[1]) > 0) == truth, text
                checked["both"] += 1
            elif m := re.fullmatch(r"Only one of the two images has a ([a-z ]+)\.", text):
                assert ((phrase_count(LEFT, m[1]) > 0) != (phrase_count(RIGHT, m[1]) > 0)) == truth, text
                checked["one"] += 1
            elif m := re.fullmatch(r"The (left|right) image contains exactly (\w+) ([a-z ]+)\.", text):
                n = ["zero", "one", "two", "three", "four", "five"].index(m[2])
                assert (phrase_count(side[m[1]], m[3]) == n) == truth, text
                checked["exact"] += 1
            elif m := re.fullmatch(r"There are more ([a-z ]+) in the left image than in the right image\.", text):
                assert (phrase_count(LEFT, m[1]) > phrase_count(RIGHT, m[1])) == truth, text
                checked["more"] += 1
            elif m := re.fullmatch(r"In the (left|right) image, a ([a-z]+ [a-z]+) is (.+) a ([a-z]+ [a-z]+)\.", text):
                want = {("left", "red circle", "to the left of", "blue square"), ("left", "blue square", "to the right of", "red circle"),
                        ("right", "red circle", "above", "red triangle"), ("right", "red triangle", "below", "red circle")}
                assert ((m[1], m[2], m[3], m[4]) in want) == truth, text
                checked["spatial"] += 1
    assert set(checked) == {"exist", "both", "one", "exact", "more", "spatial"} and min(checked.values()) > 5


def test_a_pairs_statements_differ_only_in_the_objects():
    kinds = Counter()
    for true, false in draws(600):
        assert true != false and OBJECT_WORDS.sub("X", true) == OBJECT_WORDS.sub("X", false)
        kinds[next(k for k, (seen, _) in STATEMENTS.items() if any(
            re.fullmatch(re.sub(r"\\\{\w+\\\}", ".+", re.escape(t)), true) for t in seen))] += 1
    assert set(kinds) == set(STATEMENTS)  # every kind occurs


def test_demo_pairs_have_one_true_and_one_false_statement(vl_demo):
    for name in ("train", "dev"):
        recs = [json.loads(line) for line in (vl_demo / f"nlvr2/data/{name}.json").read_text().splitlines()]
        by_pair = {}
        for r in recs:
            by_pair.setdefault(r["identifier"].rsplit("-", 1)[0], []).append(r)
        assert all(sorted(r["label"] for r in rs) == ["False", "True"] for rs in by_pair.values())
        assert len({r["label"] for r in recs if r["identifier"].endswith("-0")}) == 2  # the order is not the label


def test_every_template_has_its_own_kind():
    """kind_of (what benchmarks/vl_breakdown.py groups by) gives every demo question and
    statement template its family / kind, also where one template's words contain another's."""
    from foundation_tasks.vl_common.demo import QUESTION_TEMPLATES, kind_of, names_objects_by

    fill = dict(x="red circles", shape="circle", color="red", a="red circle", b="blue square", rel="above",
                side="left", n="two", be="are", xp="circles", xs="circle")
    for table in (QUESTION_TEMPLATES, STATEMENTS):
        for kind, (train, held_out) in table.items():
            for template in train + held_out:
                assert kind_of(template.format(**fill)) == kind, template
    assert kind_of("There is a red circle above a blue square in the left image.") == "spatial"
    assert kind_of("There is a red circle in the left image.") == "exist"
    assert kind_of("Hello there.") is None
    assert [names_objects_by(t) for t in ("Is there a red circle?", "How many squares are there?",
                                          "What shape is the blue thing?", "Hello.")] == [
        "colour + shape", "shape", "colour", "-"]
