"""VQA v2 at scale: the compact split (``Questions``: numpy arrays, answers as indices into a
string table) holds exactly what the per-question Python objects held, the dataset's targets
are the reference ``targets()``, each distinct answer string is normalised once, a split is
read once per process and file version, and the streamed json reader sees what ``json.load``
sees, with the same errors."""
import dataclasses
import json
import os
from collections import Counter, OrderedDict
from pathlib import Path

import numpy as np
import pytest

from foundation_tasks.vl_common.images import DataError


# --------------------------------------------------------------------------- the reference


def reference_split(annotation_dir: Path, data_dir: Path, split: str) -> list:
    """What ``read_split`` returned before the compact storage: one ``Question`` per question,
    from ``json.load`` of the whole files (the checks left out: these files are valid)."""
    from foundation_tasks.vqa.data import ANNOTATIONS, IMAGES, QUESTIONS, Question
    from foundation_tasks.vqa.metrics import normalize_answer

    qpath, apath = annotation_dir / QUESTIONS.format(split=split), annotation_dir / ANNOTATIONS.format(split=split)
    questions = [Question(r["question_id"], r["image_id"], r["question"],
                          data_dir / IMAGES.format(split=split, image_id=r["image_id"]),
                          record=f"{qpath}: question {r['question_id']}")
                 for r in json.loads(qpath.read_text())["questions"]]
    by_id = {r["question_id"]: r for r in json.loads(apath.read_text())["annotations"]}
    for q in questions:
        rec = by_id[q.question_id]
        q.answers = [a["answer"] for a in rec["answers"]]
        q.answer_type, q.multiple_choice_answer = rec.get("answer_type", ""), rec.get("multiple_choice_answer", "")
        if not isinstance(q.multiple_choice_answer, str) or not q.multiple_choice_answer:
            q.multiple_choice_answer = Counter(normalize_answer(a) for a in q.answers).most_common(1)[0][0]
    return questions


@pytest.fixture
def messy(vl_demo_copy) -> Path:
    """The demo's VQA with VQA v2's untidiness: answers in other cases and with punctuation,
    articles and number words, majority answers missing or empty, a non-string answer type,
    an annotation of no question and one given twice (the last counts), pretty-printed."""
    root = vl_demo_copy / "vqa"
    path = root / "v2_mscoco_train2014_annotations.json"
    doc = json.loads(path.read_text())
    rng = np.random.default_rng(0)
    variants = [str.upper, str.capitalize, lambda a: f"the {a}", lambda a: a + ".", lambda a: f" {a}!",
                lambda a: {"2": "two", "1": "One"}.get(a, a), lambda a: a + "'s", lambda a: "don't" if a == "no" else a]
    for i, rec in enumerate(doc["annotations"]):
        for a in rec["answers"]:
            if rng.random() < 0.3:
                a["answer"] = variants[rng.integers(len(variants))](a["answer"])
        if i % 7 == 1:
            del rec["multiple_choice_answer"]
        elif i % 7 == 2:
            rec["multiple_choice_answer"] = ""
        if i % 11 == 3:
            rec["answer_type"] = None
    doc["annotations"].append({**doc["annotations"][0], "question_id": 987654321})  # no such question
    doc["annotations"].append(json.loads(json.dumps(doc["annotations"][5])))
    doc["annotations"][5]["answers"] = [{"answer": "overwritten"}] * 10  # the later record of that question counts
    path.write_text(json.dumps(doc, indent=2))
    return root


def as_dicts(questions) -> list[dict]:
    return [dataclasses.asdict(q) for q in questions]


# --------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("data", ["demo", "messy"])
def test_compact_split_holds_what_the_question_objects_held(data, vl_demo, messy):
    from foundation_tasks.vqa import data as vqa_data
    from foundation_tasks.vqa.data import Questions, answer_vocabulary, read_split

    root = vl_demo / "vqa" if data == "demo" else messy
    questions = read_split(root, root, "train2014")
    reference = reference_split(root, root, "train2014")
    assert isinstance(questions, Questions) and isinstance(questions.question_id, np.ndarray)
    assert as_dicts(questions) == as_dicts(reference)
    assert as_dicts(questions[3:9]) == as_dicts(reference[3:9]) and questions[-1] == reference[-1]
    assert as_dicts(questions.take([5, 0, 2])) == as_dicts([reference[5], reference[0], reference[2]])
    assert as_dicts(Questions.from_questions(reference)) == as_dicts(reference)
    for min_count in (1, 2, 4):
        vocab = answer_vocabulary(questions, min_count)
        assert vocab == answer_vocabulary(reference, min_count)
    index = {a: i for i, a in enumerate(answer_vocabulary(reference, 2))}
    offsets, labels, counts = questions.targets(index)
    for i, q in enumerate(reference):
        want = vqa_data.targets(q.answers, index)
        got = labels[offsets[i]:offsets[i + 1]].tolist(), [vqa_data.soft_score(c) for c in counts[offsets[i]:offsets[i + 1]]]
        assert got == want, q.question_id
    if data == "messy":
        assert any(q.answer_type is None for q in questions) and all(q.answers != ["overwritten"] * 10 for q in questions)


def test_dataset_items_and_budgets_as_with_question_objects(messy):
    from foundation.config import build
    from foundation_tasks.vqa.data import Questions, VQADataset, read_split
    from foundation_tasks.vqa.task import VQAConfig

    class Tokens:
        def encode(self, text, max_len):
            return [len(text), max_len]

    def items(ds) -> list[dict]:
        ds.decoded.get = lambda path, load: type("Image", (), {"size": (1, 1)})()
        return [{k: v for k, v in ds[i].items() if k != "image"} for i in range(len(ds))]

    questions, reference = read_split(messy, messy, "train2014"), reference_split(messy, messy, "train2014")
    for fields in ({"min_answer_count": 1}, {"min_answer_count": 2, "out_of_vocab": "skip"},
                   {"min_answer_count": 1, "train_fraction": 0.3, "subset_seed": 4, "answer_type_weights": {"number": 2.0}}):
        cfg = build(VQAConfig, {"data_dir": str(messy), **fields})
        kept = cfg.labelled(questions)
        assert isinstance(kept, Questions) and as_dicts(kept) == as_dicts(cfg.labelled(reference))
        args = (cfg.answers, Tokens(), 16, lambda image: None, True, cfg.out_of_vocab)
        compact = VQADataset(kept, *args, answer_type_weights=cfg.answer_type_weights)
        listed = VQADataset(cfg.labelled(reference), *args, answer_type_weights=cfg.answer_type_weights)
        assert items(compact) == items(listed) and compact.skipped == listed.skipped
        assert as_dicts(compact.questions) == as_dicts(listed.questions)
    rare = build(VQAConfig, {"data_dir": str(messy), "min_answer_count": 3}).answers
    skipping = VQADataset(questions, rare, Tokens(), 16, None, True, "skip")
    assert skipping.skipped > 0 and skipping.skipped == VQADataset(reference, rare, Tokens(), 16, None, True, "skip").skipped


def test_each_distinct_answer_is_normalised_once(vl_demo, monkeypatch):
    from foundation.config import BackboneConfig, build
    from foundation_tasks.vqa import data as vqa_data, questions as vqa_questions
    from foundation_tasks.vqa.task import VQA, VQAConfig

    monkeypatch.setattr(vqa_data, "_SPLITS", OrderedDict())
    calls = Counter()
    normalize = vqa_data.normalize_answer

    def counted(text: str) -> str:
        calls[text] += 1
        return normalize(text)

    for module in (vqa_data, vqa_questions):
        monkeypatch.setattr(module, "normalize_answer", counted)
    root = vl_demo / "vqa"
    cfg = build(VQAConfig, {"data_dir": str(root), "min_answer_count": 1, "img_size": 16, "patch_size": 8})
    task = VQA(cfg, BackboneConfig(dim=32, depth=1, heads=2, experts=["vision", "text"]))
    dataset = task.train_dataset()
    docs = json.loads((root / "v2_mscoco_train2014_annotations.json").read_text())["annotations"]
    said = {a["answer"] for rec in docs for a in rec["answers"]} | {rec["multiple_choice_answer"] for rec in docs}
    assert len(dataset) == len(docs) and max(calls.values()) == 1
    assert set(calls) <= said | {""} and said <= set(calls)  # once per distinct string, not per answer (10 x)
    assert sum(calls.values()) < sum(len(rec["answers"]) for rec in docs) / 5


def test_a_split_is_read_once_per_version_of_its_files(vl_demo_copy, monkeypatch):
    from foundation.config import BackboneConfig, build
    from foundation_tasks.vqa import data as vqa_data
    from foundation_tasks.vqa.task import VQA, VQAConfig

    monkeypatch.setattr(vqa_data, "_SPLITS", OrderedDict())
    reads = []
    stream = vqa_data.read_json_records
    monkeypatch.setattr(vqa_data, "read_json_records", lambda path, *a, **k: reads.append(path.name) or stream(path, *a, **k))
    root = vl_demo_copy / "vqa"
    cfg = build(VQAConfig, {"data_dir": str(root), "min_answer_count": 1, "img_size": 16, "patch_size": 8})
    task = VQA(cfg, BackboneConfig(dim=32, depth=1, heads=2, experts=["vision", "text"]))
    first = task.train_dataset()
    assert sorted(reads) == ["v2_OpenEnded_mscoco_train2014_questions.json", "v2_mscoco_train2014_annotations.json"]
    assert vqa_data.read_split(root, root, "train2014") is vqa_data.read_split(root, root, "train2014")
    assert len(reads) == 2  # the vocabulary and the training set: one read
    path = root / "v2_mscoco_train2014_annotations.json"
    doc = json.loads(path.read_text())
    doc["annotations"][0]["answers"] = [{"answer": "changed"}] * 10
    path.write_text(json.dumps(doc))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert vqa_data.read_split(root, root, "train2014")[0].answers == ["changed"] * 10  # a new version: read again
    assert len(reads) == 4 and first.questions[0].answers != ["changed"] * 10


def test_a_test_split_without_annotations(vl_demo_copy):
    from foundation_tasks.vqa.data import VQADataset, read_split

    root = vl_demo_copy / "vqa"
    (root / "v2_mscoco_val2014_annotations.json").unlink()
    questions = read_split(root, root, "val2014", need_answers=False)
    assert all(q.answers is None and q.answer_type == "" and q.multiple_choice_answer == "" for q in questions)
    with pytest.raises(DataError, match=r"val2014_annotations\.json: file not found \(split 'val2014' needs its answers\)"):
        read_split(root, root, "val2014")  # the same files, known to lack answers
    data = VQADataset(questions, ["yes"], None, 16, None, train=False)
    assert len(data) == len(questions) and data.targets(0) == ([], [])


@pytest.mark.parametrize("chunk", [5, 64, 1 << 20])
def test_streamed_records_are_what_json_load_reads(tmp_path, chunk):
    from foundation_tasks.vl_common.official_json import read_json_records

    class Keep(list):
        def add(self, i, record):
            assert i == len(self)
            self.append(record)

    records = [{"question_id": 10 ** 12 + i, "answers": [{"answer": f"é{i} \"x\"\\"}] * 3, "f": 1.5e-3 * i,
                "n": None, "t": [True, False]} for i in range(40)] + [7, "s", [1, [2]], -0.25, 123456789]
    layouts = {"plain": json.dumps({"info": {"a": [1, 2]}, "annotations": records}),
               "pretty": json.dumps({"annotations": records, "info": "x" * 300}, indent=2),
               "compact": json.dumps({"annotations": records, "z": 1}, separators=(",", ":")),
               "repeated": '{"annotations": [1, 2], "annotations": ' + json.dumps(records) + "}",
               "empty": '{"annotations": []}', "spaces": ' \n{ "annotations" :\t[ 1 , 2 ]\n, "x":null }\n '}
    for name, text in layouts.items():
        path = tmp_path / f"{name}.json"
        path.write_text(text, encoding="utf-8")
        assert read_json_records(path, "annotations", Keep, chunk=chunk) == json.loads(text)["annotations"], name

    class Strict(Keep):
        def add(self, i, record):
            if record == 7:
                raise DataError(f"record {i} is 7")
            super().add(i, record)

    path = tmp_path / "bad.json"
    for text, error in [(layouts["plain"][:-30], "not valid JSON at line 1"), ('{"annotations": {}}', "with a list under"),
                        ("[1]", "with a list under 'annotations'"), ('{"x": 1}', "with a list under"),
                        (layouts["plain"] + " []", "not valid JSON"), (layouts["plain"], "record 40 is 7")]:
        path.write_text(text)
        with pytest.raises(DataError, match=error):
            read_json_records(path, "annotations", Strict, chunk=chunk)
    with pytest.raises(DataError, match="file not found"):
        read_json_records(tmp_path / "none.json", "annotations", Strict)


def test_a_record_error_waits_for_the_whole_file_to_parse(vl_demo_copy):
    """A bad record early in a file that is not JSON at its end: the file's error, as json.load gave it."""
    from foundation_tasks.vqa.data import read_split

    root = vl_demo_copy / "vqa"
    path = root / "v2_OpenEnded_mscoco_train2014_questions.json"
    doc = json.loads(path.read_text())
    del doc["questions"][1]["image_id"]
    path.write_text(json.dumps(doc)[:-5])
    with pytest.raises(DataError, match="not valid JSON at line 1"):
        read_split(root, root, "train2014")
    path.write_text(json.dumps(doc))
    with pytest.raises(DataError, match=rf"question {doc['questions'][1]['question_id']}: field 'image_id' is missing"):
        read_split(root, root, "train2014")
