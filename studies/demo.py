"""``foundation demo``: Pre-LN against Magneto on every modality, from nothing, in minutes.

    foundation demo                         # data/ + runs/demo, ~15 minutes on 2 idle CPU cores
    foundation demo --only vision,vqa       # a subset
    foundation demo --steps-scale 5         # 5x longer runs (closer to the README's tables)

Stage 1 generates the demo data sets that are missing (``foundation data make``, in their
real layouts); stage 2 runs ``foundation compare`` on each task's tiny config with short
runs (Pre-LN and Magneto, one seed, two runs at a time, one thread each); stage 3 prints
one table and where the reports and curves are. Everything is an ordinary run directory
under ``--out``: the same command again reuses what finished and resumes the rest.

Each row shows, beside the two rules' numbers, what the metric is without learning
(chance, the VQA answer prior computed from the data), so a reader sees whether the runs
learnt. Every run is its own job, longest first (speech: two ~6-minute runs), so that the
two threads finish together; a stage whose recipe names ``init_from_stage`` (NLVR2: VQA)
starts each run from that stage's run of the same norm and seed, once it has finished.
The step counts keep the whole demo, data included, under 15 minutes on 2 idle cores.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

from foundation.engine.recipe import Recipe
from studies.verdict import Outcome

NORMS = ("preln", "magneto")
SLOWEST_FIRST = ("magneto", "preln")  # the order of each stage's runs (run_order)


def data_dirs() -> dict[str, str]:
    """Demo data set -> its folder under data/, as the generators declare them."""
    from foundation.engine.demo_cli import demo_data_sets

    return {d.name: d.folder for d in demo_data_sets().values()}


def stages() -> list[Recipe]:
    """The demo's stages: every task recipe (foundation_tasks/<task>/recipe.py) with demo data and demo steps, in
    table order.

    Steps are chosen so that the whole demo takes at most 15 minutes on 2 idle CPU cores, two
    runs at a time: 2 x (5.2 + 2.2 + 3.2 + 2.4 + 1) run-minutes / 2, ~14 min (``minutes`` orders them)."""
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


def baseline(stage: Recipe, data: Path) -> str:
    """The stage's no-learning reference: its fixed text, or its prior computed from the data
    (VQA: the most frequent training answer per question type, on the evaluation split)."""
    if not stage.prior:
        return stage.baseline or "-"
    import importlib

    try:
        value = importlib.import_module(stage.prior).answer_prior(data_dir(stage, data))
    except (OSError, ValueError) as e:
        return f"answer prior: {e}"
    return f"answer prior {100 * value:.1f}"


def summary_table(results: dict[str, dict], order: list[Recipe]) -> str:
    lines = ["| task | Pre-LN | Magneto | without learning | steps | training time (both runs) |",
             "|---|---|---|---|---|---|"]
    for stage in order:
        r = results.get(stage.stage_name)
        if r is None:
            continue
        cells = [r["values"].get(n, "-") for n in NORMS]
        lines.append(f"| {stage.label} | {cells[0]} | {cells[1]} | {r.get('baseline', '-')} | {r['steps']} | "
                     f"{r['seconds']:.0f} s |")
    return "\n".join(lines)


def stage_row(stage: Recipe, outcomes: dict[str, Outcome], steps: int) -> dict:
    """The stage's metric per norm, from the outcomes of its runs (compare's ``Runner``)."""
    values: dict[str, str] = {}
    for norm, o in outcomes.items():
        value = next((v for k, v in o.metrics.items() if k.split("/")[-1] == stage.metric), None)
        if value is None:
            values[norm] = o.verdict or "-"
        else:
            # short runs rarely "converge" by compare's rule; flag only what went wrong
            flag = f" ({o.verdict})" if o.verdict in ("diverged", "failed", "incomplete") else ""
            values[norm] = f"{value * stage.scale:.1f}{flag}"
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
    a = p.parse_args(argv)
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

    say(f"[2/3] Pre-LN vs Magneto, {len(chosen)} tasks x {len(NORMS)} runs, {a.jobs} at a time -> {a.out}/")
    from foundation.config import ConfigError
    from studies.compare import REPORT_LOCK, Runner, grid, run_name, write_report

    results: dict[str, dict] = {}
    outcomes: dict[str, dict[str, Outcome]] = {s.stage_name: {} for s in chosen}
    primary: dict[str, tuple[str, bool]] = {}  # stage -> its primary metric and direction
    finished = {(s.stage_name, n): threading.Event() for s in chosen for n in NORMS}
    began: dict[str, float] = {}

    def steps(stage: Recipe) -> int:
        return max(1, round(stage.steps * a.steps_scale))

    def stage_overrides(stage: Recipe) -> list[str]:
        return [*stage.overrides, *data_overrides(stage, a.data), f"train.steps={steps(stage)}",
                "eval.every=0", "save.every=0", "save.keep=1"]

    def lr_of(stage: Recipe) -> float:
        return _config_lr(stage.config, stage_overrides(stage))

    def runner_of(stage: Recipe) -> Runner:
        """One comparison per stage: its runs (one per norm, each a job of its own), one report."""
        overrides = stage_overrides(stage)
        if stage.init_from_stage:  # each run starts from that stage's run of the same norm and seed
            dep = next(s for s in chosen if s.stage_name == stage.init_from_stage)
            overrides.append(f"init_from={a.out / dep.stage_name / 'runs' / run_name('{norm}', lr_of(dep), '{seed}')}"
                             "/best/model.safetensors")
        name = stage.stage_name
        return Runner(Path(stage.config), a.out / name, overrides, say=lambda text: say(f"  {name}: {text}"))

    plans = {s.stage_name: (runner_of(s), grid(NORMS, [0], [lr_of(s)])) for s in chosen}

    def run_item(item: tuple[Recipe, str]) -> None:
        stage, norm = item
        name = stage.stage_name
        runner, specs = plans[name]
        spec = next(sp for sp in specs if sp.norm == norm)
        try:
            if stage.init_from_stage:
                finished[stage.init_from_stage, norm].wait()
            with lock:
                if name not in began:
                    began[name] = time.perf_counter()
                    print(f"  {name}: {steps(stage)} steps per run ...", flush=True)
            try:
                primary[name] = runner.check([spec])  # its config resolves (init_from: its start exists)
                outcomes[name][norm] = runner.one(NORMS.index(norm) + 1, spec, len(NORMS))
            except ConfigError as e:
                say(f"  {name}: {norm}: {e}")
        finally:
            finished[name, norm].set()
        with lock:  # the stage's last run writes its report (over both runs) and its row
            if name in results or not all(finished[name, n].is_set() for n in NORMS):
                return
            results[name] = {}
        out, seconds = a.out / name, time.perf_counter() - began[name]
        done = [outcomes[name][n] for n in NORMS if n in outcomes[name]]
        if done:
            with REPORT_LOCK:
                write_report(out, Path(stage.config), done, [o.norm for o in done], [0], [specs[0].lr],
                             *primary[name], f"foundation demo (stage {name})", runner.rules,
                             runner.invocation(len(specs)))
        if len(done) < len(NORMS) or any(o.verdict == "failed" for o in done):
            say(f"  {name}: a run failed; see {out}/runs/")
        results[name] = {**stage_row(stage, outcomes[name], steps(stage)), "baseline": baseline(stage, a.data)}
        say(f"  {name}: done in {seconds:.0f} s -> {out}/report.md")

    with ThreadPoolExecutor(max_workers=a.jobs) as pool:
        list(pool.map(run_item, run_order(chosen)))

    say(f"[3/3] summary ({time.perf_counter() - start:.0f} s in all)")
    table = summary_table(results, every)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "summary.md").write_text(table + "\n")
    say(table)
    say(f"\nreports, curves (curves.png) and runs: {a.out}/<task>/; this table: {a.out}/summary.md")
    say("'without learning': what the metric is for a model that learnt nothing (chance, the answer prior); "
        "README: what each row reaches and its bar")
    say("every row trains from scratch on all its labels; pretraining pays where labels are scarce: "
        "foundation compare labels --quick (vision, scratch vs MIM at 10 labels per class, 16 min)")
    return 0


def run_order(chosen: list[Recipe]) -> list[tuple[Recipe, str]]:
    """Every run its own job: stages longest first (``start_order``), in each stage Magneto's run
    before Pre-LN's. The two threads take jobs as they come free, so the thread that finished
    first takes the slower run of the next stage (Magneto's Sub-LayerNorms: its runs are 2-10 %
    longer), and the two threads end together. (Pre-LN first would hand one thread every slower
    run, and it would end well after the other.)"""
    return [(s, n) for s in start_order(chosen) for n in SLOWEST_FIRST]


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


def _config_lr(config: str, overrides: list[str]) -> float:
    from foundation.engine.config import load_config

    return load_config(config, overrides, check_data=False)[0].optim.lr


if __name__ == "__main__":
    sys.exit(main())
