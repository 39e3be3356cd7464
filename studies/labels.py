"""``foundation compare labels``: does pretraining pay where labels are scarce? Vision on the demo
data: the tiny classifier fine-tuned at several label budgets (images per class; the val split
never changes) from scratch and from each masked-image-modeling pretraining on the unlabelled
training images, with the same fine-tuning recipe and steps in every cell.

Pretrainings (one per norm, on every training image, labels unused):

* ``pixels``: ``configs/vision/tiny_mim_pixels.yaml`` (normalised-pixel regression of the masked
  patches: SimMIM's input masking, MAE's target);
* ``tokens``: ``configs/vision/tiny_tokenizer.yaml`` (a VQ-KD tokenizer), then
  ``configs/vision/tiny_mim.yaml`` (BEiT: the masked patches' codes).

Each cell (norm x budget x initialisation x seed) is an ordinary ``foundation train`` of
``configs/vision/tiny_finetune.yaml`` with ``train_per_class`` / ``subset_seed`` (nested subsets:
the 10 images of a seed are among its 100) in its own run directory; the same command again
skips what finished and resumes the rest.

    OUT/pretrain/<run>/             the pretraining runs
    OUT/runs/<norm>-<budget>-<init>-s<seed>/
    OUT/report.md, results.json     top-1 per cell: mean ± std over seeds and per seed; labels.png
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional, Sequence

from studies import runs
from studies.compare import parse_ints, parse_norms
from studies.plots import pyplot

FINETUNE = "configs/vision/tiny_finetune.yaml"
TOKENIZER = "configs/vision/tiny_tokenizer.yaml"
PRETRAIN = {"pixels": "configs/vision/tiny_mim_pixels.yaml", "tokens": "configs/vision/tiny_mim.yaml"}
INITS = ("scratch", "pixels", "tokens")
INIT_LABELS = {"scratch": "scratch", "pixels": "MIM, pixel target", "tokens": "MIM, token target (BEiT)"}
METRIC = "classification/top1"


def budget_name(b: Optional[int]) -> str:
    return "all" if b is None else str(b)


def parse_budgets(text: str) -> list[Optional[int]]:
    out: list[Optional[int]] = []
    for t in (t.strip() for t in text.split(",") if t.strip()):
        if t == "all":
            out.append(None)
        elif t.isdigit() and int(t) > 0:
            out.append(int(t))
        else:
            raise ValueError(f"--budgets: {t!r} is neither a number of images per class nor 'all'")
    if not out:
        raise ValueError("--budgets: give at least one budget (e.g. 10,100,all)")
    return out


class Study:
    """The runs of one invocation: where they go, their overrides, and bringing each to its end once."""

    def __init__(self, a: argparse.Namespace):
        self.a, self.out = a, Path(a.out)
        self.lock = threading.Lock()  # printing
        self.tokenizer_lock = threading.Lock()  # the tokenizer run, shared by both norms' token MIM
        self.failed: list[str] = []

    def say(self, text: str) -> None:
        with self.lock:
            print(text, flush=True)

    def train(self, config: str, run_dir: Path, overrides: Sequence[str]) -> bool:
        failure = runs.ensure(Path(config), [*overrides, f"output_dir={run_dir.parent}", f"run_name={run_dir.name}",
                                             "log.progress=false"], run_dir, say=self.say, head=f"  {run_dir.name}")
        if failure or runs.status(run_dir) != "finished":
            self.failed.append(f"{run_dir}: {failure or runs.status(run_dir)}")
            return False
        return True

    def data(self, field: str = "tasks.0.data_dir") -> str:
        return f"{field}={self.a.data}"

    def pretrain(self, norm: str, init: str) -> Optional[Path]:
        """The pretraining run of ``init`` under ``norm`` (trained once): its weights."""
        pre = self.out / "pretrain"
        steps = [f"train.steps={self.a.pretrain_steps}"] if self.a.pretrain_steps else []
        extra: list[str] = []
        if init == "tokens":
            tokenizer = pre / "tokenizer"  # the tokenizer has no backbone norm: one for both
            with self.tokenizer_lock:  # two threads must not train the same run
                ok = self.train(TOKENIZER, tokenizer, [self.data(), *steps, *self.a.pretrain])
            if not ok:
                return None
            extra = [f"tasks.0.tokenizer={tokenizer / 'best' / 'model.safetensors'}"]
        run = pre / f"{init}-{norm}"
        if not self.train(PRETRAIN[init], run, [self.data(), f"backbone.norm={norm}", *steps, *extra,
                                                *self.a.pretrain]):
            return None
        return run / "best" / "model.safetensors"

    def finetune(self, norm: str, budget: Optional[int], init: str, seed: int, weights: Optional[Path]) -> Path:
        run = self.out / "runs" / f"{norm}-{budget_name(budget)}-{init}-s{seed}"
        overrides = [self.data("tasks.0.data_dir"), f"backbone.norm={norm}", f"seed={seed}",
                     f"tasks.0.subset_seed={seed}", f"train.steps={self.a.steps}",
                     f"tasks.0.train_per_class={'null' if budget is None else budget}",
                     f"init_from={weights if weights is not None else 'null'}", *self.a.finetune]
        self.train(FINETUNE, run, overrides)
        return run


def top1(run_dir: Path) -> Optional[float]:
    if runs.status(run_dir) != "finished":
        return None
    return runs.last_eval(runs.read_records(run_dir))[1].get(METRIC)


def cell_stats(values: list[Optional[float]]) -> dict:
    got = [100 * v for v in values if v is not None]
    return {"mean": statistics.mean(got) if got else None,
            "std": statistics.stdev(got) if len(got) > 1 else 0.0 if got else None,
            "per_seed": [None if v is None else 100 * v for v in values]}


def report(out: Path, table: dict, norms, budgets, seeds, inits, command: str) -> str:
    """report.md, results.json and labels.png from {(norm, budget, init): cell_stats}."""
    lines = ["# Label budgets: scratch vs pretrained (vision, demo data)", "", f"`{command}`", "",
             f"Top-1 % on the whole val split (500 images), last evaluation; mean ± std over seeds "
             f"{', '.join(map(str, seeds))}, per seed in brackets. Fine-tuning: `{FINETUNE}`, the same steps "
             "in every cell.", ""]
    head = "| norm | labels per class | " + " | ".join(INIT_LABELS[i] for i in inits) + " | gain (best pretraining) |"
    lines += [head, "|" + "---|" * (3 + len(inits))]
    for norm in norms:
        for b in budgets:
            cells = [table.get((norm, budget_name(b), i)) for i in inits]
            text = []
            for c in cells:
                if c is None or c["mean"] is None:
                    text.append("-")
                    continue
                seeds_text = " / ".join("-" if v is None else f"{v:.1f}" for v in c["per_seed"])
                text.append(f"{c['mean']:.1f} ± {c['std']:.1f} ({seeds_text})")
            base = cells[0]["mean"] if cells and cells[0] and cells[0]["mean"] is not None else None
            best = max((c["mean"] for c in cells[1:] if c and c["mean"] is not None), default=None)
            gain = f"{best - base:+.1f}" if base is not None and best is not None else "-"
            lines.append(f"| {norm} | {budget_name(b)} | " + " | ".join(text) + f" | {gain} |")
    lines += ["", "![top-1 against label budget](labels.png)", ""]
    text = "\n".join(lines)
    (out / "report.md").write_text(text)
    (out / "results.json").write_text(json.dumps(
        {"command": command, "metric": METRIC, "norms": list(norms), "budgets": [budget_name(b) for b in budgets],
         "seeds": list(seeds), "cells": [{"norm": n, "budget": b, "init": i, **c} for (n, b, i), c in table.items()]},
        indent=1))
    plot(out / "labels.png", table, norms, budgets, inits)
    return text


def plot(path: Path, table: dict, norms, budgets, inits) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(norms), figsize=(4.2 * len(norms), 3.4), squeeze=False, sharey=True)
    colors = {"scratch": "tab:gray", "pixels": "tab:blue", "tokens": "tab:purple"}
    xs = list(range(len(budgets)))
    for ax, norm in zip(axes[0], norms):
        for init in inits:
            points = [(x, table.get((norm, budget_name(b), init))) for x, b in zip(xs, budgets)]
            points = [(x, c) for x, c in points if c and c["mean"] is not None]
            if not points:
                continue
            ax.plot([x for x, _ in points], [c["mean"] for _, c in points], "o-", color=colors[init],
                    label=INIT_LABELS[init])
            for x, c in points:
                ax.plot([x] * len(c["per_seed"]), [v for v in c["per_seed"] if v is not None] or [None],
                        ".", color=colors[init], alpha=0.5)
        ax.set_xticks(xs, [budget_name(b) for b in budgets])
        ax.set_xlabel("labelled images per class")
        ax.set_title(norm)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("val top-1 %")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


EXAMPLES = """\
examples:
  foundation data make vision --out data/vision-demo
  foundation compare labels --quick                    # one seed, 10 per class, scratch vs pixel MIM (16 min)
  foundation compare labels --seeds 0,1 --jobs 2       # the whole study
  foundation compare labels --inits scratch,pixels --norms magneto --budgets 10,100,all
"""


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="foundation compare labels", formatter_class=argparse.RawDescriptionHelpFormatter,
                                description=__doc__.split("\n\n")[0].replace("``", "`"), epilog=EXAMPLES)
    p.add_argument("--data", default="data/vision-demo", help="ImageNet-layout folder (default data/vision-demo)")
    p.add_argument("--out", default="runs/compare-labels")
    p.add_argument("--norms", default="preln,magneto")
    p.add_argument("--seeds", default="0,1", help="fine-tuning (and label subset) seeds")
    p.add_argument("--budgets", default="10,100,all", help="labelled images per class; 'all' = every image")
    p.add_argument("--inits", default=",".join(INITS), help=f"comma-separated, of {', '.join(INITS)}")
    p.add_argument("--steps", type=int, default=1100, help="fine-tuning steps in every cell (default 1100)")
    p.add_argument("--pretrain-steps", type=int, default=None, help="default: the pretraining configs' own")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each")
    p.add_argument("--pretrain", nargs="*", default=[], metavar="key=value", help="overrides of the pretraining runs")
    p.add_argument("--finetune", nargs="*", default=[], metavar="key=value", help="overrides of the fine-tuning runs")
    p.add_argument("--quick", action="store_true",
                   help="one seed, 10 per class, scratch and the pixel target, 3000 pretraining / 500 fine-tuning steps")
    a = p.parse_args(list(argv))
    try:
        norms = parse_norms(a.norms)
        seeds = parse_ints(a.seeds, "--seeds", "0,1")
        budgets = parse_budgets(a.budgets)
        inits = [i.strip() for i in a.inits.split(",") if i.strip()]
        bad = [i for i in inits if i not in INITS]
        if bad or not inits:
            raise ValueError(f"--inits: unknown {', '.join(bad)}; known: {', '.join(INITS)}")
    except ValueError as e:
        print(f"foundation compare labels: error: {e}", file=sys.stderr)
        return 2
    if a.quick:
        seeds, budgets, inits = seeds[:1], [10], ["scratch", "pixels"]
        a.pretrain_steps, a.steps = a.pretrain_steps or 3000, 500
    if not (Path(a.data) / "train").is_dir():
        print(f"foundation compare labels: error: {a.data}/train: no such folder "
              f"(foundation data make vision --out {a.data})", file=sys.stderr)
        return 2
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    study = Study(a)
    command = "foundation compare labels " + " ".join(argv)
    cells = [(n, b, i, s) for n in norms for i in inits for b in budgets for s in seeds]
    print(f"{len(norms) * (len(inits) - ('scratch' in inits))} pretraining runs, {len(cells)} fine-tuning runs, "
          f"{a.jobs} at a time -> {a.out}/", flush=True)
    weights: dict[tuple[str, str], Optional[Path]] = {}
    done = {(n, i): threading.Event() for n in norms for i in inits}

    def pretrain(key: tuple[str, str]) -> None:
        norm, init = key
        try:
            weights[key] = None if init == "scratch" else study.pretrain(norm, init)
        finally:
            done[key].set()

    def finetune(cell) -> None:
        norm, budget, init, seed = cell
        done[norm, init].wait()
        if init != "scratch" and weights.get((norm, init)) is None:
            return  # its pretraining failed (said in the summary)
        study.finetune(norm, budget, init, seed, weights.get((norm, init)))

    with ThreadPoolExecutor(max_workers=a.jobs) as pool:
        # pretrainings first, scratch cells meanwhile; a fine-tuning waits for its pretraining
        jobs = [pool.submit(pretrain, k) for k in done]
        jobs += [pool.submit(finetune, c) for c in sorted(cells, key=lambda c: c[2] != "scratch")]
        for j in jobs:
            j.result()
    table = {(n, budget_name(b), i): cell_stats([top1(study.out / "runs" / f"{n}-{budget_name(b)}-{i}-s{s}")
                                                 for s in seeds])
             for n in norms for b in budgets for i in inits}
    Path(a.out).mkdir(parents=True, exist_ok=True)
    print(report(Path(a.out), table, norms, budgets, seeds, inits, command))
    for f in study.failed:
        print(f"failed: {f}", file=sys.stderr)
    return 1 if study.failed else 0
