"""``foundation data make vqa-shifted``: the second VQA and NLVR2 demo set, in the VQA v2 and
NLVR2 layouts our readers take, sharing no colour, shape or question / statement wording with
the ``vl`` demo set the recipes were tuned on, without object annotations, and the same files
for the same seed."""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from foundation_tasks.vl_common import demo as home
from foundation_tasks.vqa import demo as shifted
from foundation_tasks.nlvr2.data import read_split as read_nlvr2
from foundation_tasks.vqa.data import read_split


def make(out: Path, seed: int = 0, style: str = "outlined") -> Path:
    assert shifted.main(["--out", str(out), "--seed", str(seed), "--train-images", "30", "--val-images", "12",
                         "--nlvr2-train", "40", "--nlvr2-dev", "16", "--style", style]) == 0
    return out / "vqa"


def digest(root: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(root.rglob("*")):
        if f.is_file():
            h.update(f.relative_to(root).as_posix().encode() + f.read_bytes())
    return h.hexdigest()


def test_official_layout_read_by_our_reader(tmp_path):
    vqa = make(tmp_path / "a")
    for split, coco in (("train", "train2014"), ("val", "val2014")):
        questions = read_split(vqa, vqa, coco)
        assert len(questions) >= 4 * {"train": 30, "val": 12}[split]
        images = list((vqa / coco).glob(f"COCO_{coco}_*.jpg"))
        assert len(images) == {"train": 30, "val": 12}[split]
    assert not (tmp_path / "a" / "coco").exists()  # no object annotations for the recipe to lean on


def test_nothing_shared_with_the_home_set(tmp_path):
    vqa = make(tmp_path / "a")
    assert not set(shifted.COLORS) & set(home.COLORS) and not set(shifted.SHAPES) & set(home.SHAPES)
    texts = [q["question"] for split in ("train2014", "val2014")
             for q in json.loads((vqa / f"v2_OpenEnded_mscoco_{split}_questions.json").read_text())["questions"]]
    words = {w.strip("?.,'s") for t in texts for w in t.lower().split()}
    assert not words & (set(home.COLORS) | set(home.SHAPES) | {s + "s" for s in home.SHAPES})
    templates = lambda table: {t for groups in table.values() for group in groups for t in group}  # noqa: E731
    assert not templates(shifted.TEMPLATES) & templates(home.QUESTION_TEMPLATES)
    home_words = {w for table in home.QUESTION_TEMPLATES.values() for group in table for t in group
                  for w in t.lower().replace("?", "").split()}
    assert {"colour", "form", "spot", "total"} - home_words == {"colour", "form", "spot", "total"}


def test_held_out_wordings_only_in_validation(tmp_path):
    vqa = make(tmp_path / "a")
    held = {t for table in shifted.TEMPLATES.values() for t in table[1]}
    pattern = [t.split("{")[0] for t in held]
    train = json.loads((vqa / "v2_mscoco_train2014_annotations.json").read_text())["annotations"]
    val = json.loads((vqa / "v2_mscoco_val2014_annotations.json").read_text())["annotations"]
    assert not [a for a in train if a["question_type"].startswith("held-out")]
    assert 0.2 < sum(a["question_type"].startswith("held-out") for a in val) / len(val) < 0.8
    assert pattern  # the held-out templates exist for every family
    assert {a["answer_type"] for a in train} == {"number", "other", "yes/no"}


def test_same_seed_same_files(tmp_path):
    assert digest(make(tmp_path / "a")) == digest(make(tmp_path / "b"))
    assert digest(make(tmp_path / "c", seed=1)) != digest(tmp_path / "a" / "vqa")
    assert digest(tmp_path / "a" / "nlvr2") == digest(tmp_path / "b" / "nlvr2")


def test_nlvr2_pairs_in_the_layout_with_one_true_and_one_false_statement(tmp_path):
    root = make(tmp_path / "a").parent / "nlvr2"
    for split, pairs in (("train", 40), ("dev", 16)):
        statements = read_nlvr2(root, root, split)
        assert len(statements) == 2 * pairs
        by_pair = {}
        for st in statements:
            by_pair.setdefault(st.identifier.rsplit("-", 1)[0], []).append(st)
        for two in by_pair.values():  # the text alone is at chance: the two differ in the objects they name
            assert sorted(st.label for st in two) == [0, 1] and two[0].left == two[1].left
    texts = [st.sentence for split in ("train", "dev") for st in read_nlvr2(root, root, split)]
    home_templates = {t for groups in home.STATEMENTS.values() for group in groups for t in group}
    assert not {t for groups in shifted.STATEMENTS.values() for group in groups for t in group} & home_templates
    words = {w.strip(".,") for t in texts for w in t.lower().split()}
    assert not words & (set(home.COLORS) | set(home.SHAPES) | {s + "s" for s in home.SHAPES} | {"image", "images"})
    held = [re.compile(re.sub(r"\\\{[a-z]+\\\}", ".+", re.escape(t)) + "$")  # the held-out wordings
            for wordings in shifted.STATEMENTS.values() for t in wordings[1]]
    train = [st.sentence for st in read_nlvr2(root, root, "train")]
    assert not [t for t in train if any(p.match(t) for p in held)]
    assert any(p.match(st.sentence) for st in read_nlvr2(root, root, "dev") for p in held)
    dev = [st.sentence for st in read_nlvr2(root, root, "dev")]  # what the plain reference splits by
    assert [shifted.is_held_out(t) for t in train + dev] == [any(p.match(t) for p in held) for t in train + dev]
    assert not any(home.is_held_out(t) for t in dev)


@pytest.mark.parametrize("style, colors, shapes, exact, item, spatial", [
    ("outlined", ("orange", "cyan"), ("star", "ring"), r"The (left|right) picture features precisely (\d) (\w+)(?: (\w+?))?s?\.",
     "item", ("In the left picture, the orange star sits", "left of")),
    ("textured", ("teal", "navy"), ("moon", "heart"), r"The (left|right) panel holds exactly (\d) (\w+)(?: (\w+?))?s?\.",
     "piece", ("In the left panel, the teal moon is", "to the left of"))])
def test_nlvr2_statements_are_true_of_their_scenes(style, colors, shapes, exact, item, spatial):
    """Counting and spatial statements re-checked against the scenes by a reading of their own."""
    things = [shifted.Thing(colors[0], shapes[0], 0.2, 0.5, 0.1), shifted.Thing(colors[0], shapes[1], 0.8, 0.5, 0.1)]
    other = [shifted.Thing(colors[1], shapes[0], 0.5, 0.5, 0.1)]
    checked = 0
    for k in range(300):
        pair = shifted.statement(np.random.default_rng(k), things, other, held_out=False, style=shifted.STYLES[style])
        if pair is None:
            continue
        for text, truth in zip(pair, (True, False)):
            m = re.fullmatch(exact, text)
            if m:
                scene = things if m[1] == "left" else other
                color = m[3] if m[3] in shifted.STYLES[style].colors else None
                shape = (m[4] if m[4] else m[3]).rstrip("s")
                shape = None if shape == item else shape
                assert (shifted.count(scene, color, shape) == int(m[2])) is truth, text
                checked += 1
            if text.startswith(spatial[0]):
                assert (spatial[1] in text) is truth, text
                checked += 1
    assert checked >= 10


def test_refuses_a_full_folder(tmp_path, capsys):
    make(tmp_path / "a")
    assert shifted.main(["--out", str(tmp_path / "a")]) == 2
    assert "--force" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        shifted.main(["--out", str(tmp_path / "z"), "--image-size", "8"])


def test_the_textured_style_shares_nothing_with_the_other_two(tmp_path):
    vqa = make(tmp_path / "t", style="textured")
    tex, out = shifted.STYLES["textured"], shifted.STYLES["outlined"]
    taken = set(home.COLORS) | set(home.SHAPES) | set(out.colors) | set(out.shapes)
    assert not (set(tex.colors) | set(tex.shapes)) & taken
    templates = lambda table: {t for groups in table.values() for group in groups for t in group}  # noqa: E731
    for table, others in ((tex.templates, (home.QUESTION_TEMPLATES, out.templates)),
                          (tex.statements, (home.STATEMENTS, out.statements))):
        assert not templates(table) & set().union(*map(templates, others))
    questions = {split: json.loads((vqa / f"v2_OpenEnded_mscoco_{split}_questions.json").read_text())["questions"]
                 for split in ("train2014", "val2014")}
    sentences = [st.sentence for split in ("train", "dev") for st in read_nlvr2(vqa.parent / "nlvr2",
                                                                                 vqa.parent / "nlvr2", split)]
    texts = [q["question"] for qs in questions.values() for q in qs] + sentences
    words = {w.strip("?.,'s") for t in texts for w in t.lower().split()}
    assert not words & (taken | {s + "s" for s in taken})
    assert {w for w in words if w in tex.colors} == set(tex.colors)  # every colour and shape is asked about
    assert {w for w in words if w in tex.shapes} == set(tex.shapes)
    # held-out wordings only in validation, found by the one reader the plain reference uses
    train = [q["question"] for q in questions["train2014"]] + sentences[:80]
    assert not any(shifted.is_held_out(t) for t in train)
    assert 0.2 < np.mean([shifted.is_held_out(q["question"]) for q in questions["val2014"]]) < 0.8
    assert not any(home.is_held_out(t) for t in texts)
    with Image.open(next((vqa / "train2014").glob("*.jpg"))) as im:
        assert im.size == (48, 48) and im.mode == "RGB"
    assert digest(vqa) != digest(make(tmp_path / "o"))  # another look, not another seed of the same


def test_the_unannotated_configs_run_as_shipped(tmp_path, monkeypatch, capsys):
    """configs/vl/tiny_vqa_unannotated.yaml on the data its comment makes, then the NLVR2 config from
    that run's model by its default ``init_from``: a user's two commands, cut to a few steps."""
    from foundation.cli import main as cli

    repo = Path(__file__).resolve().parents[3]
    monkeypatch.chdir(tmp_path)
    make(tmp_path / "data" / "vqa-shifted", style="textured")
    short = ["train.steps=2", "train.batch_size=4", "eval.max_batches=1", "log.progress=false", "log.writers=[jsonl]"]
    assert cli(["train", str(repo / "configs/vl/tiny_vqa_unannotated.yaml"), *short]) == 0
    assert "vqa/vqa_accuracy" in capsys.readouterr().out
    assert cli(["train", str(repo / "configs/vl/tiny_nlvr2_unannotated.yaml"), *short]) == 0
    printed = capsys.readouterr().out
    assert "init_from" in printed and "nlvr2/accuracy" in printed
    assert (tmp_path / "checkpoints/nlvr2-tiny-unannotated-magneto/best/model.safetensors").is_file()
