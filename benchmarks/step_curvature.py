"""The loss along each optimizer step: does the curvature a step meets announce a divergence?

    python benchmarks/step_curvature.py RUN_DIR [RUN_DIR ...] --out DIR       # e.g. a stability study's runs
    python benchmarks/step_curvature.py runs/guard-warmup/seq2seq/12L/runs/preln_lr1_seed1 --out runs/curv

Re-trains each run from its ``config.yaml`` (same seed and data order: the probe forwards
below change no RNG state) and, every ``--every`` steps, evaluates the probe batch (the first
training batch, eval mode, no gradients) at the weights before the step (theta), after it
(theta + D) and one more step along it (theta + 2 D). A parabola through the three losses,
L(theta + s D) = L0 + a s + b s^2, gives the step's first-order change ``a`` (g . D) and its
curvature term ``b`` (D^T H D / 2). Their ratio q = b / -a is where the step lands on its own
direction: the minimum along it is at s = 1 / 2q, so q > 1/2 overshoots it and q > 1 raises the
loss (on a quadratic, gradient descent diverges exactly when q > 1 along the top direction).

If q climbed towards 1 as the warm-up raised the learning rate, it would forecast a blow-up
the way the model update does not (``foundation compare guard``). Prints, per run, the median
q and the share of steps with q > 1 in windows of ``--window`` steps, next to the run's
verdict and the onset of its divergence (``studies.guard_eval.onset``); writes
``OUT/<run>.json`` (every measurement) and ``OUT/curvature.md``.
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

from rerun import check_runs, parser, rerun_config  # noqa: E402


def measure_run(run_dir: Path, out: Path, every: int, overrides: list[str]) -> tuple[list[dict], str]:
    """Re-train the run at ``run_dir`` under ``out``; every ``every`` steps one record:
    step, lr, loss, L0 / L1 / L2 (the probe's loss at theta, theta + D, theta + 2 D), a, b, q. Returns (records, status)."""
    import torch

    from foundation.engine import loop
    from foundation.engine.data import seeded

    cfg, specs = rerun_config(run_dir, out, overrides)
    probe: dict = {}
    rows: list[dict] = []
    original_step, original_next = loop.Trainer.train_step, loop.next_batch

    def first_batch(stream, tid, split):  # the probe: the run's first training batch, as drawn
        batch = original_next(stream, tid, split)
        if not probe:
            probe.update(tid=tid, batch=batch)
        return batch

    def probe_loss(trainer) -> float:
        model, training = trainer.model, trainer.model.training
        model.eval()
        try:
            with torch.no_grad(), seeded(0):  # RNG states restored after: the training draws what it would
                loss, _ = model(probe["tid"], loop.to_device(probe["batch"], trainer.env.device))
        finally:
            model.train(training)
        return float(loss)

    def step(trainer):
        due = trainer.step % every == 0 and bool(probe)  # the first step draws the probe: measured from the next on
        if due:
            before = [p.detach().clone() for p in trainer.model.parameters()]
            l0 = probe_loss(trainer)
        record = original_step(trainer)
        if due and not record.get("skipped"):
            l1 = probe_loss(trainer)
            with torch.no_grad():
                after = [p.detach().clone() for p in trainer.model.parameters()]
                for p, b, a in zip(trainer.model.parameters(), before, after):
                    p.copy_(2 * a - b)
                l2 = probe_loss(trainer)
                for p, a in zip(trainer.model.parameters(), after):
                    p.copy_(a)
            b = ((l2 - l0) - 2 * (l1 - l0)) / 2
            a = (l1 - l0) - b
            rows.append({"step": trainer.step, "lr": record["lr"], "loss": record["loss"], "L0": l0, "L1": l1, "L2": l2, "a": a, "b": b,
                         "q": b / -a if a < 0 else float("inf")})  # a >= 0: the step went uphill outright
        return record

    loop.Trainer.train_step, loop.next_batch = step, first_batch
    try:
        result = loop.train(cfg, specs)
    finally:
        loop.Trainer.train_step, loop.next_batch = original_step, original_next
    return rows, result.status


def windows(rows: list[dict], size: int, last: int) -> list[tuple[int, float, float]]:
    """(first step, median q, share of q > 1) per window of ``size`` steps."""
    out = []
    for start in range(0, last, size):
        qs = [r["q"] for r in rows if start < r["step"] <= start + size]
        if qs:
            out.append((start + 1, statistics.median(qs), sum(q > 1 for q in qs) / len(qs)))
    return out


def summary(results: list[tuple[str, list[dict], int | None]], lead: int) -> list[str]:
    """The median q over the (up to) ``lead`` steps that end ``lead`` steps before each divergence's
    onset (what a warning ``lead`` steps ahead would have to read), against the same steps of the
    runs that did not diverge."""
    def median_q(rows: list[dict], lo: int, hi: int) -> float | None:
        qs = [r["q"] for r in rows if lo <= r["step"] < hi]
        return statistics.median(qs) if qs else None

    onsets = [at for _, _, at in results if at is not None and at > lead]
    before = [m for _, rows, at in results if at is not None and at > lead
              if (m := median_q(rows, max(2, at - 2 * lead), at - lead)) is not None]
    calm = [m for _, rows, at in results if at is None for o in onsets
            if (m := median_q(rows, max(2, o - 2 * lead), o - lead)) is not None]
    def text(ms: list[float]) -> str:
        return f"{statistics.median(ms):.2f} ({min(ms):.2f}-{max(ms):.2f}, {len(ms)})" if ms else "-"
    return [f"Median q over steps [onset - {2 * lead}, onset - {lead}): runs that diverged {text(before)}; "
            f"the runs that did not, over the same steps: {text(calm)} (median (range, count))."]


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--every", type=int, default=2, help="steps between measurements (default 2)")
    ap.add_argument("--lead", type=int, default=20, help="the warning's lead the summary reads at (default 20)")
    ap.add_argument("--window", type=int, default=20, help="steps a row of the table summarises (default 20)")
    args = ap.parse_args(argv)
    from studies.guard_eval import onset

    check_runs(args.runs, "step_curvature")
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    lines = ["| run | status | onset | " + "median q (share > 1) per window of steps |", "|---|---|---:|---|"]
    for run in args.runs:
        rows, status = measure_run(run, args.out, args.every, args.overrides)
        (args.out / f"{run.name}.json").write_text(json.dumps(rows) + "\n")
        at = onset(args.out / run.name, None)  # the loss's first spike (or non-finite step), whatever the status
        results.append((run.name, rows, at))
        last = max((r["step"] for r in rows), default=0)
        cells = " ".join(f"{s}: {m:.2f} ({f:.0%})" for s, m, f in windows(rows, args.window, last))
        lines.append(f"| {run.name} | {status} | {at if at is not None else '-'} | {cells} |")
        print(lines[-1], flush=True)
    lines += ["", *summary(results, args.lead)]
    print(lines[-1])
    (args.out / "curvature.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out / 'curvature.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
