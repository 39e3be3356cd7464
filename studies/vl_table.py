"""Measure the vision-language table on the demo data: for each rule (magneto, preln) and
seed, BEiT-3 masked data modeling, then VQA and NLVR2 fine-tuning from scratch and from
that pretrained model with the same fine-tuning budget; the last evaluation of each run
(VQA: official accuracy on val2014; NLVR2: accuracy on dev), also split into items whose
question / statement template was seen in training and the held-out ones.

    foundation data make vl --out data/vl
    python -m studies.vl_table --seeds 0 1                  # writes checkpoints/vl-table/{results.json,table.md}
    python -m studies.vl_table --seeds 0 --dry-run          # the commands only
    python -m studies.vl_table --seeds 0 1 --report         # tabulate what has finished

Runs are `foundation train configs/vl/tiny_*.yaml` with run_name / seed / output_dir set;
a run that already finished is read, not repeated, so an interrupted table resumes.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from studies import runs as run_dirs

NORMS = ("magneto", "preln")
METRICS = {"vqa": "vqa/vqa_accuracy", "nlvr2": "nlvr2/accuracy"}


def runs(norm: str, seed: int, out: str, extra: list[str]) -> list[tuple[str, list[str]]]:
    """(run name, `foundation train` arguments) in the order they must run."""
    common = [f"backbone.norm={norm}", f"seed={seed}", f"output_dir={out}", "log.progress=false", *extra]
    pre = f"pretrain-{norm}-s{seed}"
    weights = f"{out}/{pre}/best/model.safetensors"
    plan = [(pre, ["configs/vl/tiny_pretrain.yaml", f"run_name={pre}", *common])]
    for task in METRICS:
        config = f"configs/vl/tiny_{task}.yaml"
        plan.append((f"{task}-{norm}-scratch-s{seed}", [config, f"run_name={task}-{norm}-scratch-s{seed}", *common]))
        plan.append((f"{task}-{norm}-pt-s{seed}", [config, f"run_name={task}-{norm}-pt-s{seed}", f"init_from={weights}",
                                                  *common]))
    return plan


def last_eval(run_dir: Path) -> tuple[int, dict[str, float]] | None:
    step, metrics = run_dirs.last_eval(run_dirs.read_records(run_dir))
    return None if step is None else (step, metrics)


def finished(run_dir: Path) -> bool:
    """The one notion the studies share: the engine's status.json says so."""
    return run_dirs.status(run_dir) == "finished"


@torch.no_grad()
def breakdown(run_dir: Path) -> dict[str, float]:
    """Accuracy of the last checkpoint on evaluation items whose template was seen in training
    and on held-out ones, and on all items with the images shuffled across the batch (how
    much the model looks at the images at all)."""
    from foundation import checkpoint
    from foundation.engine.model import MultiTaskModel  # (registers its checkpoint kind)
    from foundation_tasks.vl_common.demo import is_held_out
    from foundation_tasks.vqa.metrics import vqa_accuracy

    last = max((run_dir / "ckpt").glob("step_*"))
    model = checkpoint.load(last / "model.safetensors").eval()
    assert isinstance(model, MultiTaskModel)
    (tid, task), = model.tasks.items()
    head, data = model.heads[tid], task.eval_dataset()
    g = torch.Generator().manual_seed(0)
    scores, shuffled = [], []
    for batch in torch.utils.data.DataLoader(data, batch_size=64, collate_fn=task.collate):
        perm = torch.randperm(len(batch["text_ids"]), generator=g)
        other = {**batch, **{k: batch[k][perm] for k in ("images", "left", "right") if k in batch}}
        for b, out in ((batch, scores), (other, shuffled)):
            if task.name == "vqa":
                _, answers = task.predict(head, model.backbone, b)
                out += [vqa_accuracy(p, a) for p, a in zip(answers, b["answers"])]
            else:
                out += (head.logits(model.backbone, b).argmax(1) == b["labels"]).float().tolist()
    texts = [q.question for q in data.questions] if task.name == "vqa" else [s.sentence for s in data.statements]
    held = [is_held_out(t) for t in texts]
    result = {"shuffled_images": sum(shuffled) / len(shuffled)}
    for name, want in (("seen", False), ("held_out", True)):
        picked = [x for x, h in zip(scores, held) if h == want]
        if picked:
            result[name] = sum(picked) / len(picked)
    return result


def _cell(values: list[float]) -> str:
    if not values:
        return "-"
    spread = f" ± {statistics.stdev(values):.1f}" if len(values) > 1 else ""
    return f"{statistics.mean(values):.1f}{spread} ({', '.join(f'{v:.1f}' for v in values)})"


def _mean(runs: list[dict], key: str) -> str:
    values = [100 * r["breakdown"][key] for r in runs if key in r.get("breakdown", {})]
    return f"{statistics.mean(values):.1f}" if values else "-"


def markdown(results: dict[str, dict]) -> str:
    seeds = sorted({r["seed"] for r in results.values()})
    head = " | ".join(f"{t} accuracy | seen / held-out | images shuffled" for t in ("VQA", "NLVR2"))
    lines = [f"| backbone | VL pretraining | {head} |", "|---|---|" + "---|" * 6]
    for norm in NORMS:
        for pt in ("scratch", "pt"):
            cells = []
            for task, metric in METRICS.items():
                runs = [results[n] for n in (f"{task}-{norm}-{pt}-s{s}" for s in seeds) if n in results]
                cells += [_cell([100 * r["metrics"][metric] for r in runs]),
                          f"{_mean(runs, 'seen')} / {_mean(runs, 'held_out')}", _mean(runs, "shuffled_images")]
            label = {"magneto": "Magneto", "preln": "Pre-LN"}[norm]
            lines.append(f"| {label} | {'yes' if pt == 'pt' else 'no'} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + (
        f"\n\nLast evaluation of each run, in %: mean ± std over seeds {', '.join(map(str, seeds))} (per seed in "
        "brackets). seen / held-out: items whose question / statement template was seen in training / held out; "
        "images shuffled: the same evaluation with the images of a batch permuted (a model that ignores the "
        "images scores the same). Means over seeds.\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.vl_table", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("overrides", nargs="*", metavar="key=value", help="applied to every run")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--norms", nargs="+", choices=NORMS, default=list(NORMS))
    p.add_argument("--out", default="checkpoints/vl-table")
    p.add_argument("--dry-run", action="store_true", help="print the commands only")
    p.add_argument("--report", action="store_true", help="only tabulate the runs that finished; start none")
    a = p.parse_args(argv)
    out = Path(a.out)
    results_path = out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    for seed in a.seeds:
        for norm in a.norms:
            for name, args in runs(norm, seed, a.out, a.overrides):
                if a.dry_run:
                    print("foundation train " + " ".join(args))
                    continue
                run_dir = out / name
                if not finished(run_dir) and a.report:
                    continue
                failure = run_dirs.ensure(Path(args[0]), args[1:], run_dir, head=f"[{time.strftime('%H:%M:%S')}] {name}")
                if failure or not finished(run_dir):
                    print(f"{name} did not finish ({failure or run_dirs.status(run_dir)}); see {run_dir}/train.log",
                          file=sys.stderr)
                    return 1
                step, metrics = last_eval(run_dir)
                result = {"seed": seed, "norm": norm, "step": step, "metrics": metrics}
                if not name.startswith("pretrain"):
                    result["breakdown"] = results.get(name, {}).get("breakdown") or breakdown(run_dir)
                results[name] = result
                results_path.write_text(json.dumps(results, indent=1, sort_keys=True))
    if not a.dry_run:
        table = markdown(results)
        (out / "table.md").write_text(table)
        print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
