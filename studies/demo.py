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
14 min 29 s from nothing on 2 otherwise idle cores, measured (data: 22 s).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

from foundation.engine.recipe import Recipe

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


def data_overrides(stage: Recipe, data: Path) -> list[str]:
    """Point the config's data fields at ``data`` (the configs read ``data/<set>``)."""
    return [stage.data_override.format(root=data / data_dirs()[stage.data])]


def make_data(names: list[str], data: Path, say, jobs: int = 1) -> None:
    """Generate the missing data sets, ``jobs`` processes at a time, speech first (the longest).
    Measured: 21-22 s in all, as sequentially (22 s): alone, speech's resampling used both cores."""
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
    # processes, not threads: the generators are Python-heavy (two threads: 23 s)
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

    root = data_overrides(stage, data)[0].split("=", 1)[1]
    try:
        value = importlib.import_module(stage.prior).answer_prior(root)
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


def read_result(stage: Recipe, out: Path, steps: int, seconds: float) -> dict:
    """The stage's metric per norm from its compare report (results.json)."""
    path = out / "results.json"
    values: dict[str, str] = {}
    if path.is_file():
        runs = json.loads(path.read_text()).get("runs", [])
        if runs and all(r.get("wall_s") for r in runs):
            seconds = sum(r["wall_s"] for r in runs)  # training time, also when the runs finished earlier
        for run in runs:
            metrics = run.get("metrics") or {}
            value = next((v for k, v in metrics.items() if k.split("/")[-1] == stage.metric), None)
            status = run.get("verdict") or run.get("status") or ""
            if value is None:
                values[run["norm"]] = status or "-"
            else:
                shown = f"{value * stage.scale:.1f}"
                # short runs rarely "converge" by compare's rule; flag only what went wrong
                values[run["norm"]] = shown + (f" ({status})" if status in ("diverged", "failed", "incomplete") else "")
    return {"values": values, "steps": steps, "seconds": seconds, "report": str(out / "report.md")}


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
    from studies.compare import compare, run_name

    results: dict[str, dict] = {}
    finished = {(s.stage_name, n): threading.Event() for s in chosen for n in NORMS}
    left = {s.stage_name: len(NORMS) for s in chosen}
    began: dict[str, float] = {}

    def steps(stage: Recipe) -> int:
        return max(1, round(stage.steps * a.steps_scale))

    def stage_overrides(stage: Recipe) -> list[str]:
        return [*stage.overrides, *data_overrides(stage, a.data), f"train.steps={steps(stage)}",
                "eval.every=0", "save.every=0", "save.keep=1"]

    def stage_compare(stage: Recipe, norms) -> int:
        name, config = stage.stage_name, stage.config  # compare sets the norm per run
        overrides = stage_overrides(stage)
        lr = _config_lr(config, overrides)
        if stage.init_from_stage:  # each run starts from that stage's run of the same norm and seed
            dep = next(s for s in chosen if s.stage_name == stage.init_from_stage)
            dep_lr = _config_lr(dep.config, stage_overrides(dep))
            overrides.append(f"init_from={a.out / dep.stage_name / 'runs' / run_name('{norm}', dep_lr, '{seed}')}"
                             "/best/model.safetensors")
        return compare(Path(config), a.out / name, norms, [0], [lr], overrides,
                       command=f"foundation demo (stage {name})", say=lambda text: say(f"  {name}: {text}"))

    def run_item(item: tuple[Recipe, str]) -> None:
        stage, norm = item
        name = stage.stage_name
        try:
            if stage.init_from_stage:
                finished[stage.init_from_stage, norm].wait()
            with lock:
                if name not in began:
                    began[name] = time.perf_counter()
                    print(f"  {name}: {steps(stage)} steps per run ...", flush=True)
            stage_compare(stage, [norm])
        finally:
            finished[name, norm].set()
            with lock:
                left[name] -= 1
                last = not left[name]
        if last:  # both runs done: the stage's report over both, and its row
            rc = stage_compare(stage, NORMS)
            out, seconds = a.out / name, time.perf_counter() - began[name]
            if rc:
                say(f"  {name}: failed (exit {rc}); see {out}/runs/")
            results[name] = {**read_result(stage, out, steps(stage), seconds), "baseline": baseline(stage, a.data)}
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
    return 0


def run_order(chosen: list[Recipe]) -> list[tuple[Recipe, str]]:
    """Every run its own job: stages longest first (``start_order``), in each stage Magneto's run
    before Pre-LN's. The two threads take jobs as they come free, so the thread that finished
    first takes the slower run of the next stage (Magneto's Sub-LayerNorms: its runs are 2-10 %
    longer), and the two threads end together. (Pre-LN first let one thread run every slower run:
    it ended 33 s after the other; alternating the norms by stage, 25 s.)"""
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
