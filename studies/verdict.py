"""How a study judges one run, and how it folds the seeds of one setting.

How a run is judged (``Rules``, also printed in each report):

* **diverged at step N** - the engine stopped it: ``train.max_nonfinite`` non-finite steps in
  a row (N: the engine's ``diverged`` event / ``status.json``); or its training loss, averaged
  over ``SPIKE_WINDOW`` logged steps, rose above ``explode_factor`` (default 2) times the loss
  of the first step, i.e. of the untrained model (N: the first step of that window above the
  limit, where the blow-up began); or a final evaluation metric is not finite. Twice the
  untrained loss means predictions confidently worse than the initial, near-uniform ones,
  which healthy training does not produce; gradient clipping keeps most blow-ups finite, so
  the engine's non-finite detection alone misses them.
* **not converged** - finished without any of that, but its final training loss (mean of the
  last 10% of logged steps) is above ``converge_ratio`` (default 0.8) times the first step's:
  it learnt next to nothing. (A model that learns only the output tokens' frequencies - the
  plateau of 50L-50L and 100L-100L Post-LN models on sequence reversal - ends at 0.83-0.84 of
  its first loss.)
* **converged** - the rest. How well it converged is the metric columns' business.

A (norm, lr) converges when every seed does; "largest lr that converges" is the largest such
lr of the grid.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from studies.runs import last_eval, read_records, read_status, train_losses

SPIKE_WINDOW = 5  # logged steps averaged before comparing with explode_factor x the first loss


@dataclass(frozen=True)
class Rules:
    """When a run counts as diverged / not converged (the module docstring explains why)."""

    explode_factor: float = 2.0  # training loss (mean of SPIKE_WINDOW steps) above this x the first: diverged
    converge_ratio: float = 0.8  # final training loss above this x the first: not converged

    def text(self) -> str:
        spike = (f"or the training loss, averaged over {SPIKE_WINDOW} logged steps, rose above "
                 f"{self.explode_factor:g} x the loss of the first step (the untrained model; N = the first step "
                 "of that window above the limit); " if self.explode_factor else "")
        return ("**diverged at step N**: the engine stopped the run after `train.max_nonfinite` non-finite steps "
                f"in a row (N from its `diverged` event); {spike}or a final evaluation metric is not finite. "
                "**not converged**: finished without that, but the final training loss (mean of the last 10% of "
                f"logged steps) is above {self.converge_ratio:g} x the first step's. **converged**: the rest. "
                "A setting converges when every seed does.")

    def as_dict(self) -> dict:
        """For results.json."""
        return {**asdict(self), "spike_window": SPIKE_WINDOW, "text": self.text()}


@dataclass
class RunSpec:
    """One run of a study's grid."""

    name: str  # run directory name under OUT/runs
    norm: str
    seed: int
    lr: float
    depth: Optional[int] = None
    overrides: list[str] = field(default_factory=list)  # appended to the user's


@dataclass
class Outcome:
    """What a run directory says about one run (read back from metrics.jsonl and status.json)."""

    name: str
    norm: str
    seed: int
    lr: float
    depth: Optional[int]
    verdict: str  # converged | not converged | diverged | incomplete | failed
    reason: str = ""
    diverged_step: Optional[int] = None
    engine_status: Optional[str] = None  # status.json: finished | stopped | diverged | interrupted
    steps: int = 0  # the last logged training step
    initial_loss: Optional[float] = None
    final_loss: Optional[float] = None
    metrics: dict[str, float] = field(default_factory=dict)  # the last evaluation (task_id/metric)
    wall_s: Optional[float] = None  # training time (first to last record), this invocation or an earlier one
    run_dir: str = ""


def loss_spike(steps: Sequence[int], losses: Sequence[float], explode_factor: float,
               phase_starts: Sequence[int] = ()) -> Optional[tuple[int, int, float, float]]:
    """The first window of ``SPIKE_WINDOW`` logged losses whose mean is above ``explode_factor`` x
    the first loss: (the step where the spell above the limit began, the window's length, its
    mean, that first loss), or None. A run whose objective changes mid-run (``phase_starts``: the
    steps where a task's logged ``<task>/phase`` changed, e.g. the transducer loss added after CTC
    alone) is judged phase by phase, each against its own first loss."""
    bounds = sorted({0, *(i for i, s in enumerate(steps) for start in phase_starts if s == start)})
    for lo, hi in zip(bounds, [*bounds[1:], len(losses)]):
        found = _spike(steps[lo:hi], losses[lo:hi], explode_factor)
        if found is not None:
            return found
    return None


def _spike(steps: Sequence[int], losses: Sequence[float], explode_factor: float):
    if not losses:
        return None
    limit = explode_factor * losses[0]
    for i in range(len(losses)):
        window = losses[max(0, i - SPIKE_WINDOW + 1): i + 1]
        if len(window) == min(SPIKE_WINDOW, len(losses)) and sum(window) / len(window) > limit:
            first = next(j for j in range(max(0, i - SPIKE_WINDOW + 1), i + 1) if losses[j] > limit)
            return steps[first], len(window), sum(window) / len(window), losses[0]
    return None


def phase_starts(records: Sequence[dict]) -> list[int]:
    """The steps of logged training records where a task's ``<task>/phase`` differs from its last value."""
    last: dict[str, float] = {}
    starts = []
    for r in records:
        if "event" in r or "step" not in r:
            continue
        for k, v in r.items():
            if k.endswith("/phase") and not k.startswith("eval/"):
                if k in last and v != last[k]:
                    starts.append(int(r["step"]))
                last[k] = v
    return starts


def judge(spec: RunSpec, run_dir: Path, rules: Rules = Rules(), failure: str = "") -> Outcome:
    """The verdict on one run directory (the rules in the module docstring)."""
    explode_factor = rules.explode_factor
    records = read_records(run_dir)
    status = read_status(run_dir)
    engine = status["status"] if status else None
    event = next((r for r in records if r.get("event") == "diverged"), None)
    if engine is None and event is not None:  # a run dir from before status.json
        engine = "diverged"
    steps, losses = train_losses(records)
    eval_step, metrics = last_eval(records)
    times = [r["time"] for r in records if isinstance(r.get("time"), (int, float))]
    out = Outcome(spec.name, spec.norm, spec.seed, spec.lr, spec.depth, "incomplete", engine_status=engine,
                  steps=max([int(r["step"]) for r in records if "step" in r], default=0), metrics=metrics,
                  wall_s=round(times[-1] - times[0], 1) if len(times) > 1 else None, run_dir=str(run_dir))
    if losses:
        out.initial_loss = losses[0]
        tail = max(1, len(losses) // 10)
        out.final_loss = sum(losses[-tail:]) / tail

    if engine == "diverged":
        out.verdict = "diverged"
        out.diverged_step = int(event["step"]) if event is not None else int(status["step"])
        message = status["message"] if status else (event or {}).get("message", "")
        # a loss that blew up and did not come back ends the run at its last step: the onset is the spike's
        factor = explode_factor or 2.0
        spike = loss_spike(steps, losses, factor, phase_starts(records)) if "blew up" in message else None
        if spike is not None:
            out.diverged_step = spike[0]
            out.reason = (f"engine: the loss blew up and did not come back (mean over {spike[1]} steps "
                          f"{spike[2]:.3g} > {factor:g} x first loss {spike[3]:.3g} from step {spike[0]})")
            return out
        what = (event or {}).get("what", "loss or gradients")
        out.reason = f"engine: non-finite {what}, {message}".strip()
        return out
    if engine == "failed" and not failure:  # status.json holds the engine's one-line reason
        failure = f"engine: {status.get('message', 'failed')}"
    if engine not in ("finished",):
        out.verdict = "failed" if failure else "incomplete"
        out.reason = failure or (f"engine status {engine!r}" if engine else "no status.json: not run to the end")
        return out
    spike = loss_spike(steps, losses, explode_factor, phase_starts(records)) if explode_factor else None
    if spike is not None:
        out.verdict, out.diverged_step = "diverged", spike[0]
        out.reason = (f"loss spike: mean over {spike[1]} steps {spike[2]:.3g} > "
                      f"{explode_factor:g} x first loss {spike[3]:.3g}")
        return out
    bad = [k for k, v in metrics.items() if not math.isfinite(v)]
    if bad:
        out.verdict, out.diverged_step = "diverged", eval_step
        out.reason = f"non-finite evaluation: {', '.join(bad)}"
        return out
    if out.final_loss is None or out.final_loss > rules.converge_ratio * out.initial_loss:
        out.verdict = "not converged"
        out.reason = (f"final loss {out.final_loss:.3g} > {rules.converge_ratio:g} x first loss {out.initial_loss:.3g}"
                      if out.final_loss is not None else "no training loss logged")
        return out
    out.verdict = "converged"
    return out


def describe(o: Outcome) -> str:
    metrics = ", ".join(f"{k} {v:.4g}" for k, v in o.metrics.items())
    if o.verdict == "diverged":
        return f"diverged at step {o.diverged_step} ({o.reason})"
    if o.verdict in ("failed", "incomplete"):
        return f"{o.verdict}: {o.reason}"
    loss = f"loss {o.initial_loss:.3g} -> {o.final_loss:.3g}" if o.final_loss is not None else ""
    return f"{o.verdict} at step {o.steps}: {loss}; {metrics}"


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summarize(outcomes: Sequence[Outcome], key: Callable[[Outcome], Any]) -> dict[Any, dict]:
    """Seeds of one setting (``key`` -> e.g. (norm, lr)) folded: verdict, first divergence,
    mean/std/per-seed of every final metric and of the final training loss."""
    groups: dict[Any, list[Outcome]] = {}
    for o in outcomes:
        groups.setdefault(key(o), []).append(o)
    out = {}
    for k, runs in groups.items():
        verdicts = [o.verdict for o in runs]
        div = [o for o in runs if o.verdict == "diverged"]
        if all(v == "converged" for v in verdicts):
            verdict = "converged"
        elif div:
            verdict = "diverged"
        elif "not converged" in verdicts:
            verdict = "not converged"
        else:
            verdict = next(v for v in verdicts if v != "converged")
        names = sorted({m for o in runs for m in o.metrics})
        metrics = {}
        for m in names + ["train_loss"]:
            per_seed = [(o.final_loss if m == "train_loss" else o.metrics.get(m)) if o.verdict != "diverged" else None
                        for o in runs]
            mean, std = mean_std([v for v in per_seed if v is not None])
            metrics[m] = {"mean": mean, "std": std, "per_seed": per_seed}
        out[k] = {
            "verdict": verdict,
            "seeds": [o.seed for o in runs],
            "verdicts": verdicts,
            "diverged": len(div),
            "diverged_step": min(o.diverged_step for o in div) if div else None,
            "metrics": metrics,
        }
    return out


def largest_converging(summary: dict[tuple[str, float], dict], norms: Sequence[str]) -> dict[str, Optional[float]]:
    out = {}
    for norm in norms:
        ok = [lr for (n, lr), s in summary.items() if n == norm and s["verdict"] == "converged"]
        out[norm] = max(ok) if ok else None
    return out
