"""``foundation demo``: Pre-LN against Magneto on every modality, from nothing, in minutes.

    foundation demo                         # data/ + runs/demo, ~15 minutes on 2 idle CPU cores
    foundation demo --only vision,vqa       # a subset
    foundation demo --steps-scale 5         # 5x longer runs (closer to the README's tables)
    foundation demo --seeds 0,1,2           # every run under 3 seeds: mean and range per row, ~50 minutes

Stage 1 generates the demo data sets that are missing (``foundation data make``, in their
real layouts); stage 2 runs ``foundation compare`` on each task's tiny config with short
runs (Pre-LN and Magneto, one seed unless ``--seeds``, two runs at a time, one thread each);
stage 3 prints one table and where the reports and curves are. Each row names its bar (the
task's ``Recipe.bar``) and whether every run reached it. Everything is an ordinary run directory
under ``--out``: the same command again reuses what finished and resumes the rest.

Each row shows, beside the two rules' numbers, what the metric is without learning
(chance, the VQA answer prior computed from the data), so a reader sees whether the runs
learnt. Every run is its own job, longest first (speech: two ~6-minute runs), so that the
two threads finish together; a stage whose recipe names ``init_from_stage`` (NLVR2: VQA)
starts each run from that stage's run of the same norm and seed, once it has finished.
The step counts aim at the whole demo, data included, in ~15 minutes on 2 idle cores (~16 today).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

from foundation.engine.recipe import Recipe
from studies.verdict import Outcome

NORMS = ("preln", "magneto")
NAMES = {"preln": "Pre-LN", "magneto": "Magneto"}
SLOWEST_FIRST = ("magneto", "preln")  # the order of each stage's runs (run_order)


def data_dirs() -> dict[str, str]:
    """Demo data set -> its folder under data/, as the generators declare them."""
    from foundation.engine.demo_cli import demo_data_sets

    return {d.name: d.folder for d in demo_data_sets().values()}


def stages() -> list[Recipe]:
    """The demo's stages: every task recipe (foundation_tasks/<task>/recipe.py) with demo data and demo steps, in
    table order.

    Steps are chosen so that the whole demo takes at most 15 minutes on 2 idle CPU cores, two
    runs at a time (14 min 33 s and 13 min 56 s on an idle 2-core AMD EPYC, the README; ``minutes`` orders them)."""
    from studies.recipes import recipes

    return [r for r in recipes() if r.data and r.steps]


def data_dir(stage: Recipe, data: Path) -> Path:
    """The folder the stage's config reads: in its data set's folder under ``data``."""
    return Path(stage.data_path.format(root=data / data_dirs()[stage.data]))


def data_overrides(stage: Recipe, data: Path) -> list[str]:
    """Point the config's data field at ``data`` (the configs read ``data/<set>``)."""
    return [f"{stage.data_field}={data_dir(stage, data)}"]


def make_data(names: list[str], data: Path, say, jobs: int = 1) -> None:
    """Generate the missing data sets, ``jobs`` processes at a time, speech first (the longest).
    More jobs gain little here: speech's resampling alone keeps both cores busy."""
    missing = []
    for name in names:
        out = data / data_dirs()[name]
        if out.is_dir() and any(out.iterdir()):
            say(f"  {name}: {out} exists, reused")
        else:
            missing.append(name)
    if not missing:
        return
    order = sorted(missing, key=lambda n: (n != "speech", n))
    for name in order:
        say(f"  {name}: generating {data / data_dirs()[name]} ...")
    # processes, not threads: the generators are Python-heavy, so threads would wait on the GIL
    with ProcessPoolExecutor(max_workers=min(jobs, len(order))) as pool:
        for name, (rc, seconds) in zip(order, pool.map(make_one, order, [data] * len(order))):
            out = data / data_dirs()[name]
            if rc:
                raise SystemExit(f"foundation demo: `foundation data make {name} --out {out}` failed (exit {rc})")
            say(f"  {name}: {out} ({seconds:.0f} s)")


def make_one(name: str, data: Path) -> tuple[int, float]:
    """``foundation data make NAME --out DATA/<dir>`` (in a worker process): exit code, seconds."""
    import importlib

    from foundation.engine.demo_cli import demo_data_sets

    start = time.perf_counter()
    rc = importlib.import_module(demo_data_sets()[name].module).main(["--out", str(data / data_dirs()[name])])
    sys.stdout.flush()
    return rc, time.perf_counter() - start


def prior_value(stage: Recipe, data: Path) -> float:
    """The stage's no-learning metric computed from the data (VQA: the most frequent training answer
    per question type, scored on the evaluation split), on the table's scale."""
    import importlib

    return 100 * importlib.import_module(stage.prior).answer_prior(data_dir(stage, data))


def baseline(stage: Recipe, data: Path) -> str:
    """The stage's no-learning reference: its fixed text, or its prior computed from the data."""
    if not stage.prior:
        return stage.baseline or "-"
    try:
        return f"answer prior {prior_value(stage, data):.1f}"
    except (OSError, ValueError) as e:
        return f"answer prior: {e}"


def bar_threshold(stage: Recipe, data: Path) -> tuple[str, float] | None:
    """The stage's bar as (">=" or "<=", threshold on the shown scale); None without a bar or a prior.
    ``bar`` reads ">= 85", "<= 20" or ">= prior + 20" (relative to the prior computed from the data)."""
    m = re.fullmatch(r"\s*(>=|<=)\s*(prior\s*\+\s*)?(\d+(?:\.\d+)?)\s*", stage.bar)
    if m is None:
        return None
    threshold = float(m.group(3))
    if m.group(2):
        try:
            threshold += prior_value(stage, data)
        except (OSError, ValueError):
            return None
    return m.group(1), threshold


def bar_cell(stage: Recipe, data: Path, outcomes: dict[tuple[str, int], Outcome]) -> str:
    """Whether every run of the stage reached its bar: "met", or which runs missed it and by what."""
    bar = bar_threshold(stage, data)
    if bar is None:
        return "-"
    op, threshold = bar
    missed = []
    for (norm, seed), o in sorted(outcomes.items(), key=lambda kv: (NORMS.index(kv[0][0]), kv[0][1])):
        value = metric_of(stage, o)
        if value is None or (value < threshold if op == ">=" else value > threshold):
            missed.append(f"{NAMES[norm]} seed {seed}: {'-' if value is None else f'{value:.1f}'}")
    shown = f"{op} {threshold:.1f}" if "prior" in stage.bar else f"{op} {threshold:g}"
    return f"{shown}: " + ("met" if not missed else "missed by " + ", ".join(missed))


def metric_of(stage: Recipe, o: Outcome) -> float | None:
    """The stage's metric of one run on the table's scale (None: the run has no evaluation)."""
    value = next((v for k, v in o.metrics.items() if k.split("/")[-1] == stage.metric), None)
    return None if value is None else value * stage.scale


def summary_table(results: dict[str, dict], order: list[Recipe]) -> str:
    lines = ["| task | Pre-LN | Magneto | without learning | bar (every run) | steps | training time (all runs) |",
             "|---|---|---|---|---|---|---|"]
    for stage in order:
        r = results.get(stage.stage_name)
        if r is None:
            continue
        cells = [r["values"].get(n, "-") for n in NORMS]
        lines.append(f"| {stage.label} | {cells[0]} | {cells[1]} | {r.get('baseline', '-')} | {r.get('bar', '-')} | "
                     f"{r['steps']} | {r['seconds']:.0f} s |")
    return "\n".join(lines)


def stage_row(stage: Recipe, outcomes: dict[tuple[str, int], Outcome], steps: int) -> dict:
    """The stage's metric per norm, from the outcomes of its runs (compare's ``Runner``): one seed's
    value, or over several seeds their mean and range ("91.3 (90.7-92.0)")."""
    values: dict[str, str] = {}
    for norm in NORMS:
        runs_of = [o for (n, _), o in sorted(outcomes.items()) if n == norm]
        if not runs_of:
            continue
        got = [v for v in (metric_of(stage, o) for o in runs_of) if v is not None]
        # short runs rarely "converge" by compare's rule; flag only what went wrong
        flags = sorted({o.verdict for o in runs_of if o.verdict in ("diverged", "failed", "incomplete")
                        or metric_of(stage, o) is None})
        flag = f" ({', '.join(f or '-' for f in flags)})" if flags else ""
        if not got:
            values[norm] = flags[0] if flags else "-"
        elif len(got) == 1:
            values[norm] = f"{got[0]:.1f}{flag}"
        else:
            values[norm] = f"{sum(got) / len(got):.1f} ({min(got):.1f}-{max(got):.1f}){flag}"
    seconds = sum(o.wall_s or 0.0 for o in outcomes.values())  # training time, also of runs finished earlier
    return {"values": values, "steps": steps, "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    every = stages()
    names = [s.stage_name for s in every]
    p = argparse.ArgumentParser(prog="foundation demo", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="stages: " + ", ".join(names))
    p.add_argument("--out", type=Path, default=Path("runs/demo"), help="reports and runs (default runs/demo)")
    p.add_argument("--data", type=Path, default=Path("data"), help="demo data sets, made when missing (default data)")
    p.add_argument("--only", default=None, help="comma-separated stages (default all)")
    p.add_argument("--steps-scale", type=float, default=1.0, help="multiply every stage's training steps")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each (default 2)")
    p.add_argument("--seeds", default="0", help="comma-separated seeds (default 0); with several, each row shows "
                   "the mean and range, and the bar column every run: --seeds 0,1,2 takes 3x as long")
    a = p.parse_args(argv)
    try:
        seeds = sorted({int(x) for x in a.seeds.split(",") if x.strip()})
    except ValueError:
        p.error(f"--seeds: comma-separated integers expected, got {a.seeds!r}")
    if not seeds or min(seeds) < 0:
        p.error(f"--seeds: at least one seed >= 0 expected, got {a.seeds!r}")
    chosen = every
    if a.only:
        wanted = [s.strip() for s in a.only.split(",") if s.strip()]
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            p.error(f"--only: unknown stage(s) {', '.join(unknown)}; known: {', '.join(names)}")
        needed = {s.init_from_stage for s in every if s.stage_name in wanted} - set(wanted)
        chosen = [s for s in every if s.stage_name in wanted or s.stage_name in needed]
    if a.steps_scale <= 0 or a.jobs < 1:
        p.error("--steps-scale must be > 0 and --jobs >= 1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # tiny models: one thread per run is fastest
    lock = threading.Lock()

    def say(text: str) -> None:
        with lock:
            print(text, flush=True)

    start = time.perf_counter()
    say(f"[1/3] demo data under {a.data}/")
    make_data(sorted({s.data for s in chosen}), a.data, say, a.jobs)

    seeds_text = f" x {len(seeds)} seeds" if len(seeds) > 1 else ""
    say(f"[2/3] Pre-LN vs Magneto, {len(chosen)} tasks x {len(NORMS)} runs{seeds_text}, {a.jobs} at a time -> {a.out}/")
    from foundation.config import ConfigError
    from studies.compare import REPORT_LOCK, Runner, config_lrs, grid, lr_values, run_name, write_report

    results: dict[str, dict] = {}
    outcomes: dict[str, dict[tuple[str, int], Outcome]] = {s.stage_name: {} for s in chosen}
    primary: dict[str, tuple[str, bool]] = {}  # stage -> its primary metric and direction
    finished = {(s.stage_name, n, seed): threading.Event() for s in chosen for n in NORMS for seed in seeds}
    began: dict[str, float] = {}

    def steps(stage: Recipe) -> int:
        return max(1, round(stage.steps * a.steps_scale))

    def stage_overrides(stage: Recipe) -> list[str]:
        warmup = [f"schedule.warmup_steps={round(stage.warmup * steps(stage))}"] if stage.warmup else []
        return [*stage.overrides, *data_overrides(stage, a.data), f"train.steps={steps(stage)}", *warmup,
                "eval.every=0", "save.every=0", "save.keep=1"]

    def lrs_of(stage: Recipe) -> dict[str, float]:  # each norm at the config's lr for it
        return config_lrs(stage.config, stage_overrides(stage), NORMS, seeds[0])

    def runner_of(stage: Recipe) -> Runner:
        """One comparison per stage: its runs (one per norm and seed, each a job of its own), one report."""
        name = stage.stage_name
        return Runner(Path(stage.config), a.out / name, stage_overrides(stage), say=lambda text: say(f"  {name}: {text}"))

    def specs_of(stage: Recipe) -> list:
        specs = grid(NORMS, seeds, lrs_of(stage))
        if stage.init_from_stage:  # each run starts from that stage's run of the same norm and seed
            dep = next(s for s in chosen if s.stage_name == stage.init_from_stage)
            dep_lrs = lrs_of(dep)
            for sp in specs:
                sp.overrides.append(f"init_from={a.out / dep.stage_name / 'runs' / run_name(sp.norm, dep_lrs[sp.norm], sp.seed)}"
                                    "/best/model.safetensors")
        return specs

    plans = {s.stage_name: (runner_of(s), specs_of(s)) for s in chosen}

    def run_item(item: tuple[Recipe, str, int]) -> None:
        stage, norm, seed = item
        name = stage.stage_name
        runner, specs = plans[name]
        spec = next(sp for sp in specs if sp.norm == norm and sp.seed == seed)
        try:
            if stage.init_from_stage:
                finished[stage.init_from_stage, norm, seed].wait()
            with lock:
                if name not in began:
                    began[name] = time.perf_counter()
                    print(f"  {name}: {steps(stage)} steps per run ...", flush=True)
            try:
                primary[name] = runner.check([spec])  # its config resolves (init_from: its start exists)
                outcomes[name][norm, seed] = runner.one(specs.index(spec) + 1, spec, len(specs))
            except ConfigError as e:
                say(f"  {name}: {norm} seed {seed}: {e}")
        finally:
            finished[name, norm, seed].set()
        with lock:  # the stage's last run writes its report (over all its runs) and its row
            if name in results or not all(finished[name, n, sd].is_set() for n in NORMS for sd in seeds):
                return
            results[name] = {}
        out, seconds = a.out / name, time.perf_counter() - began[name]
        done = [outcomes[name][sp.norm, sp.seed] for sp in specs if (sp.norm, sp.seed) in outcomes[name]]
        if done:
            with REPORT_LOCK:
                write_report(out, Path(stage.config), done, sorted({o.norm for o in done}, key=NORMS.index), seeds,
                             lr_values({sp.norm: sp.lr for sp in specs}), *primary[name], f"foundation demo (stage {name})", runner.rules,
                             runner.invocation(len(specs)))
        if len(done) < len(specs) or any(o.verdict == "failed" for o in done):
            say(f"  {name}: a run failed; see {out}/runs/")
        results[name] = {**stage_row(stage, outcomes[name], steps(stage)), "baseline": baseline(stage, a.data),
                         "bar": bar_cell(stage, a.data, outcomes[name])}
        say(f"  {name}: done in {seconds:.0f} s -> {out}/report.md")

    with ThreadPoolExecutor(max_workers=a.jobs) as pool:
        list(pool.map(run_item, run_order(chosen, seeds)))

    say(f"[3/3] summary ({time.perf_counter() - start:.0f} s in all)")
    table = summary_table(results, every)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "summary.md").write_text(table + "\n")
    say(table)
    missed = [s.label for s in every if "missed" in results.get(s.stage_name, {}).get("bar", "")]
    if missed:
        say(f"\nbelow its bar: {'; '.join(missed)} (a run's digits vary by machine; README: the range over seeds 0-2)")
    say(f"\nreports, curves (curves.png) and runs: {a.out}/<task>/; this table: {a.out}/summary.md")
    say("'without learning': what the metric is for a model that learnt nothing (chance, the answer prior); "
        "README: what each row reaches and its bar")
    say("every row trains from scratch on all its labels; pretraining pays where labels are scarce: "
        "foundation compare labels --quick (vision, scratch vs MIM at 10 labels per class, 16 min)")
    return 0


def run_order(chosen: list[Recipe], seeds: list[int] = (0,)) -> list[tuple[Recipe, str, int]]:
    """Every run its own job: stages longest first (``start_order``), in each stage and seed Magneto's run
    before Pre-LN's. The two threads take jobs as they come free, so the thread that finished
    first takes the slower run of the next stage (Magneto's Sub-LayerNorms: its runs are 2-10 %
    longer), and the two threads end together. (Pre-LN first would hand one thread every slower
    run, and it would end well after the other.)"""
    return [(s, n, seed) for s in start_order(chosen) for seed in seeds for n in SLOWEST_FIRST]


def start_order(chosen: list[Recipe]) -> list[Recipe]:
    """Longest first, each stage after the stage it starts from (so a worker never waits on a
    stage that no worker has taken)."""
    order: list[Recipe] = []
    for stage in sorted(chosen, key=lambda s: -s.minutes):
        dep = next((s for s in chosen if s.stage_name == stage.init_from_stage), None)
        if dep is not None and dep not in order:
            order.append(dep)
        if stage not in order:
            order.append(stage)
    return order


if __name__ == "__main__":
    sys.exit(main())
