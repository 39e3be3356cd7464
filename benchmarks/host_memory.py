"""What glibc's default malloc costs a CPU training step, against the thresholds every ``foundation``
command fixes (``foundation/engine/host_memory.py``): the demo's tiny recipes, one thread, each run
in its own process, both ways, alternating.

    foundation data make vision --out data/vision-demo      # and segmentation, speech, vl as below
    OMP_NUM_THREADS=1 python benchmarks/host_memory.py --data data
    OMP_NUM_THREADS=1 python benchmarks/host_memory.py --data data --tasks segmentation --steps 80

A step's cost is the difference of two ``foundation train`` runs (``--warmup`` and ``--steps``
steps) over the difference of their steps: CPU time (user + system, one thread: on an idle core
the wall time) and minor page faults, read from the finished child process. Start-up, the first
epoch's decoding and the final evaluation are in both runs and cancel. "glibc" is the process as
Python starts it; "kept" calls ``keep_freed_memory()`` first, as ``foundation`` does. The losses
of the two are printed: the same numbers (the allocator moves no arithmetic).
"""
from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

# the child: the engine's train command, with or without the thresholds; prints its last training loss
CHILD = """
import json, sys
from foundation.engine.host_memory import keep_freed_memory
if sys.argv[1] == "kept" and not keep_freed_memory():
    sys.exit("host_memory: keep_freed_memory() changed nothing here (not glibc, or MALLOC_* set)")
from foundation.engine.cli import train_main
code = train_main(sys.argv[3:])
rows = [json.loads(l) for l in open(sys.argv[2])]
print("LOSS", [r for r in rows if "loss" in r][-1]["loss"])
sys.exit(code)
"""


def run(mode: str, config: str, overrides: list[str], out: Path, name: str, steps: int) -> tuple[float, int, float]:
    """One ``foundation train`` run in a fresh process: its CPU seconds, minor faults and last loss."""
    run_name = f"{name}-{mode}-{steps}"
    args = [*overrides, f"train.steps={steps}", "eval.every=0", "save.every=0", "log.every=10", "log.progress=false",
            f"output_dir={out}", f"run_name={run_name}", "overwrite=true"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-P", "-c", CHILD, mode, str(out / run_name / "metrics.jsonl"),
                           str(ROOT / config), *args], capture_output=True, text=True, cwd=ROOT)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"host_memory: {name} ({mode}, {steps} steps) failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    loss = float(next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("LOSS")))
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return cpu, after.ru_minflt - before.ru_minflt, loss


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/host_memory.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--data", type=Path, default=Path("data"), help="the folder holding the demo data sets")
    p.add_argument("--tasks", default="classification,segmentation,asr,vqa")
    p.add_argument("--steps", type=int, default=60, help="steps of the longer run")
    p.add_argument("--warmup", type=int, default=20, help="steps of the shorter run")
    p.add_argument("--rounds", type=int, default=2, help="each pair of runs this often; the fastest counts")
    a = p.parse_args(argv)
    from studies.demo import data_dir, data_overrides
    from studies.recipes import recipes

    by_task = {r.task: r for r in recipes() if r.data and r.steps}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for task in a.tasks.split(","):
            if task not in by_task:
                raise SystemExit(f"host_memory: --tasks: unknown {task!r} ({', '.join(by_task)})")
            recipe = by_task[task]
            if not data_dir(recipe, a.data).exists():
                raise SystemExit(f"host_memory: {data_dir(recipe, a.data)}: no such folder "
                                 f"(foundation data make {recipe.data} --out ...)")
            overrides = [*recipe.overrides, *data_overrides(recipe, a.data)]
            best: dict[str, tuple[float, float]] = {}
            per_round: dict[str, list[float]] = {"glibc": [], "kept": []}
            losses = {}
            for _ in range(a.rounds):
                for mode in ("glibc", "kept"):
                    (c0, f0, _), (c1, f1, loss) = (run(mode, recipe.config, overrides, Path(tmp), task, n)
                                                   for n in (a.warmup, a.steps))
                    per = ((c1 - c0) / (a.steps - a.warmup), (f1 - f0) / (a.steps - a.warmup))
                    best[mode] = min(best.get(mode, per), per)
                    per_round[mode].append(per[0])
                    losses[mode] = loss
                    print(f"  {task} {mode}: {1000 * per[0]:.0f} ms, {per[1]:.0f} faults a step", flush=True)
            ratios = " / ".join(f"{k / g:.2f}" for g, k in zip(per_round["glibc"], per_round["kept"]))
            rows.append((task, best["glibc"], best["kept"], ratios, losses))
    # glibc's cost moves from round to round (its threshold moves with the blocks freed): the best of
    # each, and each round's ratio
    print("\n| task | glibc ms a step | faults a step | kept ms a step | faults a step | kept / glibc, best | "
          "per round | losses equal |")
    print("|---|---|---|---|---|---|---|---|")
    for task, (g, gf), (k, kf), ratios, losses in rows:
        print(f"| {task} | {1000 * g:.0f} | {gf:.0f} | {1000 * k:.0f} | {kf:.0f} | {k / g:.2f} | {ratios} | "
              f"{'yes' if losses['glibc'] == losses['kept'] else 'NO: ' + str(losses)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
