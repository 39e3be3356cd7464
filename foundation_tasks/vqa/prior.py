"""The answer-prior baseline of a VQA split: answer every question with the most frequent
training answer of its ``question_type`` (the first words of the question, as VQA v2
annotates them), or of its ``answer_type`` for a question type never seen in training
(the demo's held-out templates). What a model scores without looking at the image, from
the question's wording alone; a VQA result means something only well above it.

    python -m foundation_tasks.vqa.prior data/vl/vqa            # train2014 -> val2014
"""
from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from pathlib import Path

from foundation_tasks.vqa.data import ANNOTATIONS, read_json
from foundation_tasks.vqa.metrics import normalize_answer, vqa_accuracy


def _annotations(annotation_dir: str | Path, split: str) -> list[dict]:
    return read_json(Path(annotation_dir) / ANNOTATIONS.format(split=split), "annotations")


def answer_prior(annotation_dir: str | Path, train_split: str = "train2014", eval_split: str = "val2014") -> float:
    """Official VQA accuracy (a fraction) of the per-question-type answer prior on ``eval_split``."""
    by_qtype: dict[str, Counter] = defaultdict(Counter)
    by_atype: dict[str, Counter] = defaultdict(Counter)
    for rec in _annotations(annotation_dir, train_split):
        answer = normalize_answer(rec.get("multiple_choice_answer", ""))
        by_qtype[rec.get("question_type", "")][answer] += 1
        by_atype[rec.get("answer_type", "")][answer] += 1
    scores = []
    for rec in _annotations(annotation_dir, eval_split):
        counts = by_qtype.get(rec.get("question_type", "")) or by_atype.get(rec.get("answer_type", ""))
        guess = counts.most_common(1)[0][0] if counts else ""
        scores.append(vqa_accuracy(guess, [a["answer"] for a in rec["answers"]]))
    if not scores:
        raise ValueError(f"{annotation_dir}: no {eval_split} annotations")
    return sum(scores) / len(scores)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m foundation_tasks.vqa.prior", description=__doc__.split("\n\n")[0])
    p.add_argument("annotation_dir", help="the VQA v2 annotation jsons (the demo: data/vl/vqa)")
    p.add_argument("--train-split", default="train2014")
    p.add_argument("--eval-split", default="val2014")
    a = p.parse_args(argv)
    print(f"answer prior on {a.eval_split}: {100 * answer_prior(a.annotation_dir, a.train_split, a.eval_split):.1f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
