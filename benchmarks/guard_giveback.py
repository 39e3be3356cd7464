"""Replays the stability guard's giveback rule (``foundation.engine.guard_rules.GivebackRule``, the
engine's own class) on the training losses runs logged, to see where it fires: in runs that
learnt and then lost it (it should) and in healthy runs (false alarms).

    python benchmarks/guard_giveback.py RUN_DIR_OR_GLOB ... [--giveback 0.5] [--steps 30]

Each run starts a new loss level at a new phase of a task (the ASR head's transducer loss at
``rnnt_start``), as the engine keeps one rule per kind of step. Runs logged every k-th step are
replayed on the logged steps with a window of steps // k losses. Prints one line per run (its
verdict from status.json, where and at what loss the rule fired) and the count of firings.
"""
from __future__ import annotations

import argparse
import glob
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from foundation.engine.guard_rules import GIVEBACK_STEPS, GivebackRule  # noqa: E402
from studies.runs import read_records, train_losses  # noqa: E402
from studies.verdict import phase_starts  # noqa: E402


def replay(run_dir: Path, giveback: float, steps: int) -> tuple[str, int, list[tuple[int, float, float]]]:
    """(the run's status, the losses replayed, every firing as (step, smoothed loss, best))."""
    records = read_records(run_dir)
    at, losses = train_losses(records)
    status = json.loads((run_dir / "status.json").read_text())["status"] if (run_dir / "status.json").exists() else "?"
    every = max(1, round(statistics.median(b - a for a, b in zip(at, at[1:])))) if len(at) > 1 else 1
    starts = set(phase_starts(records))
    rule, fired = GivebackRule(giveback, max(3, steps // every)), []
    for step, loss in zip(at, losses):
        if step in starts:
            rule = GivebackRule(giveback, max(3, steps // every))
        hit = rule.check(step, loss)
        if hit is not None and hit["new_episode"]:
            fired.append((step, hit["update"], hit["level"]))
    return status, len(losses), fired


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="run directories (with metrics.jsonl) or globs of them")
    p.add_argument("--giveback", type=float, default=0.5)
    p.add_argument("--steps", type=int, default=GIVEBACK_STEPS, help="the median's window, in steps")
    a = p.parse_args(argv)
    dirs = sorted({Path(d) for pattern in a.runs for d in (glob.glob(pattern) or [pattern])
                   if (Path(d) / "metrics.jsonl").exists()})
    if not dirs:
        p.error("no run directory with a metrics.jsonl among " + " ".join(a.runs))
    n_fired = 0
    for d in dirs:
        status, n, fired = replay(d, a.giveback, a.steps)
        n_fired += bool(fired)
        what = ", ".join(f"step {s}: {v:.3g} against best {b:.3g}" for s, v, b in fired) or "-"
        print(f"{d}  [{status}, {n} losses]  fired: {what}")
    print(f"giveback {a.giveback:g}, {a.steps} steps: fired in {n_fired} of {len(dirs)} runs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
