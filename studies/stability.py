"""``foundation compare stability``: the learning-rate stability study per modality.

    foundation compare stability [--tasks ...] [--norms ...] [--depths 24,48] [--lrs ...] [--seeds 2]
                                 [--quick] [--clip [C]] [--jobs 2] [--data DIR] [--out DIR] [key=value ...]

For every task with a recipe (``foundation_tasks/<task>/recipe.py``: image classification, MIM, segmentation,
speech recognition, VQA, NLVR2, seq2seq) a deep, narrow version of its tiny recipe - depth 24
(and 48 where the recipe asks for it and the budget allows), width ``NARROW`` where the recipe is
wider - trains over a ladder of peak learning rates (``RUNGS`` rungs of x``FACTOR`` from the
recipe's ``stability_lr``, by default its config's lr / 3) for each rule, each seed: an ordinary
``foundation compare`` run per (norm, lr, seed), resumed or skipped when the command is run again.
No gradient clipping unless ``--clip`` (clipping hides divergence); warm-up as in the recipes.

    OUT/<task>/<depth>L/runs/<norm>_lr<lr>_seed<s>    the runs (studies.compare.Runner)
    OUT/report.md, results.json                       per task and depth: the final metric or
                                                      'diverged at step N' per lr and rule, the largest
                                                      lr that converges, the best metric of the ladder
    OUT/stability.png                                 one panel per task: metric against lr
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from foundation.config import ConfigError
from foundation.engine.recipe import Recipe
from foundation.scaling import RULES
from studies import runs
from studies.compare import OWNED, Runner, check_overrides, common_flags, exclusive, grid, parse_floats, parse_ints, \
    parse_norms, parse_seeds, rules_from_args
from studies.verdict import Outcome, Rules

NORMS = tuple(RULES)  # every rule (foundation.scaling)
DEPTHS = (24,)  # every task; a recipe's stability_depths adds 48 where the budget allows
STEPS = 100  # steps of one run unless the recipe says otherwise (the budget: docs/studies.md)
RUNGS, FACTOR = 5, 3.0  # the ladder: RUNGS peak lrs, each FACTOR x the one before
LOWEST = 1 / 3  # the lowest rung: the config's lr x this (lr / 9 never trained in a short run)
QUICK_RUNGS = 2  # --quick: this many rungs, evenly spaced over the ladder, both ends included (3 would take ~28 min)
NARROW = {"dim": 32, "heads": 2, "ffn_dim": 128}  # the width of a recipe wider than this (DeepNet's 64-128-2, halved)
ALL_OWNED = OWNED + ("backbone.depth", "backbone.decoder_depth")


def ladder(lowest: float, rungs: int = RUNGS, factor: float = FACTOR) -> list[float]:
    """``rungs`` peak lrs from ``lowest``, each ``factor`` x the one before (3 significant digits)."""
    return [float(f"{lowest * factor ** k:.3g}") for k in range(rungs)]


def quick_rungs(lrs: Sequence[float], n: int = QUICK_RUNGS) -> list[float]:
    """``n`` of the ladder's rungs, evenly spaced, the lowest and the highest included."""
    if len(lrs) <= n:
        return list(lrs)
    return [lrs[round(i * (len(lrs) - 1) / (n - 1))] for i in range(n)]


@dataclass
class TaskPlan:
    """One task's share of the study: its config, the overrides every run gets, depths and lrs."""

    recipe: Recipe
    config: Path
    overrides: list[str]  # data, recipe, narrow shape, steps, clipping, then the user's
    depths: list[int]
    lrs: list[float]
    steps: int
    encoder_decoder: bool = False
    about: str = ""
    runners: dict[int, Runner] = field(default_factory=dict)


def depth_overrides(depth: int, encoder_decoder: bool) -> list[str]:
    return [f"backbone.depth={depth}", *([f"backbone.decoder_depth={depth}"] if encoder_decoder else [])]


def plan_task(recipe: Recipe, data: Path, *, depths: Optional[Sequence[int]], lrs: Optional[Sequence[float]],
              steps: Optional[int], clip: Optional[float], quick: bool, user: Sequence[str],
              before: Optional[Path] = None) -> TaskPlan:
    """The task's runs as the recipe declares them, changed by the command line."""
    from foundation.engine.config import load_config
    from studies.demo import data_overrides

    config = Path(recipe.config)  # each run sets its own rule
    base = [*recipe.overrides, *(data_overrides(recipe, data) if recipe.data else [])]
    if before is not None:
        base.append(recipe.before_override.format(run=before))
    cfg, _ = load_config(config, base, check_data=False)
    b = cfg.backbone
    narrow = [f"backbone.{k}={v}" for k, v in NARROW.items()] if b.dim > NARROW["dim"] else []
    n_steps = steps or recipe.stability_steps or STEPS
    # warm-up as in the recipe: the same fraction of the run (a recipe's 50 of 1,000 steps would otherwise
    # leave a short run almost no time at its peak lr, where divergence happens)
    warmup = max(1, round(cfg.schedule.warmup_steps * n_steps / cfg.train.steps)) if cfg.schedule.warmup_steps else 0
    overrides = [*base, *narrow, f"schedule.warmup_steps={warmup}", *recipe.stability_overrides,
                 f"train.steps={n_steps}",
                 f"optim.clip_grad={clip if clip is not None else 'null'}", "eval.every=0", "save.every=0",
                 "save.keep=1", f"log.every={max(1, n_steps // 40)}", "log.writers=[jsonl]", *user]
    depths = list(depths or recipe.stability_depths or DEPTHS)
    lrs = list(lrs or ladder(recipe.stability_lr or cfg.optim.lr * LOWEST))
    if quick:
        depths, lrs = depths[:1], quick_rungs(lrs)
    resolved, _ = load_config(config, [*overrides, *depth_overrides(depths[0], b.arch == "encoder_decoder")],
                              check_data=False)
    r = resolved.backbone
    about = (f"width {r.dim}, ffn {r.ffn_dim}, {r.heads} heads{', encoder-decoder NL-NL' if b.arch == 'encoder_decoder' else ''}, "
             f"{n_steps} steps of batch {resolved.train.batch_size}, {resolved.schedule.name} schedule with "
             f"{resolved.schedule.warmup_steps} warm-up steps, "
             + (f"gradients clipped to {resolved.optim.clip_grad:g}" if resolved.optim.clip_grad else "no gradient clipping"))
    return TaskPlan(recipe, config, overrides, depths, lrs, n_steps, b.arch == "encoder_decoder", about)


def train_before(recipe: Recipe, data: Path, out: Path, say: Callable[[str], None]) -> Optional[Path]:
    """The run the task's runs need first (MIM: its visual tokenizer), trained once per study."""
    if not recipe.before:
        return None
    config, *extra = recipe.before
    run_dir = out / "before" / recipe.task
    from studies.demo import data_dirs

    root = data / data_dirs()[recipe.data] if recipe.data else data
    overrides = [*(o.format(root=root) for o in extra), f"output_dir={run_dir.parent}", f"run_name={run_dir.name}",
                 "log.progress=false"]
    failure = runs.ensure(Path(config), overrides, run_dir, say=say, head=f"{recipe.task}: {config} (needed first)")
    if failure:
        raise RuntimeError(f"{recipe.task}: {config} failed: {failure}")
    return run_dir


# ---------------------------------------------------------------------------- the study


def study(plans: Sequence[TaskPlan], out: Path, norms: Sequence[str], seeds: Sequence[int], *, jobs: int = 2,
          rules: Rules = Rules(), command: str = "", in_process: bool = False, overwrite: bool = False,
          report_only: bool = False, say: Callable[[str], None] = print) -> int:
    lock = threading.Lock()

    def tell(text: str) -> None:
        with lock:
            say(text)

    work = []  # (cost, plan, depth, runner, spec)
    for plan in plans:
        for depth in plan.depths:
            runner = Runner(plan.config, out / plan.recipe.task / f"{depth}L",
                            [*plan.overrides, *depth_overrides(depth, plan.encoder_decoder)],
                            in_process=in_process, overwrite=overwrite, rules=rules,
                            say=lambda text, t=plan.recipe.task, d=depth: tell(f"{t} {d}L {text}"))
            specs = grid(norms, seeds, plan.lrs)
            for spec in specs:
                spec.depth = depth
            try:
                primary, higher = runner.check(specs)
            except ConfigError as e:
                print(f"foundation compare stability: error: {plan.recipe.task}: {e}", file=sys.stderr)
                return 2
            plan.runners[depth] = runner
            runner.primary, runner.higher = primary, higher
            work += [(depth * plan.steps, plan, depth, runner, s)  # a step of the narrow models costs about the same
                     for s in specs]
    work.sort(key=lambda w: -w[0])  # longest first, so that the jobs end together
    if report_only:  # the runs that finished (or diverged) so far; nothing trains
        work = [w for w in work if runs.status(w[3].out / "runs" / w[4].name) in runs.DONE]
    say(f"{len(work)} runs ({', '.join(f'{p.recipe.task} {len(p.depths) * len(p.lrs) * len(norms) * len(seeds)}' for p in plans)}), "
        f"{jobs} at a time -> {out}")
    start = time.perf_counter()
    counter = iter(range(1, len(work) + 1))

    def one(w) -> tuple:
        _, plan, depth, runner, spec = w
        return plan.recipe.task, depth, runner.one(next(counter), spec, len(work))

    try:
        if in_process or jobs == 1:
            done = [one(w) for w in work]
        else:
            with ThreadPoolExecutor(max_workers=jobs) as pool:
                done = list(pool.map(one, work))
    except KeyboardInterrupt:
        print("\ninterrupted; the same command resumes the study", file=sys.stderr)
        return 130
    wall = time.perf_counter() - start
    outcomes: dict[tuple[str, int], list[Outcome]] = {}
    for task, depth, outcome in done:
        outcomes.setdefault((task, depth), []).append(outcome)
    from studies.stability_report import write_report

    write_report(out, plans, outcomes, norms, seeds, rules, command, wall)
    say(f"wrote {out}/report.md, results.json, stability.png")
    return 0


# ---------------------------------------------------------------------------- command line

EXAMPLES = f"""\
defaults: every task with a recipe, norms {','.join(NORMS)}, 2 seeds, depth {DEPTHS[0]} (and the depths a recipe
adds, e.g. 48 for seq2seq), {RUNGS} learning rates of x{FACTOR:g} from the recipe's lowest rung, {STEPS} steps a
run (a recipe may set its own), no gradient clipping, 2 runs at a time.

examples:
  foundation compare stability --quick                    # one depth, seed 0, {QUICK_RUNGS} rungs: <= 20 min on 2 cores
  foundation compare stability                            # the whole study: <= 2.5 h on 2 cores (--jobs 2)
  foundation compare stability --tasks seq2seq --depths 24,48 --norms postln,foundation_ln,deepnorm,upscale_ln
  foundation compare stability --tasks classification --lrs 1e-4,1e-3,1e-2 --clip 1.0 train.batch_size=32

The same command again skips finished runs and resumes the others. The demo data sets are made under --data
when missing (`foundation data make`).
"""


def main(argv: Sequence[str]) -> int:
    from studies.recipes import recipes

    every = {r.task: r for r in recipes()}
    p = argparse.ArgumentParser(
        prog="foundation compare stability", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES,
        description="The learning-rate stability study per modality: a deep, narrow version of each task's tiny "
                    "recipe over a ladder of peak learning rates, for each rule and seed; writes OUT/report.md "
                    "(per task: the final metric or 'diverged at step N' per lr and rule) and OUT/stability.png.")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides for every run of every task")
    p.add_argument("--tasks", default=None, help=f"comma-separated (default all: {','.join(every)})")
    p.add_argument("--norms", default=",".join(NORMS), help="comma-separated rules or presets (foundation_ln, "
                                                            "upscale_ln) (default %(default)s)")
    p.add_argument("--depths", default=None, help="comma-separated (default: each recipe's, else 24)")
    p.add_argument("--lrs", default=None, help="comma-separated peak lrs for every task (default: each task's ladder)")
    p.add_argument("--steps", type=int, default=None, help=f"steps of every run (default: each recipe's, else {STEPS})")
    p.add_argument("--seeds", default="2", help="a count or a comma-separated list (default 2: seeds 0 and 1)")
    p.add_argument("--quick", action="store_true",
                   help=f"one depth (the first), seed 0, {QUICK_RUNGS} rungs of the ladder (its ends)")
    p.add_argument("--clip", type=float, nargs="?", const=1.0, default=None,
                   help="clip gradients to this norm (default: no clipping; --clip alone: 1.0)")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each (default 2)")
    p.add_argument("--data", type=Path, default=Path("data"), help="demo data sets, made when missing (default data)")
    p.add_argument("--report", action="store_true",
                   help="write the report of the runs that have ended so far (e.g. while another invocation "
                        "trains, or after stopping one); train nothing")
    p.add_argument("--out", type=Path, default=None, help="report directory (default runs/compare-stability[-quick])")
    common_flags(p)
    args = p.parse_intermixed_args(argv)
    try:
        norms = parse_norms(args.norms)
        wanted = [t.strip() for t in (args.tasks or ",".join(every)).split(",") if t.strip()]
        unknown = [t for t in wanted if t not in every]
        if unknown or not wanted:
            raise ValueError(f"--tasks: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(every)}")
        depths = parse_ints(args.depths, "--depths", "24,48") if args.depths else None
        if depths and min(depths) < 1:
            raise ValueError("--depths: depths must be >= 1")
        lrs = parse_floats(args.lrs) if args.lrs else None
        if args.steps is not None and args.steps < 1:
            raise ValueError("--steps must be >= 1")
        if args.jobs < 1:
            raise ValueError("--jobs must be >= 1")
        if args.clip is not None and not args.clip > 0:
            raise ValueError("--clip must be > 0")
        seeds = [0] if args.quick else parse_seeds(args.seeds, 0)
        check_overrides(args.overrides, ALL_OWNED)
        rules = rules_from_args(args)
    except ValueError as e:
        print(f"foundation compare stability: error: {e}", file=sys.stderr)
        return 2
    out = args.out or Path("runs") / ("compare-stability-quick" if args.quick else "compare-stability")
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # tiny models: one thread per run is fastest
    chosen = [every[t] for t in wanted]
    from studies.demo import make_data

    make_data(sorted({r.data for r in chosen if r.data}), args.data, print)
    plans = []
    try:
        for recipe in chosen:
            before = train_before(recipe, args.data, out, print)
            plans.append(plan_task(recipe, args.data, depths=depths, lrs=lrs, steps=args.steps, clip=args.clip,
                                   quick=args.quick, user=args.overrides, before=before))
    except (ConfigError, RuntimeError) as e:
        print(f"foundation compare stability: error: {e}", file=sys.stderr)
        return 2
    return exclusive(out, "foundation compare stability", lambda: study(
        plans, out, norms, seeds, jobs=args.jobs, rules=rules, in_process=args.in_process, overwrite=args.overwrite,
        report_only=args.report, command="foundation compare stability " + " ".join(argv)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
