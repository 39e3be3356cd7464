"""VQA v2 read from its official json layout (visualqa.org), as downloaded::

    ANNOTATION_DIR/v2_OpenEnded_mscoco_{split}_questions.json
        {"questions": [{"image_id": 1, "question": "What color ...?", "question_id": 1000}, ...], ...}
    ANNOTATION_DIR/v2_mscoco_{split}_annotations.json        (train2014 / val2014 only)
        {"annotations": [{"question_id": 1000, "image_id": 1, "question_type": "what color",
                          "answer_type": "other", "multiple_choice_answer": "red",
                          "answers": [{"answer": "red", "answer_confidence": "yes", "answer_id": 1}, x10]}, ...]}
    DATA_DIR/{split}/COCO_{split}_{image_id:012d}.jpg

The answer vocabulary is the normalised ``multiple_choice_answer``s of the training split
seen at least ``min_count`` times (9 gives VQA v2's 3,129 answers), most frequent first,
or an explicit list (BEiT-3's ``answer2label.txt``, or one answer per line). A question's
training target is the soft score (0.3 / 0.6 / 0.9 / 1.0, see ``metrics``) of every
vocabulary answer its humans gave. Problems are named with the file and the record: a
malformed json record, a question without annotation, an image that is missing, and (for
training, with ``out_of_vocab: error``) a question none of whose answers is in the vocabulary.

**At VQA v2's size** (443,757 training questions, 4.4 M human answers) a split is read and
checked once per process and file version (``read_split`` remembers it), its annotations
are parsed a record at a time (``official_json.read_json_records``: the parsed file is
never held), and its questions are kept as ``Questions``, a few numpy arrays (ids, offsets,
answers as indices into a table of the split's distinct answer strings) rather than a
Python object per question: DataLoader workers share those pages instead of copying them
as reference counts change. Each distinct answer string is normalised once.
"""
from __future__ import annotations

import json
import operator
import os
from array import array
from collections import Counter, OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from foundation.engine.data import item_seed
from foundation_tasks.vision_common.images import DecodedImages
from foundation_tasks.vl_common.images import DataError, load_image, transform_image
from foundation_tasks.vl_common.objects import Objects
from foundation_tasks.vl_common.official_json import read_json, read_json_records
from foundation_tasks.vl_common.text import EncodedTexts, Tokenizer, pad_texts
from foundation_tasks.vqa.metrics import SOFT_SCORES, normalize_answer, soft_score
from foundation_tasks.vqa.questions import Question, Questions, StringTable, _frozen, _gather, _type_code

__all__ = ["ANNOTATIONS", "IMAGES", "QUESTIONS", "ObjectLabels", "Question", "Questions", "StringTable", "VQADataset",
           "answer_counts", "answer_vocabulary", "collate", "read_answer_list", "read_json", "read_split", "targets"]

QUESTIONS = "v2_OpenEnded_mscoco_{split}_questions.json"
ANNOTATIONS = "v2_mscoco_{split}_annotations.json"
IMAGES = "{split}/COCO_{split}_{image_id:012d}.jpg"


def _field(rec: Any, name: str, kind: type | tuple, where: str) -> Any:
    if not isinstance(rec, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    if name not in rec:
        raise DataError(f"{where}: field {name!r} is missing")
    value = rec[name]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise DataError(f"{where}: field {name!r} must be {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


class _QuestionRecords:
    """The records of a questions file, checked and stored as they are parsed."""

    def __init__(self, path: Path):
        self.path, self.qids, self.iids, self.texts, self.seen = path, array("q"), array("q"), [], set()

    def add(self, i: int, rec: Any) -> None:
        if type(rec) is dict:  # the common case, checked at once
            qid, iid, text = rec.get("question_id"), rec.get("image_id"), rec.get("question")
            if type(qid) is int and type(iid) is int and type(text) is str and qid not in self.seen:
                return self._append(qid, iid, text, f"{self.path}: question {qid}")
        where = f"{self.path}: questions[{i}]"
        qid = _field(rec, "question_id", int, where)
        where = f"{self.path}: question {qid}"
        iid = _field(rec, "image_id", int, where)
        text = _field(rec, "question", str, where)
        if qid in self.seen:
            raise DataError(f"{where}: question_id appears twice")
        self._append(qid, iid, text, where)

    def _append(self, qid: int, iid: int, text: str, where: str) -> None:
        try:
            self.qids.append(qid)
        except OverflowError:
            raise DataError(f"{where}: question_id does not fit 64 bits") from None
        try:
            self.iids.append(iid)
        except OverflowError:
            self.qids.pop()
            raise DataError(f"{where}: image_id does not fit 64 bits") from None
        self.seen.add(qid)
        self.texts.append(text)


class _Numbering(dict):
    """string -> its number, numbered in order of first appearance (``numbering[s]``)."""

    def __missing__(self, key: str) -> int:
        n = self[key] = len(self)
        return n


_ANSWER = operator.itemgetter("answer")


class _AnnotationRecords:
    """The records of an annotations file: answers as numbers of ``strings``."""

    def __init__(self, path: Path, strings: _Numbering, types: list, type_ids: dict):
        self.path, self.strings, self.types, self.type_ids = path, strings, types, type_ids
        self.answer_ids, self.ends, self.majority, self.answer_type = array("i"), array("q"), array("i"), array("i")
        self.row_of: dict[int, int] = {}  # question_id -> record (the last one, as before)

    def add(self, i: int, rec: Any) -> None:
        texts = None
        if type(rec) is dict:  # the common case, checked at once
            qid, answers = rec.get("question_id"), rec.get("answers")
            if type(qid) is int and type(answers) is list and answers:
                try:
                    texts = list(map(_ANSWER, answers))
                    "".join(texts)  # every one a string (JSON has no str subclasses)
                except (TypeError, KeyError):
                    texts = None
        if texts is None:
            where = f"{self.path}: annotations[{i}]"
            qid = _field(rec, "question_id", int, where)
            where = f"{self.path}: question {qid}"
            answers = _field(rec, "answers", list, where)
            texts = [_field(a, "answer", str, f"{where}: answers[{j}]") for j, a in enumerate(answers)]
            if not texts:
                raise DataError(f"{where}: no answers")
        strings = self.strings
        self.answer_ids.extend(map(strings.__getitem__, texts))
        self.ends.append(len(self.answer_ids))
        majority = rec.get("multiple_choice_answer", "")
        self.majority.append(strings[majority] if type(majority) is str and majority else -1)
        atype = rec.get("answer_type", "")
        code = self.type_ids.get(atype) if type(atype) is str else None
        self.answer_type.append(code if code is not None else _type_code(atype, self.types, self.type_ids))
        self.row_of[qid] = len(self.ends) - 1


def _stamp(path: Path) -> Optional[tuple[int, int, int]]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


_SPLITS: "OrderedDict[tuple, tuple[tuple, Questions]]" = OrderedDict()  # read_split's, by files and version
_KEEP_SPLITS = 4


def read_split(annotation_dir: str | Path, data_dir: str | Path, split: str, image_pattern: str = IMAGES,
               need_answers: bool = True) -> Questions:
    """The questions of ``split`` with their answers when the annotations file exists
    (required when ``need_answers``); images are checked to exist. Read and checked once
    per process and version of the files (the same ``Questions`` is returned again)."""
    qpath = Path(annotation_dir) / QUESTIONS.format(split=split)
    apath = Path(annotation_dir) / ANNOTATIONS.format(split=split)
    key = (str(qpath), str(apath), str(data_dir), split, image_pattern)
    stamp = (_stamp(qpath), _stamp(apath))
    known = _SPLITS.get(key)
    if known is not None and known[0] == stamp and stamp[0] is not None:
        questions = known[1]
        _SPLITS.move_to_end(key)
    else:
        questions = _read_split(qpath, apath, data_dir, split, image_pattern, need_answers)
        _SPLITS[key] = (stamp, questions)
        while len(_SPLITS) > _KEEP_SPLITS:
            _SPLITS.popitem(last=False)
    if need_answers and not questions.has_answers.all():
        raise DataError(f"{apath}: file not found (split {split!r} needs its answers)")
    return questions


def _read_split(qpath: Path, apath: Path, data_dir: str | Path, split: str, image_pattern: str,
                need_answers: bool) -> Questions:
    read = read_json_records(qpath, "questions", lambda: _QuestionRecords(qpath))
    n = len(read.qids)
    qids, iids = np.frombuffer(read.qids, dtype=np.int64).copy(), np.frombuffer(read.iids, dtype=np.int64).copy()
    texts = StringTable.of(read.texts)
    del read
    strings = _Numbering({"": 0})
    types, type_ids = [], {}
    source = (str(qpath), str(data_dir), split, image_pattern)
    if apath.is_file():
        ann = read_json_records(apath, "annotations", lambda: _AnnotationRecords(apath, strings, types, type_ids))
        row_of = ann.row_of
        rows = np.fromiter((row_of.get(q, -1) for q in qids.tolist()), dtype=np.int64, count=n)
        del ann.row_of, row_of
        missing = np.flatnonzero(rows < 0)
        if len(missing):
            raise DataError(f"{qpath}: question {int(qids[missing[0]])}: no annotation in {apath}")
        ends = np.frombuffer(ann.ends, dtype=np.int64)
        index, answer_offsets = _gather(np.concatenate([[0], ends]), rows)
        answer_ids = np.frombuffer(ann.answer_ids, dtype=np.int32)[index]
        majority = np.frombuffer(ann.majority, dtype=np.int32)[rows]
        answer_type = np.frombuffer(ann.answer_type, dtype=np.int32)[rows]
        has_answers = np.ones(n, dtype=bool)
        del ann
        memo: dict[str, str] = {}

        def normalized(a: str) -> str:
            n = memo.get(a)
            if n is None:
                n = memo[a] = normalize_answer(a)
            return n

        if (majority < 0).any():  # no (or an empty) multiple_choice_answer: the humans' most common, normalised
            names = list(strings)
            for i in np.flatnonzero(majority < 0).tolist():
                said = Counter(normalized(names[j]) for j in answer_ids[answer_offsets[i]:answer_offsets[i + 1]].tolist())
                majority[i] = strings[said.most_common(1)[0][0]]
        table = StringTable.of(strings)
        table.memo = memo or None
    elif need_answers:
        raise DataError(f"{apath}: file not found (split {split!r} needs its answers)")
    else:
        table, answer_offsets, answer_ids = StringTable.of(strings), np.zeros(n + 1, dtype=np.int64), np.zeros(0, np.int32)
        has_answers, majority = np.zeros(n, dtype=bool), np.zeros(n, dtype=np.int32)
        answer_type = np.full(n, _type_code("", types, type_ids), dtype=np.int32)
    questions = Questions(qids, iids, texts, table, answer_offsets, answer_ids, has_answers, majority, types,
                          answer_type, source)
    _check_images(questions, data_dir, split, image_pattern)
    return questions


def _check_images(questions: Questions, data_dir: str | Path, split: str, image_pattern: str) -> None:
    """Each image once, in the order the questions first name them (VQA v2: 443,757 questions
    about 82,783 images)."""
    image_ids, first = np.unique(questions.image_id, return_index=True)
    order = np.argsort(first)
    root = str(data_dir)
    for iid, i in zip(image_ids[order].tolist(), first[order].tolist()):
        if not os.path.isfile(os.path.join(root, image_pattern.format(split=split, image_id=iid))):
            q = questions[i]
            raise DataError(f"{q.record} (image_id {q.image_id}): image not found: {q.image}")


# --------------------------------------------------------------------------- answers


def answer_counts(questions: Questions | Sequence[Question]) -> Counter:
    """How many questions have each normalised ``multiple_choice_answer``."""
    if isinstance(questions, Questions):
        return questions.majority_counts()
    return Counter(normalize_answer(q.multiple_choice_answer) for q in questions)


def vocabulary_of(counts: Counter, min_count: int) -> list[str]:
    """The answers counted at least ``min_count`` times, most frequent first (ties alphabetical)."""
    return sorted((a for a, n in counts.items() if n >= min_count and a), key=lambda a: (-counts[a], a))


def answer_vocabulary(questions: Questions | Sequence[Question], min_count: int) -> list[str]:
    """Normalised majority answers seen at least ``min_count`` times, most frequent first."""
    return vocabulary_of(answer_counts(questions), min_count)


def read_answer_list(path: str | Path) -> list[str]:
    """BEiT-3's ``answer2label.txt`` (json lines ``{"answer": ..., "label": i}`` in label
    order) or a plain list, one answer per line."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: answer vocabulary file not found")
    lines = [l for l in path.read_text(encoding="utf-8").splitlines() if l.strip()]
    if lines and lines[0].lstrip().startswith("{"):
        answers = []
        for n, line in enumerate(lines, 1):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{n}: not valid JSON ({e.msg})") from None
            if not isinstance(rec, dict) or rec.get("label") != n - 1 or not isinstance(rec.get("answer"), str):
                raise DataError(f"{path}:{n}: expected {{\"answer\": str, \"label\": {n - 1}}}, got {line!r}")
            answers.append(rec["answer"])
    else:
        answers = [l.strip() for l in lines]
    if len(set(answers)) != len(answers):
        raise DataError(f"{path}: an answer appears twice")
    return answers


def targets(answers: Sequence[str], index: dict[str, int]) -> tuple[list[int], list[float]]:
    """(vocabulary indices, soft scores) of the answers the humans gave."""
    counts = Counter(normalize_answer(a) for a in answers)
    labels = [index[a] for a in counts if a in index]
    return labels, [soft_score(counts[a]) for a in counts if a in index]


# --------------------------------------------------------------------------- dataset


@dataclass
class ObjectLabels:
    """Per-patch object labels of the images (``foundation_tasks.vl_common.objects``) at the model's size."""

    objects: Objects
    img_size: int
    patch_size: int

    def __post_init__(self) -> None:
        self._done: dict[int, torch.Tensor] = {}  # an image's labels, drawn once (VQA v2: ~5 questions an image)

    def __call__(self, q: Question, width: int, height: int) -> torch.Tensor:
        if q.image_id not in self._done:
            try:
                labels = self.objects.labels_of(q.image_id, width, height, self.img_size, self.patch_size)
            except DataError as e:
                raise DataError(f"{q.record}: {e}") from None
            self._done[q.image_id] = labels.to(torch.int16)  # COCO: 82,783 images x 576 patches, 95 MB
        return self._done[q.image_id].long()


class VQADataset(Dataset):
    """Items: image tensor, question token ids, soft targets, the human answers, the id (and,
    given ``objects``, the image's per-patch object labels; given ``answer_type_weights``, the
    question's weight in the answer loss). ``questions`` (a ``Questions``, or ``Question``
    objects) and the targets are kept in arrays, shared by DataLoader workers."""

    def __init__(self, questions: Questions | Sequence[Question], answers: Sequence[str], tokenizer: Tokenizer,
                 max_text_len: int, transform: Callable, train: bool, out_of_vocab: str = "error",
                 random_transform: bool = False, objects: Optional[ObjectLabels] = None,
                 answer_type_weights: Optional[dict[str, float]] = None, cache_images: bool = False):
        self.objects, self.weights = objects, answer_type_weights or None
        self.decoded, self.encode = DecodedImages(cache_images), EncodedTexts(tokenizer, max_text_len)
        self.index = {a: i for i, a in enumerate(answers)}
        self.tokenizer, self.max_text_len, self.transform = tokenizer, max_text_len, transform
        self.random_transform = random_transform  # seeded per item
        if not isinstance(questions, Questions):
            questions = Questions.from_questions(questions)
        offsets, labels, counts = questions.targets(self.index)
        self.skipped = 0
        if train:
            unanswerable = questions.has_answers & (np.diff(offsets) == 0)
            if unanswerable.any():
                if out_of_vocab == "error":
                    q = questions[int(np.flatnonzero(unanswerable)[0])]
                    raise DataError(
                        f"{q.record} ({q.question!r}): none of its answers {sorted(set(q.answers))} is in the "
                        f"{len(self.index)}-answer vocabulary (out_of_vocab: error; out_of_vocab: skip drops "
                        "such training questions, as BEiT-3 does)")
                self.skipped = int(unanswerable.sum())
                kept = np.flatnonzero(~unanswerable)
                questions = questions.take(kept)
                index, offsets = _gather(offsets, kept)
                labels, counts = labels[index], counts[index]
        if not len(questions):
            raise DataError("no questions left to train on (every one has answers outside the vocabulary)")
        self.questions = questions
        self.target_offsets, self.target_labels, self.target_counts = _frozen(offsets), _frozen(labels), _frozen(counts)

    def __len__(self) -> int:
        return len(self.questions)

    def targets(self, i: int) -> tuple[list[int], list[float]]:
        """(vocabulary indices, soft scores) of question ``i``'s answers, as ``targets()``."""
        a, b = self.target_offsets[i], self.target_offsets[i + 1]
        return self.target_labels[a:b].tolist(), [SOFT_SCORES[c] for c in self.target_counts[a:b].tolist()]

    def __getitem__(self, i: int) -> dict[str, Any]:
        q = self.questions[i]
        seed = item_seed(i, True) if self.random_transform else None
        pil = self.decoded.get(q.image, lambda: load_image(q.image, q.record))
        image = transform_image(self.transform, pil, seed, q.record)
        try:
            ids = self.encode(q.question)
        except ValueError as e:
            raise DataError(f"{q.record}: {e}") from None
        labels, scores = self.targets(i)
        item = {"image": image, "text": ids, "labels": labels, "scores": scores,
                "answers": q.answers or [], "answer_type": q.answer_type, "question_id": q.question_id}
        if self.objects is not None:
            item["object_labels"] = self.objects(q, *pil.size)
        if self.weights is not None:
            item["loss_weight"] = float(self.weights.get(q.answer_type, 1.0))
        return item


def collate(samples: list[dict], pad_id: int, num_answers: int) -> dict[str, Any]:
    ids, pad = pad_texts([s["text"] for s in samples], pad_id)
    target = torch.zeros(len(samples), num_answers)
    for row, s in enumerate(samples):
        if s["labels"]:
            target[row, torch.as_tensor(s["labels"])] = torch.as_tensor(s["scores"])
    batch = {
        "images": torch.stack([s["image"] for s in samples]),
        "text_ids": ids, "text_padding_mask": pad, "targets": target,
        "answers": [s["answers"] for s in samples],
        "answer_type": [s["answer_type"] for s in samples],
        "question_id": torch.as_tensor([s["question_id"] for s in samples]),
    }
    if "loss_weight" in samples[0]:
        batch["loss_weight"] = torch.tensor([s["loss_weight"] for s in samples])
    if "object_labels" in samples[0]:
        batch["object_labels"] = torch.stack([s["object_labels"] for s in samples])
    return batch
