"""Where a VL demo model is right and where it is not: its accuracy on the demo data's
evaluation split broken down by question family (VQA: count, color, shape, exist, spatial)
or statement kind (NLVR2: exist, one, both, atleast, exact, more, total, spatial), and by how
the text names objects (colour + shape, shape only, colour only).

    python benchmarks/vl_breakdown.py vqa runs/demo/vqa/runs/magneto_lr0.001_seed0 data/vl/vqa
    python benchmarks/vl_breakdown.py nlvr2 runs/demo/nlvr2/runs/magneto_lr0.0005_seed0 data/vl/nlvr2
    python benchmarks/vl_breakdown.py vqa RUN data/vl/vqa --scenes      # also by what the scene holds

``--scenes`` (VQA) redraws each val scene with the generator (``--seed`` / ``--objects`` /
``--object-size`` as ``foundation data make vl`` was given; each redrawn image is checked
against the stored one) and adds a breakdown by family x objects x distinct colours: a
colour question ("What color is the circle?") on a scene of one colour needs no shape word,
on a scene of 2-3 colours it needs the shape word to find the object.

The model is any run directory / model file that ``foundation predict`` takes; the answers
come from the project's own predictors (``foundation_tasks.vqa.predict.predict_split``, the NLVR2
``foundation predict`` predictor), VQA scored with the official accuracy. What it showed
(docs/findings.md, Vision-language): the tiny models read colour, not shape.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from foundation_tasks.vl_common.demo import SceneSpec, kind_of, names_objects_by  # noqa: E402


def vqa_breakdown(model: str, data: str, scenes: dict[int, list] | None = None) -> dict[str, dict[str, list[float]]]:
    """{"family": {name: [accuracy per question]}, "names objects by": {...}} on val2014, and
    {"family x scene": {"color: 3 objects, 3 colours": [...]}} given the val scenes."""
    from foundation_tasks.vqa.data import read_split
    from foundation_tasks.vqa.metrics import vqa_accuracy
    from foundation_tasks.vqa.predict import predict_split

    questions = {q.question_id: q for q in read_split(data, data, "val2014")}
    results, _ = predict_split(model, "val2014", data_dir=data, annotation_dir=data)
    out: dict[str, dict[str, list[float]]] = {"family": defaultdict(list), "names objects by": defaultdict(list)}
    for qid, answer in results:
        q = questions[qid]
        acc = vqa_accuracy(answer, q.answers)
        out["family"][kind_of(q.question) or "other"].append(acc)
        out["names objects by"][names_objects_by(q.question)].append(acc)
        if scenes is not None:
            objs = scenes[q.image_id]
            n, k = len(objs), len({o.color for o in objs})
            key = f"{kind_of(q.question) or 'other'}: {n} object{'s' * (n > 1)}, {k} colour{'s' * (k > 1)}"
            out.setdefault("family x scene", defaultdict(list))[key].append(acc)
    return out


def redraw_scenes(data: str, seed: int, spec) -> dict[int, list]:
    """{val image id: its objects}, each scene redrawn by the generator and checked against the stored image."""
    import numpy as np

    from foundation_tasks.vl_common.images import load_image
    from foundation_tasks.vqa.data import read_split
    from foundation_tasks.vl_common.demo import VQA_FIRST_IMAGE_ID, draw_scene

    scenes: dict[int, list] = {}
    for q in read_split(data, data, "val2014"):
        if q.image_id in scenes:
            continue
        stored = np.asarray(load_image(q.image, q.record), dtype=np.float32)
        _, objs, image = draw_scene(seed, "val", q.image_id - VQA_FIRST_IMAGE_ID["val"], spec, stored.shape[0])
        # mean |difference| per pixel: JPEG q95 of the noisy scene 3-5, another scene > 20
        if np.abs(np.asarray(image, dtype=np.float32) - stored).mean() > 10:
            raise ValueError(f"{q.image}: not the scene redrawn with --seed {seed} --objects {spec.min_objects} "
                             f"{spec.max_objects} --object-size {spec.radius}; pass the options the data was made with")
        scenes[q.image_id] = objs
    return scenes


def nlvr2_breakdown(model: str, data: str) -> dict[str, dict[str, list[float]]]:
    """{"kind": {name: [1.0 if right else 0.0 per statement]}, "names objects by": {...}} on dev."""
    from foundation.engine.predict import load_predictor
    from foundation_tasks.nlvr2.data import read_split

    predictor = load_predictor(model)
    out: dict[str, dict[str, list[float]]] = {"kind": defaultdict(list), "names objects by": defaultdict(list)}
    for s in read_split(data, data, "dev"):
        record = predictor((str(s.left), str(s.right)), sentence=s.sentence)
        right = float(record["label"] == bool(s.label))
        out["kind"][kind_of(s.sentence) or "other"].append(right)
        out["names objects by"][names_objects_by(s.sentence)].append(right)
    return out


def table(breakdown: dict[str, dict[str, list[float]]]) -> str:
    lines = []
    for by, groups in breakdown.items():
        lines += [f"| {by} | accuracy % | items |", "|---|---|---|"]
        lines += [f"| {name} | {100 * sum(v) / len(v):.1f} | {len(v)} |" for name, v in sorted(groups.items())]
        everything = [x for v in groups.values() for x in v]
        lines += [f"| all | {100 * sum(everything) / len(everything):.1f} | {len(everything)} |", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("task", choices=("vqa", "nlvr2"))
    p.add_argument("model", help="run directory (best/, else the last checkpoint), checkpoint dir or model.safetensors")
    p.add_argument("data", help="the demo data's vqa/ or nlvr2/ directory (foundation data make vl)")
    p.add_argument("--json", help="also write the per-group accuracies here")
    p.add_argument("--scenes", action="store_true", help="VQA: also break down by objects and colours in the scene")
    p.add_argument("--seed", type=int, default=0, help="with --scenes: the data's --seed")
    p.add_argument("--objects", type=int, nargs=2, default=[SceneSpec.min_objects, SceneSpec.max_objects],
                   metavar=("MIN", "MAX"), help="with --scenes: the data's --objects")
    p.add_argument("--object-size", type=float, default=SceneSpec.radius, help="with --scenes: the data's --object-size")
    a = p.parse_args(argv)
    if a.scenes and a.task != "vqa":
        p.error("--scenes is for vqa")
    from foundation.checkpoint import CheckpointError
    from foundation.config import ConfigError
    from foundation.engine.predict import InputError, NoPredictor

    try:
        if a.task == "vqa":
            scenes = redraw_scenes(a.data, a.seed, SceneSpec(a.object_size, *a.objects)) if a.scenes else None
            breakdown = vqa_breakdown(a.model, a.data, scenes)
        else:
            breakdown = nlvr2_breakdown(a.model, a.data)
    except (ConfigError, CheckpointError, NoPredictor, InputError, FileNotFoundError, ValueError) as e:
        print(f"vl_breakdown: error: {e}", file=sys.stderr)
        return 2
    print(table(breakdown))
    if a.json:
        Path(a.json).write_text(json.dumps({by: {k: sum(v) / len(v) for k, v in g.items()} for by, g in breakdown.items()},
                                           indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
