"""VQA with a trained model: ``VQAPredictor`` answers a question about the user's images
(``foundation predict RUN image.jpg --question "..."``: the top answers with their sigmoid
scores), and ``predict_split`` answers the questions of a VQA split and writes the
official results file (``[{"question_id": int, "answer": str}, ...]``, what the VQA
evaluation server takes); when the split has annotations, it also prints its official
accuracy.

    python -m foundation_tasks.vqa.predict checkpoints/vqa-tiny-magneto --split val2014 --out vqa_val2014_results.json
    python -m foundation_tasks.vqa.predict RUN_DIR --split test-dev2015 --data-dir /data/coco --out test-dev_results.json

The model, its answer vocabulary and its data settings come from the checkpoint itself
(``--data-dir`` / ``--annotation-dir`` point it at another copy of the data).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from foundation.checkpoint import CheckpointError
from foundation.config import ConfigError
from foundation_tasks.vl_common.predict import VLPredictor


class VQAPredictor(VLPredictor):
    """image + question -> the top-k answers of the model's answer vocabulary."""

    required = ("question",)
    default_batch_size = 32

    def load(self, source, **_) -> torch.Tensor:
        return self.image(source)

    def predict(self, items, question: str = "", top_k: int = 5, **_) -> list[dict]:
        batch = {"images": torch.stack(items).to(self.device), **self.text(question, len(items), "question")}
        scores = self.head.logits(self.backbone, batch).float().sigmoid()  # trained with binary cross-entropy
        answers = self.meta["answers"]
        top, index = scores.topk(min(top_k, len(answers)), dim=-1)
        return [{"question": question, "answers": [{"answer": answers[i], "score": s}
                                                   for i, s in zip(idx.tolist(), sc.tolist())]}
                for idx, sc in zip(index, top)]

    def describe(self, record) -> str:
        return ", ".join(f"{a['answer']} {a['score']:.3f}" for a in record["answers"])


def predict_split(checkpoint: str, split: str, *, task_id: str | None = None, data_dir: str | None = None,
                  annotation_dir: str | None = None, batch_size: int = 64, limit: int | None = None,
                  device: str | None = None) -> tuple[list[tuple[int, str]], dict | None]:
    """([(question_id, answer)], official accuracy or None when the split has no annotations);
    on ``device`` (default: the GPU when there is one)."""
    from foundation.engine.data import to_device
    from foundation import checkpoint as ckpt
    from foundation.engine.run_state import model_file
    from foundation.engine.model import MultiTaskModel
    from foundation_tasks.vqa.data import ANNOTATIONS, VQADataset, read_json, read_split
    from foundation_tasks.vqa.metrics import evaluate_results

    path = model_file(checkpoint)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model = ckpt.load(path).eval().to(dev)
    if not isinstance(model, MultiTaskModel):
        raise CheckpointError(f"{path}: not a training run's model (a MultiTaskModel with a vqa task)")
    ids = [tid for tid, task in model.tasks.items() if task.name == "vqa"]
    if not ids or (task_id is not None and task_id not in ids):
        raise ConfigError(f"{path}: no vqa task{' ' + repr(task_id) if task_id else ''} (vqa tasks: {ids})")
    task_id = task_id or ids[0]
    task, head = model.tasks[task_id], model.heads[task_id]
    c = task.cfg
    data_dir = data_dir or c.data_dir
    annotations_dir = annotation_dir or (c.annotation_dir if data_dir == c.data_dir else None) or data_dir
    questions = read_split(annotations_dir, data_dir, split, c.image_pattern, need_answers=False)[:limit]
    dataset = VQADataset(questions, c.answers, task.tokenizer, c.max_text_len,
                         task.image_transform(False), train=False)
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, collate_fn=task.collate)
    results = []
    with torch.no_grad():
        for batch in loader:
            _, answers = task.predict(head, model.backbone, to_device(batch, dev))
            results += list(zip(batch["question_id"].tolist(), answers))
    accuracy = None
    apath = Path(annotations_dir) / ANNOTATIONS.format(split=split)
    if apath.is_file():
        wanted = {q.question_id for q in questions}
        annotations = {a["question_id"]: a for a in read_json(apath, "annotations") if a.get("question_id") in wanted}
        accuracy = evaluate_results([{"question_id": q, "answer": a} for q, a in results], annotations)
    return results, accuracy


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m foundation_tasks.vqa.predict", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("checkpoint", help="run dir (best/, else the last checkpoint), checkpoint dir or .safetensors")
    p.add_argument("--split", required=True, help="e.g. val2014, test-dev2015, test2015")
    p.add_argument("--out", required=True, help="results json to write")
    p.add_argument("--data-dir", help="VQA image root (default: the checkpoint's data_dir)")
    p.add_argument("--annotation-dir", help="where the question / annotation jsons are (default: the data dir's)")
    p.add_argument("--task-id", help="which vqa task of the model (default: the first)")
    p.add_argument("--batch-size", type=int, default=64)
    a = p.parse_args(argv)
    from foundation_tasks.vqa.metrics import write_results

    try:
        results, accuracy = predict_split(a.checkpoint, a.split, task_id=a.task_id, data_dir=a.data_dir,
                                          annotation_dir=a.annotation_dir, batch_size=a.batch_size)
    except (ConfigError, CheckpointError, FileNotFoundError) as e:
        print(f"predict: error: {e}", file=sys.stderr)
        return 2
    out = write_results(a.out, results)
    print(f"wrote {out}: {len(results)} answers")
    if accuracy is not None:
        types = ", ".join(f"{k} {v:.2f}" for k, v in accuracy["perAnswerType"].items())
        print(f"official VQA accuracy on {a.split}: {accuracy['overall']:.2f} ({types})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
