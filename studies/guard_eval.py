"""``foundation compare guard``: how early the stability guard sees divergence, and how often it
cries wolf, on the runs of a stability study that measured the model update.

    foundation compare stability --tasks seq2seq,classification guard.mode=warn guard.every=2 --out runs/guard
    foundation compare guard runs/guard                    # the guard's defaults, replayed on every run
    foundation compare guard runs/guard --search           # + every (factor, window, warmup) of a grid
    foundation compare guard runs/guard --search --signal grad_norm   # the same rule on another logged series
    foundation compare guard runs/guard --signal attention/logit_max   # the attention rule (guard.attention=0.2)

The guard's rule (``foundation.engine.guard_rules.Guard``: the update per unit of learning rate against
``factor`` x the median of the last ``window`` healthy measurements, after ``warmup`` of them;
and, as the engine does, the training loss against ``loss_factor`` x its own recent median) is
replayed offline on each run's logged ``update/output`` series, taking every ``every``-th
measured step (the loss at every measured step), so one study measured densely judges any
setting. ``--loss-factor 0`` replays the update rule alone; another ``--signal`` is judged
alone. ``--signal attention/logit_max`` replays the guard's attention rule instead
(``AttentionRule``: the largest attention logit's growth, ln(L_t / L_{t-span}) / span, above
``--rate``) on the logits the guard logged (a study run with ``guard.attention=0.2``). A run's
verdict is the stability study's own (``studies.verdict``: diverged at step N,
converged, not converged):

* **lead**: for a run that diverged, its onset N (the first non-finite step, or where its loss
  first spiked above twice the first loss, the study's spike rule) minus the guard's first
  firing step (fired at or before N; a firing after N, or none, is a miss);
* **false alarm**: a converged run in which the guard fired at all.

Writes OUT/guard.md (a table per task and rule, the bars, the search), OUT/guard.json and
OUT/guard.png (update per unit lr against step for a diverging and a converging run of each
task, the firing step marked).
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from foundation.engine.config import GuardConfig
from foundation.engine.guard import ATTENTION_EVERY, ATTENTION_SPAN, AttentionRule
from foundation.engine.guard_rules import Guard, LossRule
from studies.runs import read_records, train_losses
from studies.verdict import loss_spike, phase_starts

# the series the rule can be replayed on (--signal): the guard's own, the largest per-block weight update
# (both per unit of the peak lr, as the guard judges them), the gradient norm and the loss (as logged),
# each at the steps the guard measured
SIGNALS = {"update/output": True, "update/weights_max": True, "grad_norm": False, "loss": False,
           "attention/logit_max": False}
ATTENTION = "attention/logit_max"  # judged by the attention rule, at the steps the guard read it (its own schedule)
ATTENTION_RATE = 0.2  # the calibrated guard.attention
RATES, SPANS = (0.1, 0.15, 0.2, 0.25, 0.3, 0.4), (2, 4, 8, 16)  # the attention rule's grid (--search)
LEAD_BAR, WARNED_BAR, FALSE_ALARM_BAR = 20, 0.8, 0.05  # issue bars: >= 20 steps ahead in >= 80 %, <= 5 % false
FACTORS, WINDOWS, WARMUPS, EVERY = (2.0, 3.0, 4.0, 6.0, 8.0), (10, 20, 40), (3, 5, 10), (2, 5, 10)


@dataclass(frozen=True)
class Setting:
    factor: float
    window: int
    warmup: int
    every: int
    loss_factor: float = 0.0  # the engine's second trigger (guard.loss_factor); 0: the signal alone
    rate: float = 0.0  # > 0: the attention rule at this growth rate over ``span`` steps (factor, window, warmup unused)
    span: int = ATTENTION_SPAN

    def text(self) -> str:
        if self.rate:
            return f"rate {self.rate:g}, span {self.span}, every {self.every}"
        loss = f", loss factor {self.loss_factor:g}" if self.loss_factor else ""
        return f"factor {self.factor:g}, window {self.window}, warmup {self.warmup}, every {self.every}{loss}"


@dataclass
class RunSeries:
    """One run of the study: its verdict and its measured updates."""

    task: str
    norm: str
    lr: float
    seed: int
    verdict: str  # converged | not converged | diverged | ...
    diverged_step: Optional[int]
    steps: list[int]
    updates: list[float]
    lrs: list[float]
    run_dir: str
    losses: list[float] = dataclasses.field(default_factory=list)  # the training loss at the same steps


def measured(run_dir: str | Path, signal: str = "update/output") -> tuple[list[int], list[float], list[float]]:
    """(steps, signal, lr) at the run's guard measurements, in step order; lr 0 for a signal judged
    as logged (``Guard`` then takes the value itself)."""
    per_lr = SIGNALS[signal]
    at_guard_step = signal != ATTENTION  # the attention rule reads on its own schedule (ATTENTION_EVERY)
    rows = sorted({int(r["step"]): (float(r[signal]), float(r.get("lr", 0.0)) if per_lr else 0.0)
                   for r in read_records(run_dir)
                   if ("update/output" in r or not at_guard_step) and signal in r and "event" not in r}.items())
    return [s for s, _ in rows], [u for _, (u, _) in rows], [lr for _, (_, lr) in rows]


def onset(run_dir: str | Path, fallback: Optional[int], explode_factor: float = 2.0) -> Optional[int]:
    """Where the divergence began: the first non-finite step, or the first step of the first
    ``SPIKE_WINDOW`` logged losses whose mean is above ``explode_factor`` x the first loss (the
    study's spike rule), whichever comes first. The engine dates a loss that ended above its
    limit at the run's end; what the guard must beat is the blow-up's start."""
    records = read_records(run_dir)
    bad = [int(r["step"]) for r in records if r.get("event") == "nonfinite" or r.get("skipped")]
    steps, losses = train_losses(records)
    spike = loss_spike(steps, losses, explode_factor, phase_starts(records))
    spike = spike[0] if spike else None
    found = [s for s in (min(bad, default=None), spike) if s is not None]
    return min(found) if found else fallback


def first_firing(run: RunSeries, setting: Setting) -> Optional[int]:
    """The step at which ``Guard`` with ``setting`` first fires on the run's series (or, with a
    loss factor, the loss rule on its losses, whichever is first); with a ``rate``, the attention
    rule on the run's logits."""
    if setting.rate:
        rule = AttentionRule(setting.rate, setting.span)
        return next((step for step, logit in zip(run.steps, run.updates)
                     if step % setting.every == 0 and rule.check(step, logit) is not None), None)
    guard = Guard(setting.factor, setting.window, setting.warmup)
    loss_rule = LossRule(setting.loss_factor, setting.window, setting.warmup) if setting.loss_factor else None
    losses = run.losses or [float("nan")] * len(run.steps)
    for step, update, lr, loss in zip(run.steps, run.updates, run.lrs, losses):
        # on the logged losses, as the engine's rule on its steps'
        if loss_rule is not None and loss == loss and loss_rule.check(step, loss) is not None:
            return step
        if step % setting.every == 0 and guard.check(step, update, lr) is not None:
            return step
    return None


def load_study(out: Path, signal: str = "update/output") -> list[RunSeries]:
    """Every run of the stability study at ``out`` (its results.json) that measured updates, with
    its ``signal`` series."""
    path = out / "results.json"
    if not path.is_file():
        raise SystemExit(f"foundation compare guard: {path} not found (run foundation compare stability "
                         f"... guard.mode=warn --out {out} first)")
    data = json.loads(path.read_text())
    task_of = {}
    for t in data.get("tasks", []):
        for s in t.get("summary", []):
            task_of[(s["norm"], s["lr"])] = t["task"]
    runs = []
    for o in data.get("runs", []):
        steps, updates, lrs = measured(o["run_dir"], signal)
        if not steps:
            continue
        task = Path(o["run_dir"]).parents[2].name  # OUT/<task>/<depth>L/runs/<name>
        at = onset(o["run_dir"], o.get("diverged_step")) if o["verdict"] == "diverged" else None
        runs.append(RunSeries(task, o["norm"], o["lr"], o["seed"], o["verdict"], at, steps, updates, lrs,
                              o["run_dir"], measured(o["run_dir"], "loss")[1]))
    if not runs:
        how = "guard.mode=warn guard.attention=0.2" if signal == ATTENTION else \
            "guard.mode=warn (and guard.every=2 for a dense series)"
        raise SystemExit(f"foundation compare guard: no run under {out} logged {signal}: run the study with {how}")
    return runs


def score(runs: Sequence[RunSeries], setting: Setting) -> dict:
    """Leads of the diverged runs, false alarms of the converged ones."""
    leads, misses, alarms, converged = [], 0, 0, 0
    for run in runs:
        fired = first_firing(run, setting)
        if run.verdict == "diverged" and run.diverged_step is not None:
            if fired is not None and fired <= run.diverged_step:
                leads.append(run.diverged_step - fired)
            else:
                misses += 1
        elif run.verdict == "converged":
            converged += 1
            alarms += fired is not None
    diverged = len(leads) + misses
    early = sum(lead >= LEAD_BAR for lead in leads)
    return {"diverged": diverged, "warned_early": early, "warned_early_share": early / diverged if diverged else None,
            "median_lead": statistics.median(leads) if leads else None, "misses": misses,
            "converged": converged, "false_alarms": alarms,
            "false_alarm_share": alarms / converged if converged else None}


def passes(s: dict) -> bool:
    return (s["warned_early_share"] is not None and s["warned_early_share"] >= WARNED_BAR
            and (s["false_alarm_share"] or 0.0) <= FALSE_ALARM_BAR)


def pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{100 * x:.0f} %"


def table(runs: Sequence[RunSeries], setting: Setting) -> list[str]:
    rows = ["| task | rule | diverged | warned >= 20 steps ahead | median lead (steps) | missed | converged | "
            "false alarms |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    groups = sorted({(r.task, r.norm) for r in runs})
    for task, norm in [*groups, ("all", "all")]:
        chosen = [r for r in runs if task == "all" or (r.task, r.norm) == (task, norm)]
        s = score(chosen, setting)
        lead = "-" if s["median_lead"] is None else f"{s['median_lead']:g}"
        name = "**all**" if task == "all" else task
        rows.append(f"| {name} | {'' if task == 'all' else norm} | {s['diverged']} | {s['warned_early']} "
                    f"({pct(s['warned_early_share'])}) | {lead} | {s['misses']} | {s['converged']} | "
                    f"{s['false_alarms']} ({pct(s['false_alarm_share'])}) |")
    return rows


def search(runs: Sequence[RunSeries], loss_factor: float = 0.0, attention: bool = False) -> list[tuple[Setting, dict]]:
    """Every setting of the grid (the attention rule's: rates x spans, read every 2 or 4 steps), those
    passing the bars first, then by early warnings and false alarms."""
    d = GuardConfig()
    settings = ([Setting(d.factor, d.window, d.warmup, e, rate=r, span=n)
                 for r, n, e in itertools.product(RATES, SPANS, (2, 4))] if attention else
                [Setting(f, w, u, e, loss_factor) for f, w, u, e in itertools.product(FACTORS, WINDOWS, WARMUPS, EVERY)
                 if u <= w])
    scored = [(setting, score(runs, setting)) for setting in settings]
    return sorted(scored, key=lambda x: (not passes(x[1]), -(x[1]["warned_early_share"] or 0),
                                         x[1]["false_alarm_share"] or 0, x[0].every, x[0].warmup))


def plot(runs: Sequence[RunSeries], setting: Setting, path: Path, signal: str = "update/output") -> Optional[Path]:
    """Per task: update per unit lr against step, a diverging and a converging run, firings marked."""
    from studies.plots import pyplot

    tasks = sorted({r.task for r in runs})
    pairs = []
    for task in tasks:
        div = [r for r in runs if r.task == task and r.verdict == "diverged" and r.diverged_step]
        conv = [r for r in runs if r.task == task and r.verdict == "converged"]
        pick = [max(div, key=lambda r: r.diverged_step)] if div else []
        pick += [max(conv, key=lambda r: r.lr)] if conv else []
        if pick:
            pairs.append((task, pick))
    if not pairs:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, len(pairs), figsize=(5 * len(pairs), 3.6), squeeze=False)
    for ax, (task, pick) in zip(axes[0], pairs):
        for run in pick:
            colour = "tab:red" if run.verdict == "diverged" else "tab:blue"
            rates = [u / lr if lr > 0 else u for u, lr in zip(run.updates, run.lrs)]  # lr 0: as logged
            label = f"{run.norm} lr {run.lr:g}: " + (f"diverged at {run.diverged_step}" if run.verdict == "diverged"
                                                     else run.verdict)
            ax.plot(run.steps, rates, color=colour, label=label)
            fired = first_firing(run, setting)
            if fired is not None:
                ax.axvline(fired, color=colour, linestyle=":", label=f"guard fires at {fired}")
            if run.verdict == "diverged":
                ax.axvline(run.diverged_step, color=colour, linestyle="--", alpha=0.5)
        ax.set_yscale("log")
        ax.set(title=task, xlabel="step", ylabel=f"{signal} / lr" if SIGNALS[signal] else signal)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: Sequence[str]) -> int:
    d = GuardConfig()
    p = argparse.ArgumentParser(prog="foundation compare guard", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("out", type=Path, help="the output folder of a foundation compare stability run with guard.mode=warn")
    p.add_argument("--factor", type=float, default=d.factor)
    p.add_argument("--window", type=int, default=d.window)
    p.add_argument("--warmup", type=int, default=d.warmup)
    p.add_argument("--every", type=int, default=None,
                   help=f"judge every N-th step's measurement (default: as the guard reads, guard.every={d.every}; "
                        f"the attention rule every {ATTENTION_EVERY})")
    p.add_argument("--loss-factor", type=float, default=d.loss_factor,
                   help="the loss rule beside the update's, as the engine's guard.loss_factor (0: the update alone; "
                        "another --signal is always judged alone)")
    p.add_argument("--rate", type=float, default=ATTENTION_RATE,
                   help=f"with --signal {ATTENTION}: the attention rule's growth rate a step (guard.attention)")
    p.add_argument("--span", type=int, default=ATTENTION_SPAN,
                   help=f"with --signal {ATTENTION}: the steps its growth is measured over")
    p.add_argument("--search", action="store_true", help="also score every setting of a grid of the four "
                   "(of rate, span and every for the attention rule)")
    p.add_argument("--signal", choices=list(SIGNALS), default="update/output",
                   help="the logged series the rule judges (default the guard's, update/output); another writes "
                        "OUT/guard-<signal>.md, .json, .png")
    a = p.parse_args(argv)
    attention = a.signal == ATTENTION
    if a.every is None:
        a.every = ATTENTION_EVERY if attention else d.every
    if (min(a.window, a.every, a.span) < 1 or a.warmup < 0 or a.factor <= 1 or a.rate <= 0
            or not (a.loss_factor == 0 or a.loss_factor > 1)):
        print("foundation compare guard: error: --window, --every and --span must be >= 1, --warmup >= 0, "
              "--factor > 1, --rate > 0, --loss-factor 0 or > 1", file=sys.stderr)
        return 2
    runs = load_study(a.out, a.signal)
    stem = "guard" if a.signal == "update/output" else "guard-" + a.signal.replace("/", "_")
    loss_factor = a.loss_factor if a.signal == "update/output" else 0.0
    setting = Setting(a.factor, a.window, a.warmup, a.every, loss_factor,
                      rate=a.rate if attention else 0.0, span=a.span)
    coarsest = max(min(b - a_ for a_, b in zip(r.steps, r.steps[1:])) if len(r.steps) > 1 else 1 for r in runs)
    what = "the largest attention logit" if attention else "the model update"
    rule = ("the attention rule (`guard.attention`) judges its growth rate, ln(L_t / L_{t-span}) / span, against "
            "the rate" if attention else f"the rule judges `{a.signal}`")
    parts = ["# The stability guard on the stability study's runs", "",
             f"`foundation compare guard {' '.join(argv)}`: {len(runs)} runs that logged {what} "
             f"(measured every {coarsest} steps or closer); {rule}"
             f"{' per unit of the peak lr' if SIGNALS[a.signal] else ''}"
             f"{f', and the training loss (loss factor {loss_factor:g})' if loss_factor else ''}. Diverged / converged: the stability study's verdict. "
             f"Bars: warned at least {LEAD_BAR} steps ahead in at least {100 * WARNED_BAR:.0f} % of the diverged runs; "
             f"false alarms in at most {100 * FALSE_ALARM_BAR:.0f} % of the converged runs.", "",
             f"## The setting asked for ({setting.text()})", "", *table(runs, setting), ""]
    result = {"setting": setting.__dict__, "score": score(runs, setting)}
    if a.search:
        ranked = search(runs, loss_factor, attention)
        parts += ["## Every setting of the grid (the ten best)", "",
                  "| setting | warned >= 20 ahead | median lead | false alarms | passes |", "|---|---:|---:|---:|---|"]
        for s, sc in ranked[:10]:
            parts.append(f"| {s.text()} | {pct(sc['warned_early_share'])} | {sc['median_lead']} | "
                         f"{pct(sc['false_alarm_share'])} | {'yes' if passes(sc) else 'no'} |")
        result["search"] = [{"setting": s.__dict__, "score": sc} for s, sc in ranked]
        best = ranked[0][0]
        parts += ["", f"### The best setting ({best.text()}), per task and rule", "", *table(runs, best), ""]
    if plot(runs, setting, a.out / f"{stem}.png", a.signal):
        parts += [f"![{a.signal}, a diverging and a converging run per task]({stem}.png)", ""]
    (a.out / f"{stem}.md").write_text("\n".join(parts))
    (a.out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    print("\n".join(parts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
