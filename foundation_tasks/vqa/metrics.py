"""The official VQA accuracy (GT-Vision-Lab/VQA ``vqaEval.py``), answer normalisation,
and the evaluation of a results file in the official format.

Accuracy of a predicted answer against the 10 human answers of a question: for each of
the 10 subsets of 9 humans, ``min(#humans in the subset who gave the answer / 3, 1)``;
the question's accuracy is the mean over the 10 subsets. An answer given by m of the 10
humans therefore scores 0, 0.3, 0.6, 0.9 and 1.0 for m = 0, 1, 2, 3 and >= 4 (``SOFT_SCORES``):
those are also the training targets (BEiT-3, ViLT).

Normalisation as the official evaluator: the prediction gets ``process_punctuation`` then
``process_digit_article`` (lower case, number words to digits, articles dropped,
apostrophe-less contractions restored); the human answers get ``process_punctuation``
only, and only when they are not all the same string.
"""
from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Mapping, Sequence

SOFT_SCORES = (0.0, 0.3, 0.6, 0.9, 1.0)  # by how many of 10 humans gave the answer (4 or more: 1.0)
ANSWER_TYPES = {"yes/no": "yes_no", "number": "number", "other": "other"}  # VQA v2's, as metric names

_PUNCT = (";", ":", "/", "'", "[", "]", '"', "(", ")", "=", "+", "\\", "_", ">", "<", "@", "`", ",", "?", "!")
_DIGIT_COMMA_DIGIT = re.compile(r"(\d)(,)(\d)")
_PERIOD = re.compile(r"\.(?!\d)")  # a period not followed by a digit (the official pattern's effect)
_NUMBER_WORDS = {w: str(i) for i, w in enumerate("zero one two three four five six seven eight nine ten".split())}
_NUMBER_WORDS["none"] = "0"
_ARTICLES = ("a", "an", "the")
# The official table maps a contraction written without its apostrophe(s) to the contraction;
# most of its targets use the typographic apostrophe, a few the ASCII one, as listed here.
_CONTRACTED = """ain't aren't can't could've couldn't couldn’t’ve didn’t doesn’t don’t hadn’t hadn’t’ve hasn’t
haven’t he’d he’d’ve he’s how’d how’ll how’s I’d’ve I’m I’ve isn’t it’d it’d’ve it’ll let’s ma’am mightn’t
mightn’t’ve might’ve mustn’t must’ve needn’t not’ve o’clock oughtn’t ’ow’s’at shan’t she’d’ve she’s should’ve
shouldn’t shouldn’t’ve somebody’d’ve somebody’ll somebody’s someone’d someone’d’ve someone’ll someone’s
something’d something’d’ve something’ll that’s there’d there’d’ve there’re there’s they’d they’d’ve they’ll
they’re they’ve ’twas wasn’t we’d’ve we've weren’t what’ll what’re what’s what’ve when’s where’d where's where’ve
who’d who’d’ve who’ll who’s who've why’ll why’re why’s won’t would’ve wouldn’t wouldn’t’ve y’all y’all’ll
y’all’d’ve you’d you’d’ve you’ll you’re you’ve""".split()


def _contraction_table() -> dict[str, str]:
    """Every form with all apostrophes dropped, or (two or more of them) one apostrophe dropped."""
    table = {}
    for word in _CONTRACTED:
        marks = [i for i, c in enumerate(word) if c in "'’"]
        table[re.sub("['’]", "", word)] = word
        if len(marks) > 1:
            for i in marks:
                table[word[:i] + word[i + 1:]] = word
    return table


_CONTRACTIONS = _contraction_table()


def process_punctuation(text: str) -> str:
    out = text
    strip_all = _DIGIT_COMMA_DIGIT.search(text) is not None
    for p in _PUNCT:
        if strip_all or p + " " in text or " " + p in text:
            out = out.replace(p, "")
        else:
            out = out.replace(p, " ")
    return _PERIOD.sub("", out)


def process_digit_article(text: str) -> str:
    words = [_NUMBER_WORDS.get(w, w) for w in text.lower().split()]
    return " ".join(_CONTRACTIONS.get(w, w) for w in words if w not in _ARTICLES)


def normalize_answer(text: str) -> str:
    """The official normalisation of a predicted answer (also used for our answer vocabulary
    and training targets, so that "Two" and "2" are one answer)."""
    text = text.replace("\n", " ").replace("\t", " ").strip()
    return process_digit_article(process_punctuation(text))


def vqa_accuracy(prediction: str, answers: Sequence[str]) -> float:
    """The official accuracy of one predicted answer against a question's human answers."""
    if not answers:
        raise ValueError("vqa_accuracy: a question needs its human answers")
    pred = normalize_answer(prediction)
    gts = list(answers)
    if len(set(gts)) > 1:
        gts = [process_punctuation(a) for a in gts]
    accs = []
    for left_out in range(len(gts)):
        matches = sum(1 for j, a in enumerate(gts) if j != left_out and a == pred)
        accs.append(min(1.0, matches / 3))
    return sum(accs) / len(accs)


def soft_score(count: int) -> float:
    """The training target of an answer given by ``count`` of 10 humans (its official accuracy)."""
    return SOFT_SCORES[min(count, 4)]


def write_results(path: str | Path, predictions: Iterable[tuple[int, str]]) -> Path:
    """The official results format: ``[{"question_id": int, "answer": str}, ...]``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([{"question_id": int(q), "answer": a} for q, a in predictions]))
    return path


def evaluate_results(results: str | Path | list, annotations: Mapping[int, Mapping]) -> dict:
    """Accuracy (in %, as the official evaluator prints it) of a results file, overall and
    per answer type; ``annotations``: question_id -> official annotation record."""
    if not isinstance(results, list):
        results = json.loads(Path(results).read_text())
    by_type: dict[str, list[float]] = defaultdict(list)
    accs = []
    for i, r in enumerate(results):
        if not isinstance(r, dict) or not isinstance(r.get("question_id"), int) or not isinstance(r.get("answer"), str):
            raise ValueError(f"results[{i}]: expected {{'question_id': int, 'answer': str}}, got {r!r}")
        ann = annotations.get(r["question_id"])
        if ann is None:
            raise ValueError(f"results[{i}]: question_id {r['question_id']} is not in the annotations")
        acc = vqa_accuracy(r["answer"], [a["answer"] for a in ann["answers"]])
        accs.append(acc)
        by_type[ann.get("answer_type", "other")].append(acc)
    if len(accs) != len(annotations):
        raise ValueError(f"results cover {len(accs)} of the {len(annotations)} annotated questions")
    return {"overall": 100 * sum(accs) / len(accs),
            "perAnswerType": {t: 100 * sum(v) / len(v) for t, v in sorted(by_type.items())}}


def type_sums(accuracies: Sequence[float], answer_types: Sequence[str]) -> dict[str, float]:
    """Per answer type sums (every type always present, so every process adds the same keys)."""
    sums = {f"{k}_{name}": 0.0 for name in ANSWER_TYPES.values() for k in ("accuracy", "questions")}
    for acc, t in zip(accuracies, answer_types):
        if t in ANSWER_TYPES:
            sums[f"accuracy_{ANSWER_TYPES[t]}"] += acc
            sums[f"questions_{ANSWER_TYPES[t]}"] += 1
    return sums


def vqa_metrics(totals: Mapping) -> dict[str, float]:
    """From the sums of ``eval_step``: official accuracy (overall and per answer type, as the
    official evaluator reports it), BEiT-3's soft score of the top answer (equal to the
    accuracy when every human answer is in the vocabulary) and the loss."""
    n = float(totals["questions"])
    out = {
        "vqa_accuracy": float(totals["accuracy"]) / n,
        "vqa_score": float(totals["score"]) / n,
        "loss": float(totals["loss_sum"]) / n,
    }
    for name in ANSWER_TYPES.values():
        m = float(totals.get(f"questions_{name}", 0.0))
        if m:
            out[f"vqa_accuracy_{name}"] = float(totals[f"accuracy_{name}"]) / m
    return out
