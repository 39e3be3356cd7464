"""What the stability guard's measurement costs a training step: a tiny recipe trained with
``guard.mode=off`` and ``warn`` in alternation, in one process, the median step time of each.

    python benchmarks/guard_overhead.py                                     # seq2seq tiny, 3 rounds of 150 steps
    python benchmarks/guard_overhead.py --config configs/vision/tiny_finetune.yaml \\
        tasks.classification.data_dir=data/vision-demo init_from=null
    python benchmarks/guard_overhead.py guard.every=4                      # measure every 4th step

Alternating the two settings round by round (off, warn, off, warn, ...) lets a busy spell of the
machine hit both alike; the ratio of the medians is the overhead. Step time is the engine's own
``step_time`` (forward, backward, optimizer); the measurement adds one probe forward without
gradients per measured step after it and, with ``guard.attention`` on, the logits q.k of every
attention in every second training forward, so the loop's wall time per step is what is compared
(from the first step's record to the last: start-up and the final evaluation left out). The
guard's own CPU time (every ``after_step`` call, timed) is printed beside it: the overhead without
the noise of whole-run timings, which on a busy 2-core machine move by ~10 % from round to round.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing


GUARD_CPU = [0.0]  # CPU seconds spent inside the guard's after_step, summed over a run


def timed_guard() -> None:
    """Count the CPU time of every ``Stability.after_step`` call (the probe forward, the weight
    norms and the rules) and of every ``AttentionWatch.see`` (the logits q.k the attention rule
    forms inside each training forward): the guard's own cost, which other load on the machine
    does not move."""
    import time

    from foundation.engine.guard import AttentionWatch, Stability

    def timed(inner):
        def call(self, *args, **kwargs):
            t = time.process_time()
            try:
                return inner(self, *args, **kwargs)
            finally:
                GUARD_CPU[0] += time.process_time() - t
        return call

    Stability.after_step = timed(Stability.after_step)
    AttentionWatch.see = timed(AttentionWatch.see)


def one_run(config: str, overrides: list[str], mode: str, steps: int, out: Path) -> float:
    """Wall seconds per training step of one run (the loop only: model built, data read before)."""
    from foundation.engine.config import load_config
    from foundation.engine.loop import train

    cfg, specs = load_config(config, [*overrides, f"guard.mode={mode}", f"train.steps={steps}", "eval.every=0",
                                      "save.every=0", f"output_dir={out}", f"run_name={mode}", "overwrite=true",
                                      "log.progress=false", "log.writers=[jsonl]", "log.every=1"])
    train(cfg, specs)
    records = [json.loads(line) for line in (out / mode / "metrics.jsonl").open()]
    times = [r["time"] for r in records if "loss" in r and "event" not in r]
    return (times[-1] - times[0]) / max(1, len(times) - 1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/seq2seq/tiny.yaml")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("overrides", nargs="*", help="key=value for both settings")
    a = p.parse_args()
    import torch

    torch.set_num_threads(1)
    from foundation.engine.host_memory import keep_freed_memory

    keep_freed_memory()  # the steps as `foundation train` runs them (glibc's page faults would dilute the share)
    timed_guard()
    seconds: dict[str, list[float]] = {"off": [], "warn": []}
    own: list[float] = []  # the guard's CPU seconds a step, per warn run
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for mode in ("off", "warn"):
                GUARD_CPU[0] = 0.0
                seconds[mode].append(one_run(a.config, a.overrides, mode, a.steps, Path(tmp)))
                extra = ""
                if mode == "warn":
                    own.append(GUARD_CPU[0] / a.steps)
                    extra = f" (the guard itself {1000 * own[-1]:.2f} ms of CPU)"
                print(f"round {r + 1}: guard {mode:4s} {1000 * seconds[mode][-1]:7.2f} ms a step{extra}", flush=True)
    off, warn, guard = statistics.median(seconds["off"]), statistics.median(seconds["warn"]), statistics.median(own)
    print(f"median ms a step: off {1000 * off:.2f}, warn {1000 * warn:.2f}; overhead {100 * (warn / off - 1):+.1f} %"
          f" (inside the rounds' noise on a busy machine); the guard's own CPU time {1000 * guard:.2f} ms a step: "
          f"{100 * guard / off:.1f} % of an unguarded step ({a.config} {' '.join(a.overrides)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
