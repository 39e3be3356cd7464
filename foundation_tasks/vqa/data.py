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
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
from torch.utils.data import Dataset

from foundation.engine.data import item_seed
from foundation_tasks.vision_common.images import DecodedImages
from foundation_tasks.vl_common.images import DataError, load_image, transform_image
from foundation_tasks.vl_common.objects import Objects
from foundation_tasks.vl_common.official_json import read_json
from foundation_tasks.vl_common.text import EncodedTexts, Tokenizer, pad_texts
from foundation_tasks.vqa.metrics import normalize_answer, soft_score

QUESTIONS = "v2_OpenEnded_mscoco_{split}_questions.json"
ANNOTATIONS = "v2_mscoco_{split}_annotations.json"
IMAGES = "{split}/COCO_{split}_{image_id:012d}.jpg"


@dataclass
class Question:
    question_id: int
    image_id: int
    question: str
    image: Path
    answers: Optional[list[str]] = None  # the humans' answers (None in test splits)
    answer_type: str = ""
    multiple_choice_answer: str = ""
    record: str = ""  # "FILE: question N" for error messages


# --------------------------------------------------------------------------- json


def _field(rec: Any, name: str, kind: type | tuple, where: str) -> Any:
    if not isinstance(rec, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    if name not in rec:
        raise DataError(f"{where}: field {name!r} is missing")
    value = rec[name]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise DataError(f"{where}: field {name!r} must be {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


def read_split(annotation_dir: str | Path, data_dir: str | Path, split: str, image_pattern: str = IMAGES,
               need_answers: bool = True) -> list[Question]:
    """The questions of ``split`` with their answers when the annotations file exists
    (required when ``need_answers``); images are checked to exist."""
    qpath = Path(annotation_dir) / QUESTIONS.format(split=split)
    apath = Path(annotation_dir) / ANNOTATIONS.format(split=split)
    questions = []
    seen: set[int] = set()
    for i, rec in enumerate(read_json(qpath, "questions")):
        where = f"{qpath}: questions[{i}]"
        qid = _field(rec, "question_id", int, where)
        where = f"{qpath}: question {qid}"
        iid = _field(rec, "image_id", int, where)
        text = _field(rec, "question", str, where)
        if qid in seen:
            raise DataError(f"{where}: question_id appears twice")
        seen.add(qid)
        image = Path(data_dir) / image_pattern.format(split=split, image_id=iid)
        questions.append(Question(qid, iid, text, image, record=where))
    if apath.is_file():
        by_id = {}
        for i, rec in enumerate(read_json(apath, "annotations")):
            where = f"{apath}: annotations[{i}]"
            qid = _field(rec, "question_id", int, where)
            where = f"{apath}: question {qid}"
            answers = _field(rec, "answers", list, where)
            texts = [_field(a, "answer", str, f"{where}: answers[{j}]") for j, a in enumerate(answers)]
            if not texts:
                raise DataError(f"{where}: no answers")
            by_id[qid] = (texts, rec.get("answer_type", ""), rec.get("multiple_choice_answer", ""), where)
        for q in questions:
            if q.question_id not in by_id:
                raise DataError(f"{q.record}: no annotation in {apath}")
            q.answers, q.answer_type, q.multiple_choice_answer, _ = by_id[q.question_id]
            if not isinstance(q.multiple_choice_answer, str) or not q.multiple_choice_answer:
                q.multiple_choice_answer = Counter(normalize_answer(a) for a in q.answers).most_common(1)[0][0]
    elif need_answers:
        raise DataError(f"{apath}: file not found (split {split!r} needs its answers)")
    present: set[Path] = set()
    for q in questions:  # each image once (VQA v2: 443,757 questions about 82,783 images)
        if q.image not in present:
            if not q.image.is_file():
                raise DataError(f"{q.record} (image_id {q.image_id}): image not found: {q.image}")
            present.add(q.image)
    return questions


# --------------------------------------------------------------------------- answers


def answer_vocabulary(questions: Sequence[Question], min_count: int) -> list[str]:
    """Normalised majority answers seen at least ``min_count`` times, most frequent first."""
    counts = Counter(normalize_answer(q.multiple_choice_answer) for q in questions)
    return sorted((a for a, n in counts.items() if n >= min_count and a), key=lambda a: (-counts[a], a))


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
    question's weight in the answer loss)."""

    def __init__(self, questions: Sequence[Question], answers: Sequence[str], tokenizer: Tokenizer, max_text_len: int,
                 transform: Callable, train: bool, out_of_vocab: str = "error", random_transform: bool = False,
                 objects: Optional[ObjectLabels] = None, answer_type_weights: Optional[dict[str, float]] = None,
                 cache_images: bool = False):
        self.objects, self.weights = objects, answer_type_weights or None
        self.decoded, self.encode = DecodedImages(cache_images), EncodedTexts(tokenizer, max_text_len)
        self.index = {a: i for i, a in enumerate(answers)}
        self.tokenizer, self.max_text_len, self.transform = tokenizer, max_text_len, transform
        self.random_transform = random_transform  # seeded per item
        kept, self.targets, self.skipped = [], [], 0
        for q in questions:
            t = targets(q.answers, self.index) if q.answers is not None else ([], [])
            if train and q.answers is not None and not t[0]:
                if out_of_vocab == "error":
                    raise DataError(
                        f"{q.record} ({q.question!r}): none of its answers {sorted(set(q.answers))} is in the "
                        f"{len(self.index)}-answer vocabulary (out_of_vocab: error; out_of_vocab: skip drops "
                        "such training questions, as BEiT-3 does)")
                self.skipped += 1
                continue
            kept.append(q)
            self.targets.append(t)
        if not kept:
            raise DataError("no questions left to train on (every one has answers outside the vocabulary)")
        self.questions = kept

    def __len__(self) -> int:
        return len(self.questions)

    def __getitem__(self, i: int) -> dict[str, Any]:
        q = self.questions[i]
        seed = item_seed(i, True) if self.random_transform else None
        pil = self.decoded.get(q.image, lambda: load_image(q.image, q.record))
        image = transform_image(self.transform, pil, seed, q.record)
        try:
            ids = self.encode(q.question)
        except ValueError as e:
            raise DataError(f"{q.record}: {e}") from None
        labels, scores = self.targets[i]
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
