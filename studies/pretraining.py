"""``foundation compare pretraining``: does cross-modal pretraining help each task more than
pretraining on the task's own modality alone, at the same budget?

Four pretraining runs of ONE backbone (``configs/crossmodal/tiny_<norm>.yaml``: experts per
modality, rel_pos 1d), all with the same steps, batches, schedule and seed:

* ``crossmodal``: every task entry of the config - vision MIM, BEiT-3 masked data modeling
  over image-text pairs (one content word a caption masked, the class token naming it), BEST-RQ
  on speech - one batch of each per step;
* ``vision`` / ``vl`` / ``speech``: the same config with only that modality's entries (the
  others deleted with ``~tasks.<id>``), so each sees exactly the batches of its modality the
  cross-modal run sees, and nothing else.

"Same budget" is thus the same optimizer steps and the same in-modality data; the cross-modal
run spends more compute per step (the other modalities' batches). Then every task's tiny
recipe (each task whose ``foundation_tasks/<task>/recipe.py`` names a modality) fine-tunes from
scratch, from its modality's run and from the cross-modal run, with its backbone set to the
pretraining one (width, depth, heads, relative positions) in all three, so only the
initialisation differs. ``--scarce`` fine-tunes each task on its scarcest label budget instead
(its recipe's first, as ``foundation compare labels``: 10 images per class, 10 % of the masks,
transcripts or questions; the subset drawn with the seed), where pretraining should pay. Every
cell is an ordinary ``foundation compare``
(one norm, the seeds); the same command again skips what finished and resumes the rest.

    OUT/pretrain-<run>/           compare reports of the pretraining runs
    OUT/<task>-<init>/            compare reports of the fine-tuning runs (init: scratch, single, crossmodal)
    OUT/report.md, results.json   the table: task x init, mean ± std over seeds; pretraining.png
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Optional, Sequence

from foundation.config import ConfigError
from foundation.engine.recipe import Recipe
from studies.compare import Runner, check_overrides, compare, exclusive, grid, norm_overrides, parse_norms, parse_seeds
from studies.compare import write_report as write_cell_report
from studies.plots import pyplot
from studies.verdict import Rules, judge

PRETRAIN_CONFIG = "configs/crossmodal/tiny.yaml"
# modality run -> the task entries (ids in the cross-modal config) it keeps
PRETRAIN_RUNS = {"vision": ("mim",), "vl": ("pair",), "speech": ("speech",),
                 "crossmodal": ("mim", "pair", "speech")}
INITS = ("scratch", "single", "crossmodal")
INIT_LABELS = {"scratch": "scratch", "single": "own modality only", "crossmodal": "cross-modal"}
ARCH_FIELDS = ("dim", "depth", "heads", "ffn_dim", "rel_pos")


# the modalities' fine-tuning tasks, longest first (so that two jobs finish together): the
# order of the jobs and of the table's rows
FINETUNE_ORDER = ("speech", "vl", "vision")


def finetunes() -> list[Recipe]:
    """The tasks whose recipe (foundation_tasks/<task>/recipe.py) names a pretraining modality: by
    modality (``FINETUNE_ORDER``), then in the recipes' table order."""
    from studies.recipes import recipes

    return sorted((r for r in recipes() if r.modality),
                  key=lambda r: FINETUNE_ORDER.index(r.modality) if r.modality in FINETUNE_ORDER else len(FINETUNE_ORDER))


def pretrain_overrides(keep: Sequence[str], all_ids: Sequence[str]) -> list[str]:
    return [f"~tasks.{i}" for i in all_ids if i not in keep]


def weights(out: Path, run: str, norm: str, lr: float, seed: int) -> Path:
    (spec,) = grid([norm], [seed], [lr])
    return out / f"pretrain-{run}" / "runs" / spec.name / "best" / "model.safetensors"


def finetune_overrides(init: str, arch: dict, ckpt: Optional[Path]) -> list[str]:
    """The pretraining backbone's shape for every init; for the pretrained ones init_from, which
    loads the backbone and every front-end / head tensor whose name matches."""
    shape = [f"backbone.{k}={arch[k]}" for k in ARCH_FIELDS]
    return [*shape, f"init_from={ckpt if init != 'scratch' else 'null'}"]


def cell_table(cells: dict, finetunes: Sequence[Recipe]) -> str:
    lines = ["| task | metric | " + " | ".join(INIT_LABELS[i] for i in INITS) + " |",
             "|---|---|" + "---|" * len(INITS)]
    for ft in finetunes:
        row = [ft.task]
        metric = None
        for init in INITS:
            c = cells.get((ft.task, init))
            if c is None:
                row.append("-")
                continue
            metric = c["metric"]
            vals = [v for v in c["per_seed"] if v is not None]
            if not vals:
                row.append(c["verdict"])
                continue
            seeds_txt = " / ".join("div" if v is None else f"{v * ft.scale:.1f}" for v in c["per_seed"])
            row.append(f"{c['mean'] * ft.scale:.1f} ± {c['std'] * ft.scale:.1f} ({seeds_txt})")
        arrow = "" if metric is None else (" ↑" if cells[(ft.task, INITS[0])]["higher"] else " ↓")
        lines.append(f"| {row[0]} | {metric or '-'}{arrow} | " + " | ".join(row[1:]) + " |")
    return "\n".join(lines)


def read_cell(out: Path) -> dict:
    r = json.loads((out / "results.json").read_text())
    (s,) = r["summary"]
    primary = r["primary_metric"]
    m = s["metrics"].get(primary, {"per_seed": []})
    return {"metric": primary.split("/")[-1], "higher": r["higher_is_better"], "per_seed": m["per_seed"],
            "mean": m.get("mean"), "std": m.get("std"),
            "seeds": s["seeds"], "verdict": s["verdict"], "report": str(out / "report.md")}


def plot(cells: dict, finetunes: Sequence[Recipe], path: Path, title: str) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(finetunes), figsize=(2.6 * len(finetunes), 3.2), squeeze=False)
    colors = {"scratch": "tab:gray", "single": "tab:blue", "crossmodal": "tab:purple"}
    for ax, ft in zip(axes[0], finetunes):
        for x, init in enumerate(INITS):
            c = cells.get((ft.task, init))
            vals = [v * ft.scale for v in (c["per_seed"] if c else []) if v is not None]
            if not vals:
                continue
            mean = sum(vals) / len(vals)
            ax.bar(x, mean, color=colors[init], alpha=0.8)
            ax.plot([x] * len(vals), vals, "k.", ms=6)
        c0 = cells.get((ft.task, INITS[0]))
        ax.set_xticks(range(len(INITS)), ["scratch", "own\nmodality", "cross-\nmodal"], fontsize=8)
        ax.set_title(f"{ft.task}: {c0['metric'] if c0 else ft.metric}" + ("" if not c0 else (" ↑" if c0["higher"] else " ↓")),
                     fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(
        prog="foundation compare pretraining", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n\n")[0].replace("``", "`"),
        epilog="Needs the demo data:\n"
               "  foundation data make vision --out data/vision-demo\n"
               "  foundation data make vl --out data/vl; foundation data make speech --out data/speech-demo\n"
               "  foundation data make segmentation --out data/ade-demo\n"
               "examples:\n"
               "  foundation compare pretraining --seeds 2                 # everything, Magneto\n"
               "  foundation compare pretraining --tasks vqa,nlvr2 --norm preln\n"
               "  foundation compare pretraining --scarce train.steps=3000   # scarce labels, longer pretraining\n")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="dotted overrides for the pretraining runs, e.g. backbone.experts=[] or train.steps=600")
    p.add_argument("--norm", default="magneto", help="the backbone rule of every run (default magneto)")
    p.add_argument("--seeds", default="1", help="a count from 0 or a list (default 1); seed s pretrains "
                                                "and then fine-tunes from its own pretraining runs")
    known = {r.task: r for r in finetunes()}
    p.add_argument("--tasks", default=None,
                   help=f"comma-separated fine-tuning tasks (default all: {','.join(known)}; with --scarce those "
                        "with label budgets)")
    p.add_argument("--out", type=Path, default=None,
                   help="report directory (default runs/compare-pretraining, with --scarce "
                        "runs/compare-pretraining-scarce)")
    p.add_argument("--scarce", action="store_true",
                   help="fine-tune every task on its scarcest label budget (its recipe's first: 10 images per "
                        "class, 10 %% of the masks, transcripts, questions; drawn with the seed) with the label "
                        "study's steps; tasks without label budgets (NLVR2) are left out")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each (default 2)")
    p.add_argument("--in-process", action="store_true", help="train in this process, one run at a time")
    a = p.parse_intermixed_args(argv)
    from foundation.engine.config import load_config

    try:
        norms = parse_norms(a.norm)
        if len(norms) != 1:
            raise ValueError(f"--norm: one rule per comparison (got {a.norm!r}); run the command once per rule")
        norm = norms[0]
        seeds = parse_seeds(a.seeds, 0)
        if a.scarce:
            known = {t: r for t, r in known.items() if r.label_budgets}
        wanted = [t.strip() for t in (a.tasks or ",".join(known)).split(",") if t.strip()]
        bad = [t for t in wanted if t not in known]
        if bad or not wanted:
            raise ValueError(f"--tasks: unknown {', '.join(bad) or '(none given)'}"
                             f"{' (without label budgets)' if a.scarce else ''}; known: {', '.join(known)}")
        if a.jobs < 1:
            raise ValueError("--jobs must be >= 1")
        check_overrides(a.overrides, ("backbone.norm", "seed", "run_name", "output_dir", "resume", "overwrite"))
        pre_config = Path(PRETRAIN_CONFIG)
        base, specs = load_config(pre_config, a.overrides, check_data=False)
    except (ValueError, ConfigError) as e:
        print(f"foundation compare pretraining: error: {e}", file=sys.stderr)
        return 2
    chosen = [r for r in known.values() if r.task in wanted]
    out = a.out or Path("runs/compare-pretraining-scarce" if a.scarce else "runs/compare-pretraining")
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # tiny models: one thread per run is fastest (as foundation demo)
    return exclusive(out, "foundation compare pretraining", lambda: run(
        out, norm, seeds, chosen, pre_config, list(a.overrides), [s.id for s in specs],
        {k: getattr(base.backbone, k) for k in ARCH_FIELDS}, a.jobs, a.in_process, scarce=a.scarce,
        command="foundation compare pretraining " + " ".join(argv)))


def run(out: Path, norm: str, seeds: Sequence[int], finetunes: Sequence[Recipe], pre_config: Path,
        pre_overrides: list[str], all_ids: Sequence[str], arch: dict, jobs: int,
        in_process: bool = False, *, pretrain_runs: dict = PRETRAIN_RUNS, command: str = "",
        say: Callable[[str], None] = print, scarce: bool = False) -> int:
    """Pretrain (the runs ``finetunes`` need) and fine-tune every task x init, seed by seed
    (seed s fine-tunes from the pretraining runs of seed s), then write the report. ``scarce``:
    every fine-tuning on its recipe's scarcest label budget, drawn with the seed."""
    from foundation.engine.config import load_config

    if in_process:  # the engine seeds the process-wide RNGs: runs in threads of one process would race
        jobs = 1
    lock = threading.Lock()

    def tell(msg: str) -> None:
        with lock:
            say(msg, flush=True) if say is print else say(msg)

    needed = sorted({f.modality for f in finetunes} | {"crossmodal"}, key=lambda r: (r != "crossmodal", r))
    unknown = [i for r in needed for i in pretrain_runs[r] if i not in all_ids]
    if unknown:
        print(f"foundation compare pretraining: error: {pre_config} has no task entries {', '.join(unknown)} "
              f"(it has {', '.join(all_ids)})", file=sys.stderr)
        return 2
    pre = {r: [*pre_overrides, *pretrain_overrides(pretrain_runs[r], all_ids)] for r in needed}
    recipe = {ft.task: Path(ft.config) for ft in finetunes}

    # every recipe resolves (data, tokenizer, overrides) before anything trains, the fine-tuning
    # ones as scratch runs (their init_from files come from the pretraining); each keeps its own
    # learning rate (compare would otherwise set one for all)
    lrs: dict[Path, float] = {}
    errors: list[str] = []
    for config, overrides in [*((pre_config, o) for o in pre.values()),
                              *((recipe[ft.task], finetune_overrides("scratch", arch, None)) for ft in finetunes)]:
        try:
            lrs[config] = load_config(config, [*overrides, *norm_overrides(norm)])[0].optim.lr
        except ConfigError as e:
            if str(e) not in errors:
                errors.append(str(e))
    if errors:
        print("\n".join(f"foundation compare pretraining: error: {e}" for e in errors), file=sys.stderr)
        return 2
    failed: list[str] = []

    def go(job) -> None:
        name, config, seed, overrides = job
        if compare(config, out / name, [norm], [seed], [lrs[config]], overrides, in_process=in_process,
                   command=command, say=lambda m: tell(f"  {name}: {m}")):
            failed.append(f"{name} seed {seed}")

    tell(f"[1/3] pretraining: {', '.join(needed)} x {len(seeds)} seeds, {jobs} at a time -> {out}/pretrain-*")
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(go, [(f"pretrain-{r}", pre_config, seed, pre[r]) for seed in seeds for r in needed]))
    if failed:
        print(f"foundation compare pretraining: pretraining failed: {', '.join(failed)} (see "
              f"{out}/pretrain-*/runs/*/train.log)", file=sys.stderr)
        return 1

    def overrides(ft: Recipe, init: str, seed: int) -> list[str]:
        run = None if init == "scratch" else ft.modality if init == "single" else "crossmodal"
        labels = ft.label_overrides(ft.label_budgets[0], seed) if scarce else []
        return [*finetune_overrides(init, arch, run and weights(out, run, norm, lrs[pre_config], seed)), *labels,
                *(ft.pretrained_overrides if run else ())]

    tell(f"[2/3] fine-tuning: {len(finetunes)} tasks x {len(INITS)} inits x {len(seeds)} seeds, {jobs} at a time")
    with ThreadPoolExecutor(max_workers=jobs) as pool:  # seed-major: the first seed's table is complete first
        list(pool.map(go, [(f"{ft.task}-{init}", recipe[ft.task], seed, overrides(ft, init, seed))
                           for seed in seeds for ft in finetunes for init in INITS]))
    if failed:  # each said why in one line; the report needs every cell
        print(f"foundation compare pretraining: fine-tuning failed: {', '.join(failed)}", file=sys.stderr)
        return 1

    tell("[3/3] report")
    for r in needed:  # same overrides for every seed: compare itself reports (it trains nothing now)
        compare(pre_config, out / f"pretrain-{r}", [norm], seeds, [lrs[pre_config]], pre[r], in_process=in_process,
                command=command, say=lambda m: None)
    cells = {}
    for ft in finetunes:  # init_from differs per seed: read the runs and write each cell's report
        for init in INITS:
            cell_out, config = out / f"{ft.task}-{init}", recipe[ft.task]
            specs = grid([norm], seeds, [lrs[config]])
            higher = Runner(config, cell_out, overrides(ft, init, seeds[0])).check(specs[:1])[1]
            primary = ft.metric_key  # the recipe's metric, as the label study and the demo read it (ASR: test WER)
            outcomes = [judge(spec, cell_out / "runs" / spec.name, Rules()) for spec in specs]
            write_cell_report(cell_out, config, outcomes, [norm], seeds, [lrs[config]], primary, higher, command, Rules(),
                              "Every seed fine-tunes from the pretraining runs of the same seed.")
            cells[(ft.task, init)] = read_cell(cell_out)
    primaries = {t.id: t.cls.primary(t.config)[0] for t in load_config(pre_config, pre_overrides, check_data=False)[1]}
    write_report(out, cells, finetunes, norm, seeds, pre_config, arch, command, {r: pretrain_runs[r] for r in needed},
                 pretrain_table(out, {r: pretrain_runs[r] for r in needed}, primaries), scarce=scarce)
    tell(f"\n{cell_table(cells, finetunes)}\n\nwrote {out}/report.md, results.json, pretraining.png")
    return 0


def pretrain_table(out: Path, pretrain_runs: dict, primaries: dict[str, str]) -> str:
    """Each pretraining objective's own evaluation (its task's primary metric: accuracies in %,
    losses as they are), trained alone with its modality and inside the cross-modal run."""
    def summary(run: str) -> dict:
        path = out / f"pretrain-{run}" / "results.json"
        return json.loads(path.read_text())["summary"][0]["metrics"] if path.is_file() else {}

    def fmt(m: Optional[dict], key: str) -> str:
        vals = [v for v in (m or {}).get("per_seed", []) if v is not None]
        if not vals:
            return "-"
        scale, digits = (1, 3) if key.endswith("loss") else (100, 1)
        return (f"{m['mean'] * scale:.{digits}f} ± {m['std'] * scale:.{digits}f} ("
                + " / ".join(f"{v * scale:.{digits}f}" for v in vals) + ")")

    cross = summary("crossmodal")
    lines = ["| objective | metric (accuracies in %) | its modality alone | cross-modal |", "|---|---|---|---|"]
    for run, ids in pretrain_runs.items():
        if run == "crossmodal":
            continue
        alone = summary(run)
        for i in ids:
            key = f"{i}/{primaries.get(i, 'accuracy')}"
            lines.append(f"| {i} (`{run}` run) | {key} | {fmt(alone.get(key), key)} | {fmt(cross.get(key), key)} |")
    return "\n".join(lines)


def budget_text(ft: Recipe) -> str:
    """The recipe's scarcest budget in words: "10 labelled images per class", "10 % of the questions"."""
    budget = ft.label_budgets[0]
    if ft.label_unit.startswith("fraction of "):
        return f"{float(budget) * 100:g} % of {ft.label_unit[len('fraction of '):]}"
    return f"{budget} {ft.label_unit}"


def write_report(out: Path, cells: dict, finetunes, norm, seeds, pre_config, arch, command,
                 pretrain_runs: dict, objectives: str = "", scarce: bool = False) -> None:
    shape = ", ".join(f"{k} {v}" for k, v in arch.items())
    budgets = "; ".join(f"{ft.task}: {budget_text(ft)}" + (f", {ft.label_steps} steps" if ft.label_steps else "")
                        for ft in finetunes) if scarce else ""
    parts = [
        "# Cross-modal vs single-modality pretraining",
        "",
        f"`{command.strip()}`",
        "",
        f"Backbone rule `{norm}`; every run has the backbone of `{pre_config}` ({shape}). Pretraining: the "
        "runs below, the same steps and batches; the single-modality runs keep only their modality's task "
        f"entries. Fine-tuning: each task's tiny recipe{f' on its scarcest label budget ({budgets})' if scarce else ''}. Seeds {', '.join(map(str, seeds))}: seed s fine-tunes "
        "from the pretraining runs of seed s. Mean ± sample std over seeds, per-seed values in brackets "
        "(`div`: diverged).",
        "",
        "| pretraining run | task entries |",
        "|---|---|",
        *[f"| {r} | {', '.join(ids)} |" for r, ids in pretrain_runs.items()],
        "",
        "The pretraining objectives after the last step (evaluation on held-out data):",
        "",
        objectives,
        "",
        "Fine-tuning (own modality only: " + "; ".join(f"{ft.task} from `{ft.modality}`" for ft in finetunes)
        + "):",
        "",
        cell_table(cells, finetunes),
        "",
        "![pretraining](pretraining.png)",
        "",
        "Each cell is a `foundation compare` report: "
        + ", ".join(f"[{ft}-{i}]({ft}-{i}/report.md)" for ft, i in cells) + ".",
        "",
    ]
    (out / "report.md").write_text("\n".join(parts))
    results = {"command": command.strip(), "norm": norm, "seeds": list(seeds),
               "backbone": arch, "pretrain_runs": {k: list(v) for k, v in pretrain_runs.items()},
               "cells": [{"task": t, "init": i, **c} for (t, i), c in cells.items()]}
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    if cells:
        plot(cells, finetunes, out / "pretraining.png", f"{norm}: scratch vs own-modality vs cross-modal pretraining")
