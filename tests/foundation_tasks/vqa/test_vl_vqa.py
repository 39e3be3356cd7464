"""VQA: the official accuracy on hand-made examples, the VQA v2 reader's errors (each names
the file and the record), the fine-tuning checks of VQA and NLVR2, and the demo data generator."""
import itertools
import json
import re

import pytest

from foundation.config import ConfigError
from foundation_tasks.vl_common.images import DataError
from foundation_tasks.vl_common.demo import QUESTION_TEMPLATES, STATEMENTS, is_held_out
from foundation_tasks.vqa.metrics import (
    SOFT_SCORES, evaluate_results, normalize_answer, soft_score, vqa_accuracy, write_results,
)


def official_by_subsets(pred: str, answers: list[str]) -> float:
    """The formula written out: min(#humans who said it / 3, 1) over every 9 of the 10 humans."""
    subsets = list(itertools.combinations(range(len(answers)), len(answers) - 1))
    return sum(min(sum(answers[i] == pred for i in s) / 3, 1.0) for s in subsets) / len(subsets)


@pytest.mark.parametrize("m, expected", [(0, 0.0), (1, 0.3), (2, 0.6), (3, 0.9), (4, 1.0), (7, 1.0), (10, 1.0)])
def test_accuracy_by_number_of_humans(m, expected):
    answers = ["red"] * m + ["blue"] * (10 - m)
    assert vqa_accuracy("red", answers) == pytest.approx(expected)
    assert official_by_subsets("red", answers) == pytest.approx(expected)
    assert soft_score(m) == pytest.approx(expected)


def test_accuracy_hand_computed():
    # 3 of 10 say "red": leaving out one of them (3 subsets) leaves 2 -> 2/3; leaving out
    # one of the others (7 subsets) leaves 3 -> 1; mean (3 * 2/3 + 7) / 10 = 0.9
    assert vqa_accuracy("red", ["red"] * 3 + ["blue"] * 7) == pytest.approx(0.9)
    # mixed answers: 2 "2", 5 "3", 3 "4"
    answers = ["2", "2", "3", "3", "3", "3", "3", "4", "4", "4"]
    assert vqa_accuracy("2", answers) == pytest.approx((2 * 1 / 3 + 8 * 2 / 3) / 10)
    assert vqa_accuracy("4", answers) == pytest.approx(0.9)
    assert vqa_accuracy("3", answers) == 1.0 and vqa_accuracy("5", answers) == 0.0
    for pred in ("2", "3", "4", "7"):
        assert vqa_accuracy(pred, answers) == pytest.approx(official_by_subsets(pred, answers))


def test_normalisation_as_the_official_evaluator():
    assert normalize_answer("Two") == "2" and normalize_answer(" the Dog.\n") == "dog"
    assert normalize_answer("an apple") == "apple" and normalize_answer("yes!") == "yes"
    assert normalize_answer("dont") == "don’t"  # its contraction table, typographic apostrophe
    assert normalize_answer("1,000") == "1000" and normalize_answer("3.5") == "3.5"
    assert vqa_accuracy("Two", ["2"] * 10) == 1.0
    assert vqa_accuracy("The dog", ["dog"] * 6 + ["cat"] * 4) == 1.0
    # the official quirk: human answers are only punctuation-processed when they differ
    assert vqa_accuracy("dog's", ["dog's"] * 10) == 0.0
    assert vqa_accuracy("dog's", ["dog's"] * 9 + ["cat"]) == 1.0


def test_results_file_in_the_official_format(tmp_path):
    annotations = {
        1: {"answers": [{"answer": "yes"}] * 10, "answer_type": "yes/no"},
        2: {"answers": [{"answer": "2"}] * 2 + [{"answer": "3"}] * 8, "answer_type": "number"},
    }
    path = write_results(tmp_path / "results.json", [(1, "yes"), (2, "2")])
    assert json.loads(path.read_text()) == [{"question_id": 1, "answer": "yes"}, {"question_id": 2, "answer": "2"}]
    acc = evaluate_results(path, annotations)
    assert acc["overall"] == pytest.approx(100 * (1.0 + 0.6) / 2)
    assert acc["perAnswerType"] == {"number": pytest.approx(60.0), "yes/no": pytest.approx(100.0)}
    with pytest.raises(ValueError, match="question_id 7"):
        evaluate_results([{"question_id": 7, "answer": "x"}], annotations)
    assert SOFT_SCORES == (0.0, 0.3, 0.6, 0.9, 1.0)


# --------------------------------------------------------------------------- demo data and readers


@pytest.fixture
def demo(vl_demo):
    return vl_demo


def test_demo_layouts_and_determinism(demo, write_vl_demo, vl_demo_sizes):
    q = json.loads((demo / "vqa/v2_OpenEnded_mscoco_val2014_questions.json").read_text())["questions"]
    a = json.loads((demo / "vqa/v2_mscoco_val2014_annotations.json").read_text())["annotations"]
    assert len(q) == len(a) == 24 and all(len(x["answers"]) == 10 for x in a)
    assert {"question_type", "multiple_choice_answer", "answer_type", "image_id", "question_id"} <= set(a[0])
    assert (demo / f"vqa/val2014/COCO_val2014_{q[0]['image_id']:012d}.jpg").is_file()
    # held-out templates: in the evaluation split only
    train_q = json.loads((demo / "vqa/v2_OpenEnded_mscoco_train2014_questions.json").read_text())["questions"]
    fills = {"x": "red circles", "shape": "circle", "color": "red", "a": "red circle", "rel": "above", "b": "blue square"}
    assert not any(is_held_out(t.format(**fills)) for seen, _ in QUESTION_TEMPLATES.values() for t in seen)
    assert all(is_held_out(t.format(**fills)) for _, held in QUESTION_TEMPLATES.values() for t in held)
    held_statements = {t.split("{")[0] for _, (_, h) in STATEMENTS.items() for t in h}
    train_s = [json.loads(l) for l in (demo / "nlvr2/data/train.json").read_text().splitlines()]
    assert not any(s["sentence"].startswith(p) for s in train_s for p in held_statements)
    # a held-out phrasing is new, its words are not (as VQA v2's validation questions)
    assert not any(is_held_out(x["question"]) for x in train_q) and any(is_held_out(x["question"]) for x in q)
    assert not any(is_held_out(s["sentence"]) for s in train_s)
    vocabulary = lambda texts: {w for t in texts for w in re.findall(r"[a-z]+", t.lower())}  # noqa: E731
    for table in (QUESTION_TEMPLATES, STATEMENTS):
        train_words = vocabulary(t for seen, _ in table.values() for t in seen)
        assert vocabulary(t for _, held in table.values() for t in held) <= train_words
    assert {s["label"] for s in train_s} == {"True", "False"} and all("directory" in s for s in train_s)
    left = train_s[0]["identifier"].rsplit("-", 1)[0]
    assert (demo / f"nlvr2/images/train/{train_s[0]['directory']}/{left}-img1.png").is_file()
    # the same seed writes the same files
    again = write_vl_demo(**vl_demo_sizes)
    for rel in ("vqa/v2_mscoco_val2014_annotations.json", "nlvr2/data/dev.json", "text/train.txt",
                "coco/annotations/captions_train2014.json", "vqa/train2014/COCO_train2014_000000000003.jpg"):
        assert (demo / rel).read_bytes() == (again / rel).read_bytes(), rel


def test_demo_text_corpus_speaks_the_tasks_words(tmp_path):
    """The pretraining text holds questions and statements as well as captions, so masked
    language modeling sees every word the VQA questions and NLVR2 statements use (a word it
    never sees ends up as every other unseen word's twin); held-out phrasings stay out."""
    from foundation_tasks.vl_common.demo import SceneSpec, text_corpus

    text_corpus(tmp_path, "train", 3000, 0, SceneSpec())
    lines = (tmp_path / "text/train.txt").read_text().splitlines()
    assert len(lines) == 3000 and not any(is_held_out(t) for t in lines)
    assert sum(t.endswith("?") for t in lines) > 300 and sum(t.startswith("The left image") for t in lines) > 30
    words = lambda texts: {w for t in texts for w in re.findall(r"[a-z]+", re.sub(r"\{[a-z]+\}[a-z]*", "", t).lower())}  # noqa: E731
    task_words = words(t for table in (QUESTION_TEMPLATES, STATEMENTS) for seen, _ in table.values() for t in seen)
    assert len(task_words) > 50 and task_words <= words(lines)


def test_vqa_reader_errors_name_the_record(demo, vl_demo_copy, tmp_path):
    from foundation_tasks.vqa.data import VQADataset, read_answer_list, read_split

    data = vl_demo_copy
    questions = read_split(data / "vqa", data / "vqa", "train2014")
    assert len(questions) == 36 and len(questions[0].answers) == 10
    qfile = data / "vqa/v2_OpenEnded_mscoco_train2014_questions.json"
    doc = json.loads(qfile.read_text())
    # a malformed record: the question without its image_id
    bad = json.loads(json.dumps(doc))
    qid = bad["questions"][4]["question_id"]
    del bad["questions"][4]["image_id"]
    qfile.write_text(json.dumps(bad))
    with pytest.raises(DataError, match=rf"train2014_questions\.json: question {qid}: field 'image_id' is missing"):
        read_split(data / "vqa", data / "vqa", "train2014")
    # not JSON at all
    qfile.write_text(json.dumps(doc)[:-10])
    with pytest.raises(DataError, match="not valid JSON at line 1"):
        read_split(data / "vqa", data / "vqa", "train2014")
    qfile.write_text(json.dumps(doc))
    # an image referenced but missing
    first = doc["questions"][0]
    (data / f"vqa/train2014/COCO_train2014_{first['image_id']:012d}.jpg").unlink()
    with pytest.raises(DataError, match=rf"question {first['question_id']} \(image_id {first['image_id']}\): image not found"):
        read_split(data / "vqa", data / "vqa", "train2014")
    # an answer outside the vocabulary (a fixed answer list without "yes")
    questions = read_split(demo / "vqa", demo / "vqa", "train2014")
    vocab = tmp_path / "answer2label.txt"
    vocab.write_text("".join(json.dumps({"answer": a, "label": i}) + "\n" for i, a in enumerate(["no", "1", "2"])))
    answers = read_answer_list(vocab)
    target = next(q for q in questions if set(q.answers) == {"yes"})
    with pytest.raises(DataError, match=rf"question {target.question_id} .*none of its answers \['yes'\] is in the 3-answer"):
        VQADataset([target], answers, None, 16, None, train=True, out_of_vocab="error")
    with pytest.raises(DataError, match="no questions left"):
        VQADataset([target], answers, None, 16, None, train=True, out_of_vocab="skip")


def test_vqa_config_errors(demo, tmp_path):
    from foundation.config import build
    from foundation_tasks.vqa.task import VQAConfig

    cfg = build(VQAConfig, {"data_dir": str(demo / "vqa"), "min_answer_count": 1})
    assert "yes" in cfg.answers
    both = build(VQAConfig, {"data_dir": str(demo / "vqa"), "min_answer_count": 1, "vocab_splits": ["train2014", "val2014"]})
    assert set(cfg.answers) <= set(both.answers)
    strict = build(VQAConfig, {"data_dir": str(demo / "vqa"), "min_answer_count": 3})
    assert set(strict.answers) < set(cfg.answers)  # rarer majority answers left out
    with pytest.raises(ConfigError, match="field 'data_dir'"):
        build(VQAConfig, {})
    with pytest.raises(ConfigError, match="field 'out_of_vocab'"):
        build(VQAConfig, {"answers": ["yes"], "out_of_vocab": "ignore"})
    with pytest.raises(ConfigError, match="answer vocabulary file not found"):
        build(VQAConfig, {"answer_vocab": str(tmp_path / "nope.txt")})
    with pytest.raises(ConfigError, match="field 'head_init_std'"):
        build(VQAConfig, {"answers": ["yes"], "head_init_std": 0})
    with pytest.raises(ConfigError, match="field 'pool'"):
        build(VQAConfig, {"answers": ["yes"], "pool": "mean"})


def test_finetune_check_names_field_and_path(demo, tmp_path):
    import shutil

    from foundation.config import BackboneConfig, build
    from foundation_tasks.nlvr2.task import NLVR2, NLVR2Config
    from foundation_tasks.vqa.task import VQA, VQAConfig

    backbone = BackboneConfig(dim=32, depth=1, heads=2, ffn_dim=64, experts=["vision", "text"])
    common = {"img_size": 32, "patch_size": 8}
    NLVR2(build(NLVR2Config, {"data_dir": str(demo / "nlvr2"), **common}), backbone).check()
    with pytest.raises(ConfigError, match=r"field 'data_dir': .*data/test1\.json not found"):
        NLVR2(build(NLVR2Config, {"data_dir": str(demo / "nlvr2"), "eval_split": "test1", **common}), backbone).check()
    with pytest.raises(ConfigError, match="field 'data_dir': directory not found: .*demo NLVR2 to DIR/nlvr2"):
        NLVR2(build(NLVR2Config, {"data_dir": str(tmp_path / "none"), **common}), backbone).check()
    with pytest.raises(ConfigError, match="field 'pool': must be one of cls, max"):
        build(NLVR2Config, {"data_dir": str(demo / "nlvr2"), "pool": "mean", **common})
    vqa = build(VQAConfig, {"data_dir": str(demo / "vqa"), "min_answer_count": 1, **common})
    VQA(vqa, backbone).check()
    copy = tmp_path / "vqa"
    shutil.copytree(demo / "vqa", copy)
    cfg = build(VQAConfig, {"data_dir": str(copy), "min_answer_count": 1, **common})
    next(copy.glob("*val2014_annotations.json")).unlink()  # after the answer vocabulary was read
    with pytest.raises(ConfigError, match=r"field 'annotation_dir': .*val2014_annotations\.json not found"):
        VQA(cfg, backbone).check()


def test_demo_count_answers_are_balanced():
    import numpy as np

    from foundation_tasks.vl_common.demo import Obj, _noun

    scene = [Obj("red", "circle", 0.2, 0.2), Obj("red", "square", 0.5, 0.5), Obj("blue", "circle", 0.8, 0.8)]
    rng = np.random.default_rng(0)
    drawn = [_noun(rng, scene) for _ in range(3000)]
    for phrase, n in drawn[:50]:  # the count is the scene's
        color, _, shape = phrase.rpartition(" ")
        shape = shape.rstrip("s")
        if shape == "object":
            assert n == sum(o.color == color for o in scene)
        else:
            assert n == sum(o.shape == shape and color in ("", o.color) for o in scene)
    counts = np.bincount([n for _, n in drawn])  # achievable here: 0, 1, 2 - each about a third
    assert len(counts) == 3 and counts.min() > 800
