"""``foundation compare labels``: does pretraining pay where labels are scarce? Each task's tiny
recipe fine-tuned at several label budgets, from scratch and from each pretraining of its
modality on the unlabelled data, with the same fine-tuning recipe and steps in every cell. The
evaluation sets never change with the budget.

A task takes part through its recipe (``foundation_tasks/<task>/recipe.py``: ``label_field``,
``label_budgets``, ``pretrainings``); the pretrainings (one run per norm, labels unused) are:

* ``pixels``: ``configs/vision/tiny_mim_pixels.yaml`` (normalised-pixel regression of the masked
  patches: SimMIM's input masking, MAE's target), for classification and segmentation;
* ``scenes``: the same pretraining on the segmentation data's unlabelled pool (its training
  scenes and 4,000 more, ``foundation data make segmentation --unlabelled 4000``) with random
  crops of 35-100 % of a scene, 18,000 steps, for segmentation;
* ``tokens``: the BEiT path with a teacher trained here: ``configs/vision/tiny_tokenizer.yaml``
  distilling the Magneto ``pixels`` run (``teacher: run``; one tokenizer for both norms), then
  12,000 steps of MIM predicting its codes with the pixel recipe's masking (``tiny_mim_pixels.yaml``,
  ``target: tokens``); ``--teacher-steps`` gives the teacher a length of its own (its own run,
  ``pretrain/teacher-<steps>``);
* ``best_rq``: ``configs/best_rq/tiny.yaml`` on the speech corpus's audio, for ASR;
* ``vl``: ``configs/vl/tiny_pretrain_pairs.yaml`` (BEiT-3 masked data modeling on image-caption
  pairs, the pooled class token naming the masked caption word), for VQA.

Each cell (task x norm x budget x initialisation x seed) is an ordinary ``foundation train`` of
the task's tiny config with the budget and ``subset_seed`` = the seed (nested subsets: the 10
images of a seed are among its 100) in its own run directory; the same command again skips what
finished and resumes the rest. A task whose recipe starts from another's run (NLVR2 from VQA,
``init_from_stage``) fine-tunes on all its own labels from each cell of that task, right after it:
its rows are the budgets and initialisations of its start.

    OUT/pretrain/<init>-<norm>/                 the pretraining runs
    OUT/runs/<task>-<norm>-<budget>-<init>-s<seed>/
    OUT/report.md, results.json                 the metric per cell: mean ± std over seeds and per seed; labels.png
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from foundation.engine.recipe import Recipe
from studies import runs
from studies.compare import exclusive, parse_ints, parse_norms
from studies.plots import pyplot

TOKENIZER = "configs/vision/tiny_tokenizer.yaml"
TOKENIZER_STEPS = 3000  # its codebook use and what the codes say of the class still grow at 3,000 steps
TEACHER_NORM = "magneto"  # the pixel-MIM run the tokenizer distils
VL_DATA = {"text.train_data": "text/train.txt", "text.eval_data": "text/val.txt",
           "image.train_data": "vqa/train2014", "image.eval_data": "vqa/val2014",
           "pair.train_data": "coco/annotations/captions_train2014.json", "pair.train_images": "vqa/train2014",
           "pair.eval_data": "coco/annotations/captions_val2014.json", "pair.eval_images": "vqa/val2014"}


@dataclass(frozen=True)
class Pretraining:
    config: str
    data: str  # the demo data set it reads (foundation data make <data>)
    overrides: tuple[str, ...]  # {root}: that data set's folder
    label: str
    steps: Optional[int] = None  # the study's length where the config's own pays less (--pretrain-steps: all)


PRETRAININGS = {
    "pixels": Pretraining("configs/vision/tiny_mim_pixels.yaml", "vision", ("tasks.0.data_dir={root}",),
                          "MIM, pixel target"),
    # the scenes fill the frame less than the shapes do: crops, so that a 32-px view is a scene's part
    # 18,000 steps: +3 mIoU on every seed of both norms at 10 % of the masks (6,000: Magneto seed 0 +0.6)
    "scenes": Pretraining("configs/vision/tiny_mim_pixels.yaml", "segmentation",
                          ("tasks.0.data_dir={root}/unlabelled", "tasks.0.scale=[0.35,1.0]"),
                          "MIM, pixel target, on the unlabelled scenes", steps=18000),
    # 12,000 steps, from the 6,000-step pixels run's tokenizer: +20 top-1 on every seed at 10 per class
    # (6,000: +13 to +24)
    "tokens": Pretraining("configs/vision/tiny_mim_pixels.yaml", "vision", ("tasks.0.data_dir={root}",
                                                                          "tasks.0.target=tokens"),
                          "MIM, token target (BEiT v2, pixel-MIM teacher)", steps=12000),
    "best_rq": Pretraining("configs/best_rq/tiny.yaml", "speech", ("tasks.0.data_dir={root}",), "BEST-RQ"),
    # image-caption pairs only, the class token naming the masked word: what VQA reads (BEiT-3's three
    # kinds, configs/vl/tiny_pretrain.yaml, gain +1.6 here; docs/findings.md)
    "vl": Pretraining("configs/vl/tiny_pretrain_pairs.yaml", "vl",
                      tuple(f"tasks.{k}={{root}}/{v}" for k, v in VL_DATA.items() if k.startswith("pair.")),
                      "BEiT-3 pairs, class token names the word"),
}
INIT_LABELS = {"scratch": "scratch", **{k: p.label for k, p in PRETRAININGS.items()}}
COLORS = {"scratch": "tab:gray", "pixels": "tab:blue", "scenes": "tab:cyan", "tokens": "tab:purple", "best_rq": "tab:green",
          "vl": "tab:orange"}


def config_steps(config: str) -> int:
    """``train.steps`` of a config file of the checkout."""
    import yaml

    from foundation.engine.config import find_config

    return int(yaml.safe_load(find_config(config).read_text())["train"]["steps"])


def pretrain_steps(init: str, given: Optional[int]) -> int:
    """The length of the ``init`` pretraining: --pretrain-steps, else the study's, else its config's."""
    p = PRETRAININGS[init]
    return given or p.steps or config_steps(p.config)


def study_path(value) -> Optional[str]:
    """A path into a study folder from that folder on (``pretrain/...``, ``runs/...``), else None."""
    parts = Path(value).parts if isinstance(value, str) else ()
    starts = [i for i, part in enumerate(parts) if part in ("pretrain", "runs")]
    return "/".join(parts[starts[-1]:]) if starts else None


def other_config(config: str, overrides: Sequence[str], run_dir: Path) -> str:
    """The fields in which the run ``run_dir`` already holds differs from this one ('' if none, or no run).
    A start inside the study's folder (``init_from``, the teacher, the tokenizer) is compared from that
    folder on, so a study moved elsewhere is still itself."""
    if not (run_dir / "config.yaml").is_file():
        return ""
    from foundation.config import to_dict
    from foundation.engine.config import load_config

    def same_start(key: str, was, now) -> bool:
        return key.endswith(("init_from", ".teacher_run", ".tokenizer")) and study_path(was) is not None \
            and study_path(was) == study_path(now)

    differ = runs.config_mismatch(run_dir, to_dict(load_config(config, overrides, check_data=False)[0]), same_start)
    return ", ".join(differ[:6]) + (" ..." if len(differ) > 6 else "")


def label_recipes() -> list[Recipe]:
    """The tasks with label budgets, and those that start from one of theirs (NLVR2 from VQA)."""
    from studies.recipes import recipes

    every = recipes()
    budgeted = {r.task for r in every if r.label_budgets}
    return [r for r in every if r.label_budgets or r.init_from_stage in budgeted]


def parse_budgets(text: str, recipe: Recipe) -> list[str]:
    """Budgets as their config values: whole numbers (per class) or fractions in (0, 1], or 'all'."""
    per_class = recipe.label_field.endswith("train_per_class")
    out: list[str] = []
    for t in (t.strip() for t in text.split(",") if t.strip()):
        if t == "all":
            out.append(t)
            continue
        try:
            ok = int(t) > 0 if per_class else 0 < float(t) <= 1
        except ValueError:
            ok = False
        if not ok:
            what = "a number of labelled items per class" if per_class else "a fraction in (0, 1]"
            raise ValueError(f"--budgets: {t!r} is neither {what} ({recipe.task}) nor 'all'")
        out.append(t)
    if not out:
        raise ValueError("--budgets: give at least one budget (e.g. 10,100,all or 0.1,all)")
    return out


def unit(recipe: Recipe) -> str:
    """What a row's budget counts: the task's labels, or those of the run it starts from."""
    if recipe.label_budgets:
        return recipe.label_unit
    from studies.recipes import recipes

    start = next(r for r in recipes() if r.task == recipe.init_from_stage)
    return f"{start.label_unit} (its {start.task} start; all its own)"


def higher_is_better(recipe: Recipe) -> bool:
    from foundation.engine.task import get_task

    return get_task(recipe.task).higher_is_better


class Slots:
    """``n`` runs at a time, pretrainings first. A thread holds a slot only while its run trains, not
    while it waits for a run another thread trains (the teacher both token pretrainings need, the
    pretraining a cell starts from), so a free core takes a scratch cell instead of idling. But no
    fine-tuning takes a slot while a pretraining chain (the runs every pretrained cell waits on) is
    between runs or waiting for one: ``unslotted`` counts the chains that hold no slot, are not waiting
    for another chain's run and have not ended (``expect`` them before any fine-tuning starts)."""

    def __init__(self, n: int):
        self.free, self.unslotted, self.cv = n, 0, threading.Condition()

    def expect(self, chains: int) -> None:
        with self.cv:
            self.unslotted += chains
            self.cv.notify_all()

    def chain_done(self) -> None:
        self.expect(-1)

    @contextmanager
    def aside(self):
        """A chain waiting for a run another chain trains."""
        self.expect(-1)
        try:
            yield
        finally:
            self.expect(1)

    @contextmanager
    def take(self, chain: bool):
        with self.cv:
            self.cv.wait_for(lambda: self.free > 0 and (chain or self.unslotted <= 0))
            self.free -= 1
            self.unslotted -= chain
        try:
            yield
        finally:
            with self.cv:
                self.free += 1
                self.unslotted += chain
                self.cv.notify_all()


class Study:
    """The runs of one invocation: where they go, their overrides, and bringing each to its end once."""

    def __init__(self, a: argparse.Namespace, folders: dict[str, str]):
        self.a, self.out, self.folders = a, Path(a.out), folders
        self.lock = threading.Lock()  # printing
        self.run_locks: dict[Path, threading.Lock] = {}  # a run two threads may both need (teacher, tokenizer)
        self.slots = Slots(a.jobs)
        self.failed: list[str] = []

    def say(self, text: str) -> None:
        with self.lock:
            print(text, flush=True)

    def root(self, data: str) -> str:
        return str(Path(self.a.data) / self.folders[data])

    def train(self, config: str, run_dir: Path, overrides: Sequence[str]) -> bool:
        chain = run_dir.parent == self.out / "pretrain"  # a pretraining chain's run, or a fine-tuning cell's
        with self.lock:
            lock = self.run_locks.setdefault(run_dir, threading.Lock())  # its keys: every run of the study
        if not lock.acquire(blocking=False):  # another thread trains it: wait aside, holding no slot
            with self.slots.aside() if chain else nullcontext():
                lock.acquire()
        try:  # the second caller finds it finished and reads it
            return self._train(config, run_dir, overrides, chain)
        finally:
            lock.release()

    def _train(self, config: str, run_dir: Path, overrides: Sequence[str], chain: bool) -> bool:
        overrides = [*overrides, f"output_dir={run_dir.parent}", f"run_name={run_dir.name}", "log.progress=false"]
        differ = other_config(config, overrides, run_dir)
        if differ:  # a finished run would be read as this one: e.g. a pretraining of another length
            self.failed.append(f"{run_dir} holds a run of another configuration ({differ} differ); give --out "
                               "another directory, or delete that run")
            return False
        done = runs.status(run_dir) in runs.DONE  # read, not trained: it takes no slot
        with nullcontext() if done else self.slots.take(chain):
            failure = runs.ensure(Path(config), overrides, run_dir, say=self.say, head=f"  {run_dir.name}")
        if failure or runs.status(run_dir) != "finished":
            self.failed.append(f"{run_dir}: {failure or runs.status(run_dir)}")
            return False
        return True

    def pretrain(self, norm: str, init: str, steps: Optional[int] = None, name: Optional[str] = None) -> Optional[Path]:
        """The pretraining run of ``init`` under ``norm`` (trained once): its weights. ``steps`` and
        ``name`` (the run's folder) for a run of another length than ``--pretrain-steps``."""
        p, pre = PRETRAININGS[init], self.out / "pretrain"
        data = [o.format(root=self.root(p.data)) for o in p.overrides]
        steps = [f"train.steps={steps or pretrain_steps(init, self.a.pretrain_steps)}"]
        extra: list[str] = []
        if init == "tokens":
            teacher_steps = self.a.teacher_steps
            if teacher_steps in (None, pretrain_steps("pixels", self.a.pretrain_steps)):
                teacher, tokenizer = self.pretrain(TEACHER_NORM, "pixels"), pre / "tokenizer"  # both norms share it
            else:  # a teacher of its own length, and the tokenizer that distils it
                teacher = self.pretrain(TEACHER_NORM, "pixels", steps=teacher_steps, name=f"teacher-{teacher_steps}")
                tokenizer = pre / f"tokenizer-teacher-{teacher_steps}"
            if teacher is None:
                return None
            tok_steps = min(TOKENIZER_STEPS, self.a.pretrain_steps or TOKENIZER_STEPS)
            if not self.train(TOKENIZER, tokenizer, [f"tasks.0.data_dir={self.root(p.data)}", f"train.steps={tok_steps}",
                                                     "tasks.0.teacher=run",
                                                     f"tasks.0.teacher_run={teacher}", *self.a.pretrain]):
                return None
            extra = [f"tasks.0.tokenizer={tokenizer / 'best' / 'model.safetensors'}"]
        run = pre / (name or f"{init}-{norm}")
        if not self.train(p.config, run, [*data, f"backbone.norm={norm}", *steps, *extra, *self.a.pretrain]):
            return None
        return run / "best" / "model.safetensors"

    def cell(self, recipe: Recipe, norm: str, budget: str, init: str, seed: int) -> Path:
        return self.out / "runs" / f"{recipe.task}-{norm}-{budget}-{init}-s{seed}"

    def finetune(self, recipe: Recipe, norm: str, budget: str, init: str, seed: int, weights: Optional[Path],
                 followers: Sequence[Recipe] = ()) -> None:
        """The cell, then each follower's cell from its best model (all the follower's own labels)."""
        overrides = [f"{recipe.data_field}={recipe.data_path.format(root=self.root(recipe.data))}",
                     f"backbone.norm={norm}", f"seed={seed}", *recipe.label_overrides(budget, seed),
                     f"init_from={weights if weights is not None else 'null'}",
                     *(recipe.pretrained_overrides if weights is not None else ()),
                     *([f"train.steps={self.a.steps}"] if self.a.steps else []), *self.a.finetune]
        run = self.cell(recipe, norm, budget, init, seed)
        if not self.train(recipe.config, run, overrides):
            return
        for f in followers:
            self.train(f.config, self.cell(f, norm, budget, init, seed),
                       [f"{f.data_field}={f.data_path.format(root=self.root(f.data))}", f"backbone.norm={norm}",
                        f"seed={seed}", f"init_from={run / 'best' / 'model.safetensors'}",
                        *([f"train.steps={self.a.steps}"] if self.a.steps else []), *self.a.finetune])


def score(run_dir: Path, recipe: Recipe) -> Optional[float]:
    if runs.status(run_dir) != "finished":
        return None
    value = runs.last_eval(runs.read_records(run_dir))[1].get(recipe.metric_key)
    return None if value is None else value * recipe.scale


def cell_stats(values: list[Optional[float]]) -> dict:
    got = [v for v in values if v is not None]
    return {"mean": statistics.mean(got) if got else None,
            "std": statistics.stdev(got) if len(got) > 1 else 0.0 if got else None, "per_seed": values}


def gain_text(base: Optional[float], best: Optional[float], higher: bool) -> str:
    """The best pretraining against scratch: points for a score, a ratio for an error rate."""
    if base is None or best is None:
        return "-"
    return f"{best - base:+.1f}" if higher else f"{best / base:.2f}x" if base else "-"


def training_seconds(run_dirs: Sequence[Path]) -> tuple[float, float]:
    """(pretraining, fine-tuning) seconds of training, first to last metrics record of each run, in
    this invocation or an earlier one: on idle cores the study's wall time is about their sum / --jobs."""
    total = {True: 0.0, False: 0.0}
    for run_dir in run_dirs:
        times = [r["time"] for r in runs.read_records(run_dir) if isinstance(r.get("time"), (int, float))]
        if len(times) > 1:
            total[run_dir.parent.name == "pretrain"] += times[-1] - times[0]
    return total[True], total[False]


def report(out: Path, table: dict, plan: list[tuple[Recipe, list[str], list[str]]], norms, seeds,
           command: str, timing: Optional[dict] = None, lengths: Optional[dict] = None) -> str:
    """report.md, results.json and labels.png from {(task, norm, budget, init): cell_stats}; plan:
    (recipe, budgets, inits) per task; timing: wall_s, pretrain_s, finetune_s, jobs; lengths: the
    pretrainings' steps, {init: steps}."""
    lengths = lengths or {}
    took = [] if timing is None else [
        f"This invocation took {timing['wall_s'] / 60:.0f} min of wall time, {timing['jobs']} runs at a time. Its "
        f"runs' training (first to last metrics record, also of runs finished earlier) adds up to "
        f"{(timing['pretrain_s'] + timing['finetune_s']) / 60:.0f} min: pretraining {timing['pretrain_s'] / 60:.0f}, "
        f"fine-tuning {timing['finetune_s'] / 60:.0f}.", ""]
    lines = ["# Label budgets: scratch vs pretrained", "", f"`{command}`", "", *took,
             f"The last evaluation of each run on the task's whole evaluation set (it never changes with the "
             f"budget); mean ± std over seeds {', '.join(map(str, seeds))}, per seed in brackets. Every cell of a "
             "task fine-tunes with the same recipe and steps (a pretrained start adds what its heading names, as BEiT's "
             "fine-tuning adds layer decay); gain = best pretraining against scratch (points, or "
             "the ratio of error rates).", ""]
    results = []
    for recipe, budgets, inits in plan:
        higher = higher_is_better(recipe)
        from_pretrained = (f"; from a pretraining with {', '.join(f'`{o}`' for o in recipe.pretrained_overrides)}"
                           if recipe.pretrained_overrides else "")
        lines += [f"## {recipe.task}: {recipe.metric} ({'higher' if higher else 'lower'} is better), "
                  f"`{recipe.config}`{from_pretrained}", "",
                  f"| norm | {unit(recipe)} | " + " | ".join(INIT_LABELS[i] + (f", {lengths[i]:,} steps" if i in lengths
                                                                                else "") for i in inits) + " | gain |",
                  "|" + "---|" * (3 + len(inits))]
        for norm in norms:
            for b in budgets:
                cells = [table.get((recipe.task, norm, b, i)) for i in inits]
                text = []
                for init, c in zip(inits, cells):
                    if c is None or c["mean"] is None:
                        text.append("-")
                        continue
                    seeds_text = " / ".join("-" if v is None else f"{v:.1f}" for v in c["per_seed"])
                    text.append(f"{c['mean']:.1f} ± {c['std']:.1f} ({seeds_text})")
                    results.append({"task": recipe.task, "norm": norm, "budget": b, "init": init, **c})
                means = [c["mean"] if c else None for c in cells]
                pretrained = [m for m in means[1:] if m is not None]
                best = (max if higher else min)(pretrained) if pretrained else None
                lines.append(f"| {norm} | {b} | " + " | ".join(text) + f" | {gain_text(means[0], best, higher)} |")
        lines.append("")
    lines += ["![the metric against the label budget](labels.png)", ""]
    text = "\n".join(lines)
    (out / "report.md").write_text(text)
    (out / "results.json").write_text(json.dumps(
        {"command": command, "norms": list(norms), "seeds": list(seeds), "timing": timing, "pretrain_steps": lengths,
         "tasks": [{"task": r.task, "metric": r.metric_key, "higher_is_better": higher_is_better(r),
                    "budgets": b, "inits": i} for r, b, i in plan],
         "cells": results}, indent=1))
    plot(out / "labels.png", table, plan, norms)
    return text


def plot(path: Path, table: dict, plan, norms) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(len(plan), len(norms), figsize=(4.2 * len(norms), 3.2 * len(plan)), squeeze=False)
    for row, (recipe, budgets, inits) in zip(axes, plan):
        xs = list(range(len(budgets)))
        for ax, norm in zip(row, norms):
            for init in inits:
                points = [(x, table.get((recipe.task, norm, b, init))) for x, b in zip(xs, budgets)]
                points = [(x, c) for x, c in points if c and c["mean"] is not None]
                if not points:
                    continue
                ax.plot([x for x, _ in points], [c["mean"] for _, c in points], "o-", color=COLORS[init],
                        label=INIT_LABELS[init])
                for x, c in points:
                    seeds = [v for v in c["per_seed"] if v is not None]
                    ax.plot([x] * len(seeds), seeds, ".", color=COLORS[init], alpha=0.5)
            ax.set_xticks(xs, budgets)
            ax.set_xlabel(unit(recipe))
            ax.set_title(f"{recipe.task}, {norm}")
            ax.grid(alpha=0.3)
        row[0].set_ylabel(f"{recipe.metric} ({'higher' if higher_is_better(recipe) else 'lower'} is better)")
        if row[-1].get_legend_handles_labels()[0]:  # nothing to name where every cell failed
            row[-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


EXAMPLES = """\
examples:
  foundation data make vision --out data/vision-demo    # and segmentation, speech, vl as needed
  foundation compare labels --quick                    # vision: one seed, 10 per class, scratch vs pixel MIM
  foundation compare labels --tasks classification --seeds 0,1 --jobs 2
  foundation compare labels --tasks asr,vqa,nlvr2 --seeds 0,1 --budgets 0.1,all   # NLVR2 from each VQA cell
  foundation compare labels --tasks classification --inits pixels --norms magneto --budgets 10,100,all
  foundation compare labels --tasks classification --inits tokens --budgets 10 --seeds 0,1,2   # the BEiT path
"""


def main(argv: Sequence[str]) -> int:
    from foundation.engine.demo_cli import demo_data_sets

    recipes = {r.task: r for r in label_recipes()}
    p = argparse.ArgumentParser(prog="foundation compare labels", formatter_class=argparse.RawDescriptionHelpFormatter,
                                description=__doc__.split("\n\n")[0].replace("``", "`"), epilog=EXAMPLES)
    p.add_argument("--data", default="data", help="the folder holding the demo data sets, each in the folder its "
                   "`foundation data make` writes by default (vision-demo, ade-demo, speech-demo, vl)")
    p.add_argument("--out", default="runs/compare-labels")
    p.add_argument("--tasks", default=None, help=f"comma-separated, of {', '.join(recipes)} (default: all; "
                   "--quick: classification); nlvr2 fine-tunes from each vqa cell")
    p.add_argument("--norms", default="preln,magneto")
    p.add_argument("--seeds", default="0,1", help="fine-tuning (and label subset) seeds")
    p.add_argument("--budgets", default=None, help="labelled images per class (classification) or fractions "
                   "(the others); 'all' = every label. Default: each task's own")
    p.add_argument("--inits", default=None, help="pretrainings to fine-tune from, of "
                   f"{', '.join(PRETRAININGS)} (scratch always runs). Default: each task's own")
    p.add_argument("--steps", type=int, default=None, help="fine-tuning steps in every cell (default: the task's)")
    p.add_argument("--pretrain-steps", type=int, default=None, help="every pretraining's length (default: the "
                   "length that paid, each its own: scenes 18000, tokens 12000, the others their configs')")
    p.add_argument("--teacher-steps", type=int, default=None, help="the tokens path's pixel-MIM teacher, when it "
                   "should not be the pixels pretraining (default: the pixels run)")
    p.add_argument("--jobs", type=int, default=2, help="runs that train at a time, one thread each: pretrainings "
                   "first, scratch cells on the cores they leave free")
    p.add_argument("--pretrain", nargs="*", default=[], metavar="key=value", help="overrides of the pretraining runs")
    p.add_argument("--finetune", nargs="*", default=[], metavar="key=value",
                   help="overrides of the fine-tuning runs (NLVR2's too)")
    p.add_argument("--quick", action="store_true", help="one seed, classification at 10 labels per class from "
                   "scratch and from the pixel target (3000 pretraining, 500 fine-tuning steps), unless --tasks says "
                   "otherwise: each task's scarcest budget and first pretraining")
    a = p.parse_args(list(argv))
    try:
        tasks = a.tasks or ("classification" if a.quick else ",".join(recipes))
        names = [t.strip() for t in tasks.split(",") if t.strip()]
        unknown = [t for t in names if t not in recipes]
        if unknown or not names:
            raise ValueError(f"--tasks: unknown {', '.join(unknown)}; known: {', '.join(recipes)}")
        norms = parse_norms(a.norms)
        for flag, value in (("--steps", a.steps), ("--pretrain-steps", a.pretrain_steps),
                            ("--teacher-steps", a.teacher_steps)):
            if value is not None and value <= 0:
                raise ValueError(f"{flag}: must be a positive number of steps (got {value})")
        if a.jobs < 1:
            raise ValueError(f"--jobs: must be at least 1 (got {a.jobs})")
        seeds = parse_ints(a.seeds, "--seeds", "0,1")[:1 if a.quick else None]
        wanted = None if a.inits is None else [i.strip() for i in a.inits.split(",") if i.strip()]
        bad = [i for i in wanted or [] if i not in PRETRAININGS and i != "scratch"]
        if bad:
            raise ValueError(f"--inits: unknown {', '.join(bad)}; known: {', '.join(PRETRAININGS)}")
        plan = []
        for name in names:
            r = recipes[name]
            if not r.label_budgets:  # it starts from another task's cells: their budgets and inits
                if r.init_from_stage not in names:
                    raise ValueError(f"--tasks: {name} fine-tunes from the {r.init_from_stage} cells; "
                                     f"add {r.init_from_stage}")
                continue
            budgets = parse_budgets(a.budgets, r) if a.budgets else list(r.label_budgets)
            inits = [i for i in r.pretrainings if wanted is None or i in wanted]
            if a.quick:
                budgets, inits = budgets[:1], inits[:1]
            plan.append((r, budgets, ["scratch", *inits]))
        plan += [(recipes[n], b, i) for n in names for r, b, i in list(plan) if recipes[n].init_from_stage == r.task]
    except ValueError as e:
        print(f"foundation compare labels: error: {e}", file=sys.stderr)
        return 2
    if a.quick:
        a.pretrain_steps = a.pretrain_steps or 3000
    folders = {name: d.folder for name, d in demo_data_sets().items()}
    needed = {r.data for r, _, _ in plan} | {PRETRAININGS[i].data for _, _, inits in plan for i in inits[1:]}
    for data in sorted(needed):
        if not (Path(a.data) / folders[data]).is_dir():
            print(f"foundation compare labels: error: {Path(a.data) / folders[data]}: no such folder "
                  f"(foundation data make {data} --out {Path(a.data) / folders[data]})", file=sys.stderr)
            return 2
    pool = Path(a.data) / folders["segmentation"] / "unlabelled"
    if any("scenes" in inits for _, _, inits in plan) and not pool.is_dir():
        print(f"foundation compare labels: error: {pool}: no such folder; the 'scenes' pretraining reads the "
              f"segmentation data's unlabelled pool (foundation data make segmentation --out {pool.parent} "
              "--unlabelled 4000 --force)", file=sys.stderr)
        return 2
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    return exclusive(Path(a.out), "foundation compare labels",
                     lambda: run_study(a, folders, plan, norms, seeds, "foundation compare labels " + " ".join(argv)))


def run_study(a: argparse.Namespace, folders: dict[str, str], plan, norms, seeds, command: str) -> int:
    study = Study(a, folders)
    pretrainings = sorted({(n, i) for _, _, inits in plan for i in inits[1:] for n in norms})
    followers = {r.task: [f for f, _, _ in plan if f.init_from_stage == r.task] for r, _, _ in plan}
    cells = [(r, n, b, i, s) for r, budgets, inits in plan if r.label_budgets
             for n in norms for i in inits for b in budgets for s in seeds]
    n_followers = sum(len(followers[c[0].task]) for c in cells)
    print(f"{len(pretrainings)} pretraining runs, {len(cells) + n_followers} fine-tuning runs, {a.jobs} at a time -> "
          f"{a.out}/", flush=True)
    weights: dict[tuple[str, str], Optional[Path]] = {}
    done = {k: threading.Event() for k in pretrainings}
    start = time.perf_counter()

    def pretrain(key: tuple[str, str]) -> None:
        try:
            weights[key] = study.pretrain(*key)
        finally:
            study.slots.chain_done()
            done[key].set()

    def finetune(cell) -> None:
        recipe, norm, budget, init, seed = cell
        if init != "scratch":
            done[norm, init].wait()
            if weights.get((norm, init)) is None:
                return  # its pretraining failed (said in the summary)
        study.finetune(recipe, norm, budget, init, seed, weights.get((norm, init)), followers[recipe.task])

    # a thread per run; `study.slots` lets --jobs of them train at once, pretrainings first, scratch
    # cells meanwhile; a fine-tuning waits for its pretraining without holding a slot
    study.slots.expect(len(pretrainings))
    with ThreadPoolExecutor(max_workers=max(1, len(pretrainings) + len(cells))) as pool:
        jobs = [pool.submit(pretrain, k) for k in pretrainings]
        jobs += [pool.submit(finetune, c) for c in sorted(cells, key=lambda c: c[3] != "scratch")]
        for j in jobs:
            j.result()
    table = {(r.task, n, b, i): cell_stats([score(study.cell(r, n, b, i, s), r) for s in seeds])
             for r, budgets, inits in plan for n in norms for b in budgets for i in inits}
    Path(a.out).mkdir(parents=True, exist_ok=True)
    pretrain_s, finetune_s = training_seconds(sorted(study.run_locks))
    timing = {"wall_s": round(time.perf_counter() - start, 1), "jobs": a.jobs, "pretrain_s": round(pretrain_s, 1),
              "finetune_s": round(finetune_s, 1)}
    lengths = {i: pretrain_steps(i, a.pretrain_steps) for _, _, inits in plan for i in inits[1:]}
    print(report(Path(a.out), table, plan, norms, seeds, command, timing, lengths))
    for f in study.failed:
        print(f"failed: {f}", file=sys.stderr)
    return 1 if study.failed else 0
