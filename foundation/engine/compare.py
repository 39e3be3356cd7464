"""``foundation compare``: one training recipe under several norms, seeds and learning rates.

    foundation compare CONFIG [--norms preln,magneto] [--seeds 2] [--lrs 1e-3,3e-3] [--out DIR] [key=value ...]
    foundation compare depth [--norms ...] [--depths 6,18,50,100] [--steps N] [--out DIR] [key=value ...]
    foundation compare depth --thousand [--steps N] [--out DIR]

Each (norm, seed, lr) - or (norm, depth, seed) in the depth mode - is an ordinary
``foundation train`` run of the config with ``backbone.norm=``, ``seed=`` and ``optim.lr=``
(``backbone.depth=`` / ``backbone.decoder_depth=``) overridden, in its own run directory
``OUT/runs/<name>`` and by default in its own process, so a crash or a divergence ends
that run alone. The engine leaves ``status.json`` in a run directory when the run returns;
a run whose status is ``finished`` or ``diverged`` is not run again, and any other run is
resumed from its last checkpoint, so an interrupted comparison continues where it stopped.
Then the report is written from the runs' ``metrics.jsonl``:

    OUT/report.md       final metrics per norm (mean +- std over seeds, per-seed values),
                        convergence per learning rate, and the largest lr that converges
    OUT/results.json    the same, machine-readable, with every run's outcome
    OUT/curves.png      training loss and the primary metric against step, one colour per norm
    OUT/depth.png       (depth mode) final metric and loss against depth, one line per norm
    OUT/thousand.png    (depth --thousand) training loss and evaluation metrics against step

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

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from foundation.config import ConfigError

DEFAULT_NORMS = ("preln", "magneto")
DEPTH_NORMS = ("postln", "preln", "deepnorm", "magneto")
DEPTH_DEPTHS = (6, 18, 50, 100)
NORM_COLORS = {"postln": "tab:red", "preln": "tab:blue", "deepnorm": "tab:green", "magneto": "tab:purple"}
SPIKE_WINDOW = 5  # logged steps averaged before comparing with explode_factor x the first loss
STATUS_FILE = "status.json"  # written by foundation.engine.loop when a run returns or fails
DONE = ("finished", "diverged")  # engine statuses that need no further training
REPORT_LOCK = threading.Lock()


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


# ---------------------------------------------------------------------------- the grid


@dataclass
class RunSpec:
    name: str  # run directory name under OUT/runs
    norm: str
    seed: int
    lr: float
    depth: Optional[int] = None
    overrides: list[str] = field(default_factory=list)  # appended to the user's


def fmt_lr(lr: float) -> str:
    return f"{lr:g}"


def grid(norms: Sequence[str], seeds: Sequence[int], lrs: Sequence[float]) -> list[RunSpec]:
    """norm-major, then lr, then seed: the runs of one norm finish together."""
    return [RunSpec(f"{norm}_lr{fmt_lr(lr)}_seed{seed}", norm, seed, lr,
                    overrides=[f"backbone.norm={norm}", f"seed={seed}", f"optim.lr={lr!r}"])
            for norm in norms for lr in lrs for seed in seeds]


def depth_grid(norms: Sequence[str], depths: Sequence[int], seeds: Sequence[int], lr: float) -> list[RunSpec]:
    return [RunSpec(f"{norm}_{depth}L_seed{seed}", norm, seed, lr, depth,
                    overrides=[f"backbone.norm={norm}", f"seed={seed}", f"backbone.depth={depth}",
                               f"backbone.decoder_depth={depth}"])
            for norm in norms for depth in depths for seed in seeds]


# ---------------------------------------------------------------------------- one run


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


def _num(v: Any) -> Optional[float]:
    """metrics.jsonl numbers; the engine writes non-finite floats as strings ("nan", "inf")."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def read_records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a kill: the rest is still good
                continue
    return out


def train_losses(records: list[dict]) -> tuple[list[int], list[float]]:
    """(steps, losses) of the logged training steps that were taken (not skipped), finite."""
    steps, losses = [], []
    for r in records:
        if "event" in r or r.get("skipped") or "loss" not in r:
            continue
        v = _num(r["loss"])
        if v is not None and math.isfinite(v):
            steps.append(int(r["step"]))
            losses.append(v)
    return steps, losses


def eval_series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of ``eval/<key>``; a later record for a step wins."""
    by_step: dict[int, float] = {}
    for r in records:
        v = _num(r.get(f"eval/{key}"))
        if v is not None:
            by_step[int(r["step"])] = v
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def last_eval(records: list[dict]) -> tuple[Optional[int], dict[str, float]]:
    for r in reversed(records):
        values = {k[len("eval/"):]: _num(v) for k, v in r.items() if k.startswith("eval/")}
        if values:
            return int(r["step"]), {k: v for k, v in values.items() if v is not None}
    return None, {}


def judge(spec: RunSpec, run_dir: Path, rules: Rules = Rules(), failure: str = "") -> Outcome:
    """The verdict on one run directory (the rules in the module docstring)."""
    explode_factor = rules.explode_factor
    records = read_records(run_dir)
    status = None
    if (run_dir / STATUS_FILE).is_file():
        try:
            status = json.loads((run_dir / STATUS_FILE).read_text())
        except json.JSONDecodeError:
            status = None
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
        what = (event or {}).get("what", "loss or gradients")
        out.reason = f"engine: non-finite {what}, {status['message'] if status else event.get('message', '')}".strip()
        return out
    if engine == "failed" and not failure:  # status.json holds the engine's one-line reason
        failure = f"engine: {status.get('message', 'failed')}"
    if engine not in ("finished",):
        out.verdict = "failed" if failure else "incomplete"
        out.reason = failure or (f"engine status {engine!r}" if engine else "no status.json: not run to the end")
        return out
    if explode_factor and losses:
        limit = explode_factor * losses[0]
        for i in range(len(losses)):
            window = losses[max(0, i - SPIKE_WINDOW + 1): i + 1]
            if len(window) == min(SPIKE_WINDOW, len(losses)) and sum(window) / len(window) > limit:
                # the step where the spell above the limit began (the window's first step above it)
                first = next(j for j in range(max(0, i - SPIKE_WINDOW + 1), i + 1) if losses[j] > limit)
                out.verdict, out.diverged_step = "diverged", steps[first]
                out.reason = (f"loss spike: mean over {len(window)} steps {sum(window) / len(window):.3g} > "
                              f"{explode_factor:g} x first loss {losses[0]:.3g}")
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


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out = {}
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


# settings that do not change a run's result (output_dir/run_name: a report directory may be moved)
IGNORED_KEYS = ("resume", "overwrite", "checkpoint", "log.", "train.stop_at", "train.num_workers", "device",
                "output_dir", "run_name")


def config_mismatch(run_dir: Path, wanted: dict) -> list[str]:
    """Keys whose value in ``run_dir/config.yaml`` differs from ``wanted`` (a resolved config
    as a dict); settings that do not change the result (logging, resume) are ignored."""
    from omegaconf import OmegaConf

    path = run_dir / "config.yaml"
    if not path.is_file():
        return []
    have = _flat(OmegaConf.to_container(OmegaConf.load(path), resolve=True))
    want = _flat(wanted)
    keys = sorted(set(have) | set(want))
    return [k for k in keys if not k.startswith(IGNORED_KEYS) and have.get(k) != want.get(k)]


class Runner:
    """Runs the specs of a comparison, each once: ``Runner(...).run(specs) -> [Outcome]``."""

    def __init__(self, config: Path, out: Path, overrides: Sequence[str] = (), *, in_process: bool = False,
                 overwrite: bool = False, rules: Rules = Rules(), say: Callable[[str], None] = print):
        self.config, self.out, self.user = Path(config), Path(out), list(overrides)
        self.in_process, self.overwrite, self.rules, self.say = in_process, overwrite, rules, say
        self.trained, self.seconds = 0, 0.0  # runs this invocation trained (not skipped), and their wall time

    def invocation(self, total: int) -> str:
        """What this invocation did, for the report."""
        if not self.trained:
            return f"All {total} runs were done earlier; this invocation only wrote the report."
        return f"This invocation trained {self.trained} of the {total} runs in {self.seconds:.0f} s of wall time."

    def run_overrides(self, spec: RunSpec) -> list[str]:
        return [*self.user, *spec.overrides, f"output_dir={self.out / 'runs'}", f"run_name={spec.name}",
                "log.progress=false"]

    def resolve(self, spec: RunSpec):
        from foundation.engine.config import load_config

        return load_config(self.config, self.run_overrides(spec))

    def check(self, specs: Sequence[RunSpec]) -> tuple[str, bool]:
        """Every run's config resolves (before anything trains); the primary metric
        ``task_id/metric`` of the first task and its direction."""
        from foundation.config import to_dict

        for spec in specs:
            cfg, task_specs = self.resolve(spec)
            if not self.overwrite:
                diff = config_mismatch(cfg.run_dir, to_dict(cfg))
                if diff:
                    raise ConfigError(
                        f"{cfg.run_dir} holds a run of another configuration ({', '.join(diff[:6])}"
                        f"{' ...' if len(diff) > 6 else ''} differ); pass --overwrite to replace it or --out "
                        "for another report directory")
        first = task_specs[0]
        key = cfg.eval.best or f"{first.id}/{first.cls.primary_metric}"
        higher = first.cls.higher_is_better if key == f"{first.id}/{first.cls.primary_metric}" else True
        if cfg.eval.best_mode != "auto":
            higher = cfg.eval.best_mode == "max"
        return key, higher

    def run(self, specs: Sequence[RunSpec]) -> list[Outcome]:
        outcomes = []
        for i, spec in enumerate(specs, 1):
            run_dir = self.out / "runs" / spec.name
            status = _status(run_dir)
            head = f"[{i}/{len(specs)}] {spec.name}"
            failure = ""
            if status in DONE and not self.overwrite:
                self.say(f"{head}: {status} earlier, skipped")
            else:
                if self.overwrite and run_dir.exists():
                    shutil.rmtree(run_dir)
                resume = run_dir.is_dir() and ((run_dir / "ckpt").is_dir() or (run_dir / "metrics.jsonl").is_file())
                start = time.perf_counter()
                self.say(f"{head}: {'resuming' if resume else 'training'} ...")
                failure = self._train(spec, run_dir, resume)
                self.trained += 1
                self.seconds += time.perf_counter() - start
                self.say(f"{head}: done in {time.perf_counter() - start:.1f} s")
            outcome = judge(spec, run_dir, self.rules, failure)
            outcomes.append(outcome)
            self.say(f"{head}: {describe(outcome)}")
        return outcomes

    def _train(self, spec: RunSpec, run_dir: Path, resume: bool) -> str:
        """Train one run; '' when the engine returned (any status), else what went wrong."""
        overrides = self.run_overrides(spec) + (["resume=true"] if resume else [])
        if self.in_process:
            from foundation.engine.config import load_config
            from foundation.engine.loop import train

            try:
                result = train(*load_config(self.config, overrides))
            except KeyboardInterrupt:
                raise
            except Exception as e:  # a crash ends this run, not the comparison
                return f"{type(e).__name__}: {e}"
            if result.status == "interrupted":  # the engine caught Ctrl-C: end the comparison too
                raise KeyboardInterrupt
            return ""
        run_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "foundation.cli", "train", str(self.config), *overrides]
        with open(run_dir / "train.log", "a") as log:
            log.write(f"$ {' '.join(cmd)}\n")
            log.flush()
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if proc.returncode == 130:
            raise KeyboardInterrupt
        if proc.returncode in (0, 1) and _status(run_dir) is not None:  # 1: diverged
            return ""
        tail = (run_dir / "train.log").read_text().strip().splitlines()[-3:]
        return f"exit code {proc.returncode}: " + " | ".join(tail)


def _status(run_dir: Path) -> Optional[str]:
    try:
        return json.loads((run_dir / STATUS_FILE).read_text())["status"]
    except (OSError, ValueError, KeyError):
        return None


def describe(o: Outcome) -> str:
    metrics = ", ".join(f"{k} {v:.4g}" for k, v in o.metrics.items())
    if o.verdict == "diverged":
        return f"diverged at step {o.diverged_step} ({o.reason})"
    if o.verdict in ("failed", "incomplete"):
        return f"{o.verdict}: {o.reason}"
    loss = f"loss {o.initial_loss:.3g} -> {o.final_loss:.3g}" if o.final_loss is not None else ""
    return f"{o.verdict} at step {o.steps}: {loss}; {metrics}"


# ---------------------------------------------------------------------------- aggregation


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


# ---------------------------------------------------------------------------- report


def _fmt(v: Optional[float]) -> str:
    if v is None:
        return "-"
    if not math.isfinite(v):
        return str(v)
    return f"{v:.4f}" if abs(v) < 1000 else f"{v:.4g}"


def cell(stat: dict) -> str:
    """'0.9500 ± 0.0200 (0.9300, 0.9700)'; diverged seeds show as 'div'."""
    values = stat["per_seed"]
    if all(v is None for v in values):
        return "diverged"
    text = _fmt(stat["mean"])
    if len(values) > 1:
        text += f" ± {_fmt(stat['std'])} (" + ", ".join("div" if v is None else _fmt(v) for v in values) + ")"
    return text


def verdict_text(s: dict) -> str:
    n = len(s["seeds"])
    if s["verdict"] == "diverged":
        some = f", {s['diverged']}/{n} seeds" if n > 1 else ""
        return f"diverged at step {s['diverged_step']}{some}"
    if s["verdict"] == "not converged":
        bad = s["verdicts"].count("not converged")
        return "not converged" + (f" ({bad}/{n} seeds)" if n > 1 else "")
    return s["verdict"]


def metrics_table(summary: dict, row_label: Callable[[Any], list[str]], label_cols: list[str], primary: str) -> str:
    names = sorted({m for s in summary.values() for m in s["metrics"]} - {"train_loss", primary})
    cols = [primary, *names, "train_loss"]
    header = [*label_cols, "result", *(f"{c} (final)" if c == "train_loss" else c for c in cols)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(label_cols) + "---|" + "---:|" * len(cols)]
    for k, s in summary.items():
        cells = [*row_label(k), verdict_text(s)]
        cells += [cell(s["metrics"][c]) if c in s["metrics"] else "-" for c in cols]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def lr_table(summary: dict, norms: Sequence[str], lrs: Sequence[float], primary: str) -> str:
    best = largest_converging(summary, norms)
    header = ["norm", *(f"lr {fmt_lr(lr)}" for lr in lrs), "largest lr that converges"]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---|" * len(lrs) + "---:|"]
    for norm in norms:
        cells = [norm]
        for lr in lrs:
            s = summary.get((norm, lr))
            if s is None:
                cells.append("-")
            elif s["verdict"] == "converged":
                cells.append(f"converged ({primary.split('/')[-1]} {_fmt(s['metrics'][primary]['mean']) if primary in s['metrics'] else '-'})")
            else:
                cells.append(verdict_text(s))
        cells.append(fmt_lr(best[norm]) if best[norm] is not None else "none")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def runs_table(outcomes: Sequence[Outcome]) -> str:
    lines = ["| run | verdict | steps | first loss | final loss | time (s), first to last record | note |", "|---|---|---:|---:|---:|---:|---|"]
    for o in outcomes:
        lines.append(f"| {o.name} | {o.verdict}{'' if o.diverged_step is None else f' at {o.diverged_step}'} | "
                     f"{o.steps} | {_fmt(o.initial_loss)} | {_fmt(o.final_loss)} | "
                     f"{'-' if o.wall_s is None else f'{o.wall_s:.0f}'} | {o.reason.replace('|', '/')[:160]} |")
    return "\n".join(lines)


def _json_safe(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else str(x)
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


# ---------------------------------------------------------------------------- plots


def _smooth(values: list[float], window: int) -> list[float]:
    if window <= 1:
        return values
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def plot_curves(outcomes: Sequence[Outcome], path: Path, primary: str, column: Callable[[Outcome], Any],
                column_title: Callable[[Any], str], title: str = "") -> Path:
    """Rows: training loss, the primary metric (eval) against step; one column per value of
    ``column`` (lr or depth); one colour per norm, thin lines per seed, thick = seed mean
    (smoothed); an x where a run diverged."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = list(dict.fromkeys(column(o) for o in outcomes))
    norms = list(dict.fromkeys(o.norm for o in outcomes))
    fig, axes = plt.subplots(2, len(cols), figsize=(max(7.0, 4.2 * len(cols) + 0.6), 6.4), squeeze=False,
                             sharex="col")
    for c, col in enumerate(cols):
        ax_loss, ax_metric = axes[0][c], axes[1][c]
        for norm in norms:
            color = NORM_COLORS.get(norm)
            runs = [o for o in outcomes if o.norm == norm and column(o) == col]
            curves = []
            for o in runs:
                records = read_records(Path(o.run_dir))
                steps, losses = train_losses(records)
                if steps:
                    curves.append(dict(zip(steps, losses)))
                    ax_loss.plot(steps, losses, color=color, lw=0.6, alpha=0.35 if len(runs) > 1 else 0.25)
                    if o.verdict == "diverged" and o.diverged_step is not None:
                        # at the divergence step; a non-finite step has no loss: the last finite one
                        at = dict(zip(steps, losses))
                        x = o.diverged_step if o.diverged_step in at else steps[-1]
                        ax_loss.plot([x], [at[x]], marker="x", color=color, ms=9, mew=2, ls="none")
                es, ev = eval_series(records, primary)
                if es:
                    ax_metric.plot(es, ev, color=color, lw=0.8 if len(runs) > 1 else 1.6, alpha=0.5 if len(runs) > 1 else 1,
                                   marker="o", ms=3, label=None if len(runs) > 1 else norm)
            if curves:  # the mean over seeds where all of them have the step, smoothed
                common = sorted(set.intersection(*(set(c) for c in curves)))
                if common:
                    mean = [statistics.fmean(c[s] for c in curves) for s in common]
                    ax_loss.plot(common, _smooth(mean, max(1, len(common) // 40)), color=color, lw=1.8, label=norm)
            if len(runs) > 1:  # mean of the metric over seeds at the shared eval steps
                series = [dict(zip(*eval_series(read_records(Path(o.run_dir)), primary))) for o in runs]
                shared = sorted(set.intersection(*(set(s) for s in series))) if all(series) else []
                if shared:
                    ax_metric.plot(shared, [statistics.fmean(s[x] for s in series) for x in shared], color=color,
                                   lw=1.8, label=norm)
        ax_loss.set_title(column_title(col), fontsize=10)
        low, high = ax_loss.get_ylim()
        if low > 0 and high / low > 10:  # a blow-up: log scale; otherwise plain numbers read better
            ax_loss.set_yscale("log")
        ax_loss.grid(alpha=0.3, which="both")
        ax_metric.grid(alpha=0.3)
        ax_metric.set_xlabel("step")
        if c == 0:
            ax_loss.set_ylabel("training loss")
            ax_metric.set_ylabel(primary)
    lims = [ax.get_ylim() for ax in axes[1]]  # one metric scale across the columns
    for ax in axes[1]:
        ax.set_ylim(min(lo for lo, _ in lims), max(hi for _, hi in lims))
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in axes.flat:
        h, l = ax.get_legend_handles_labels()
        for hh, ll in zip(h, l):
            if ll not in labels:
                handles.append(hh)
                labels.append(ll)
    if handles and len(cols) > 2:
        fig.legend(handles, labels, loc="upper right", fontsize=9, ncol=len(labels))
    elif handles:
        axes[0][-1].legend(handles, labels, fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9 if len(cols) > 2 else 8, x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_training(outcomes: Sequence[Outcome], path: Path, title: str = "") -> Path:
    """One row: training loss (raw thin, smoothed thick), then every evaluation metric against
    step; one colour per norm (the 1000-layer figure)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = {o.name: read_records(Path(o.run_dir)) for o in outcomes}
    keys = sorted({k[len("eval/"):] for rs in records.values() for r in rs for k in r if k.startswith("eval/")})
    n = 1 + len(keys)
    cols = 2 if n == 4 else n
    rows = math.ceil(n / cols)
    fig, grid_axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows + 0.4), squeeze=False)
    axes = [list(grid_axes.flat)[:n]]
    for ax in list(grid_axes.flat)[n:]:
        ax.axis("off")
    ax_loss = axes[0][0]
    for o in outcomes:
        color = NORM_COLORS.get(o.norm)
        steps, losses = train_losses(records[o.name])
        label = o.norm + (f" (seed {o.seed})" if len({x.seed for x in outcomes}) > 1 else "")
        if o.verdict != "converged":
            label += f", {o.verdict}" + (f" at step {o.diverged_step}" if o.diverged_step else "")
        ax_loss.plot(steps, losses, color=color, lw=0.6, alpha=0.3)
        ax_loss.plot(steps, _smooth(losses, max(1, len(losses) // 25)), color=color, lw=1.8, label=label)
        for ax, key in zip(axes[0][1:], keys):
            es, ev = eval_series(records[o.name], key)
            ax.plot(es, ev, color=color, lw=1.6, marker="o", ms=4)
    ax_loss.set_title("training loss", fontsize=10)
    ax_loss.legend(fontsize=8)
    for ax, key in zip(axes[0][1:], keys):
        ax.set_title(f"evaluation: {key}", fontsize=10)
    for ax in axes[0]:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    if title:
        import textwrap

        fig.suptitle("\n".join(textwrap.wrap(title, 110, break_on_hyphens=False)), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_depth(summary: dict, path: Path, primary: str, norms: Sequence[str], depths: Sequence[int],
               title: str = "", higher_is_better: bool = True) -> Path:
    """Final primary metric and final eval loss against depth (log x), one line per norm;
    a diverged setting is an x on the axis floor (metric) / ceiling (loss)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loss_key = primary.split("/")[0] + "/loss"
    panels = [(primary, primary.split("/")[-1] + " (final)")]
    if any(loss_key in s["metrics"] for s in summary.values()) and loss_key != primary:
        panels.append((loss_key, "evaluation loss (final)"))
    panels.append(("train_loss", "training loss (final)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels), 3.8), squeeze=False)
    for ax, (key, label) in zip(axes[0], panels):
        finite = [s["metrics"][key]["mean"] for s in summary.values() if key in s["metrics"]
                  and math.isfinite(s["metrics"][key]["mean"])]
        lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
        floor = lo if key == primary and higher_is_better else hi  # where a diverged run goes
        for i, norm in enumerate(norms):
            color = NORM_COLORS.get(norm)
            shift = 1.035 ** (i - (len(norms) - 1) / 2)  # norms side by side at each depth (log x)
            xs, ys, errs, open_, div = [], [], [], [], []
            for d in depths:
                s = summary.get((norm, d))
                if s is None:
                    continue
                m = s["metrics"].get(key)
                if s["verdict"] == "diverged" or m is None or not math.isfinite(m["mean"]):
                    if s["verdict"] == "diverged":
                        div.append(d * shift)
                    continue
                xs.append(d * shift)
                ys.append(m["mean"])
                errs.append(m["std"])
                if s["verdict"] != "converged":
                    open_.append((d * shift, m["mean"]))
            ax.errorbar(xs, ys, yerr=errs if any(errs) else None, color=color, marker="o", ms=5, lw=1.8,
                        capsize=3, label=norm)
            if open_:  # not converged: a hollow marker
                ax.plot(*zip(*open_), ls="none", marker="o", ms=8, mfc="white", mec=color, mew=1.8)
            if div:
                ax.plot(div, [floor] * len(div), ls="none", marker="x", ms=10, mew=2.5, color=color)
        ax.set_xscale("log")
        ax.set_xticks(list(depths))
        ax.set_xticklabels([f"{d}L-{d}L" for d in depths], fontsize=8)
        ax.minorticks_off()
        ax.set_xlabel("depth (encoder layers - decoder layers)")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
        if "loss" in key and finite and hi / max(lo, 1e-12) > 20:
            ax.set_yscale("log")
    from matplotlib.lines import Line2D

    handles, _ = axes[0][0].get_legend_handles_labels()
    handles += [Line2D([], [], ls="none", marker="o", mfc="white", mec="grey", mew=1.8, ms=8, label="not converged"),
                Line2D([], [], ls="none", marker="x", color="grey", mew=2.5, ms=9, label="diverged")]
    axes[0][0].legend(handles=handles, fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------- argument parsing


def parse_norms(text: str) -> list[str]:
    from foundation.scaling import NORMS

    norms = [t.strip() for t in text.split(",") if t.strip()]
    if not norms:
        raise ValueError("--norms: give at least one norm")
    for n in norms:
        if n not in NORMS:
            raise ValueError(f"--norms: unknown norm {n!r}; known: {', '.join(NORMS)}")
    if len(set(norms)) != len(norms):
        raise ValueError(f"--norms: a norm is listed twice: {text}")
    return norms


def parse_list(text: str, flag: str, convert: Callable[[str], Any], what: str, example: str) -> list:
    """A comma-separated command-line list: every item converts, at least one, none twice."""
    out = []
    for t in (t.strip() for t in text.split(",")):
        if not t:
            continue
        try:
            out.append(convert(t))
        except ValueError:
            raise ValueError(f"{flag}: {t!r} is not {what} (expected e.g. {example})") from None
    if not out:
        raise ValueError(f"{flag}: give at least one value (e.g. {example})")
    if len(set(out)) != len(out):
        raise ValueError(f"{flag}: a value is listed twice: {text}")
    return out


def parse_floats(text: str, flag: str = "--lrs") -> list[float]:
    out = parse_list(text, flag, float, "a number", "1e-3,3e-3")
    for t, v in zip([t.strip() for t in text.split(",") if t.strip()], out):
        if not math.isfinite(v) or v <= 0:
            raise ValueError(f"{flag}: {t!r} must be a positive number")
    return out


def parse_ints(text: str, flag: str, example: str = "6,18") -> list[int]:
    return parse_list(text, flag, int, "a whole number", example)


def parse_seeds(text: str, base: int = 0) -> list[int]:
    """``3`` = three seeds from the config's (base, base+1, base+2); ``0,5,7`` = these."""
    if "," in text:
        return parse_ints(text, "--seeds", "0,1")
    try:
        n = int(text)
    except ValueError:
        raise ValueError(f"--seeds: {text!r} is neither a count (e.g. 2) nor a list (e.g. 0,1)") from None
    if n < 1:
        raise ValueError(f"--seeds: the count must be >= 1 (got {n})")
    return [base + i for i in range(n)]


def _check_overrides(overrides: Sequence[str], owned: Sequence[str]) -> None:
    for o in overrides:
        key = o.partition("=")[0].strip().lstrip("-")
        if key in owned:
            flag = {"backbone.norm": "--norms", "seed": "--seeds", "optim.lr": "--lrs", "run_name": "--out",
                    "output_dir": "--out", "backbone.depth": "--depths", "backbone.decoder_depth": "--depths",
                    "resume": "(runs resume by themselves)", "overwrite": "--overwrite"}.get(key, "")
            raise ValueError(f"override {o!r}: compare sets {key} for each run; use {flag} instead")


OWNED = ("backbone.norm", "seed", "optim.lr", "run_name", "output_dir", "resume", "overwrite")

EXAMPLES = """\
examples:
  foundation compare configs/seq2seq/tiny.yaml                          # preln vs magneto, 1 seed, the config's lr
  foundation compare configs/seq2seq/tiny.yaml --norms postln,preln,deepnorm,magneto --seeds 3
  foundation compare configs/seq2seq/tiny.yaml --lrs 1e-3,3e-3,1e-2,3e-2,1e-1 --out runs/lr-sweep train.steps=200
  foundation compare configs/vision/tiny_finetune_magneto.yaml --seeds 2 train.steps=100
  foundation compare depth                                              # DeepNet's depth figure in miniature
  foundation compare depth --thousand                                   # 500L-500L, deepnorm and magneto
  foundation compare pretraining --seeds 2                              # cross-modal vs own-modality pretraining

Re-running the same command skips finished runs and resumes unfinished ones.
Run directories: OUT/runs/<norm>_lr<lr>_seed<seed> (standard `foundation train` runs: metrics.jsonl,
status.json, train.log, checkpoints). Report: OUT/report.md, OUT/results.json, OUT/curves.png.
"""


def _common_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--in-process", action="store_true",
                   help="train in this process instead of one subprocess per run (faster start, less isolated)")
    p.add_argument("--overwrite", action="store_true", help="run every run again, replacing its directory")
    p.add_argument("--explode-factor", type=float, default=Rules.explode_factor,
                   help="a run whose training loss (mean of %d logged steps) exceeds this times its first loss "
                        "counts as diverged (default %g; 0 = only the engine's non-finite detection)"
                        % (SPIKE_WINDOW, Rules.explode_factor))
    p.add_argument("--converge-ratio", type=float, default=Rules.converge_ratio,
                   help="a finished run whose final training loss is above this times its first loss counts as "
                        "not converged (default %g)" % Rules.converge_ratio)


def _rules(args: argparse.Namespace) -> Rules:
    if args.explode_factor < 0 or (args.explode_factor and args.explode_factor <= 1):
        raise ValueError(f"--explode-factor must be > 1, or 0 to switch the rule off (got {args.explode_factor:g})")
    if not 0 < args.converge_ratio <= 1:
        raise ValueError(f"--converge-ratio must be in (0, 1] (got {args.converge_ratio:g})")
    return Rules(args.explode_factor, args.converge_ratio)


def main(argv: Sequence[str]) -> int:
    argv = list(argv)
    if argv[:1] == ["depth"]:
        return depth_main(argv[1:])
    if argv[:1] == ["pretraining"]:
        from foundation.engine.compare_pretraining import main as pretraining_main

        return pretraining_main(argv[1:])
    p = argparse.ArgumentParser(
        prog="foundation compare", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES,
        description="Train one recipe (a `foundation train` config) under several norms, seeds and learning "
                    "rates, each its own run, and write a report: final metrics per norm (mean ± std over "
                    "seeds), convergence per learning rate and the curves. "
                    "`foundation compare depth --help`: the depth-stability sweep; `foundation compare pretraining "
                    "--help`: cross-modal against single-modality pretraining per task.")
    p.add_argument("config", help="a `foundation train` YAML config (see configs/)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides for every run, e.g. train.steps=200")
    p.add_argument("--norms", default=",".join(DEFAULT_NORMS), help="comma-separated (default preln,magneto)")
    p.add_argument("--seeds", default="1", help="a count (from the config's seed) or a comma-separated list (default 1)")
    p.add_argument("--lrs", default=None, help="comma-separated peak learning rates (default: the config's optim.lr)")
    p.add_argument("--out", type=Path, default=None, help="report directory (default runs/compare-<config name>)")
    _common_flags(p)
    args = p.parse_intermixed_args(argv)
    from foundation.engine.config import load_config

    try:
        norms = parse_norms(args.norms)
        _check_overrides(args.overrides, OWNED)
        base, _ = load_config(args.config, args.overrides)  # a bad path or override fails here, named
        seeds = parse_seeds(args.seeds, base.seed)
        lrs = parse_floats(args.lrs) if args.lrs is not None else [base.optim.lr]
        rules = _rules(args)
    except (ValueError, ConfigError) as e:
        print(f"foundation compare: error: {e}", file=sys.stderr)
        return 2
    out = args.out or Path("runs") / f"compare-{Path(args.config).stem}"
    command = "foundation compare " + " ".join(argv)
    return compare(Path(args.config), out, norms, seeds, lrs, args.overrides, command=command,
                   in_process=args.in_process, overwrite=args.overwrite, rules=rules)


def compare(config: Path, out: Path, norms: Sequence[str], seeds: Sequence[int], lrs: Sequence[float],
            overrides: Sequence[str] = (), *, command: str = "", in_process: bool = False, overwrite: bool = False,
            rules: Rules = Rules(), say: Callable[[str], None] = print) -> int:
    specs = grid(norms, seeds, lrs)
    runner = Runner(config, out, overrides, in_process=in_process, overwrite=overwrite, rules=rules, say=say)
    try:
        primary, higher = runner.check(specs)
    except ConfigError as e:
        print(f"foundation compare: error: {e}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    say(f"{len(specs)} runs ({len(norms)} norms x {len(lrs)} lrs x {len(seeds)} seeds) -> {out}/runs")
    try:
        outcomes = runner.run(specs)
    except KeyboardInterrupt:
        print("\ninterrupted; the same command resumes the comparison", file=sys.stderr)
        return 130
    with REPORT_LOCK:  # pyplot is not thread-safe: `foundation demo` runs comparisons in threads
        write_report(out, config, outcomes, norms, seeds, lrs, primary, higher, command, rules,
                     runner.invocation(len(specs)))
    say(f"wrote {out}/report.md, results.json, curves.png")
    return 0


def write_report(out: Path, config: Path, outcomes: Sequence[Outcome], norms, seeds, lrs, primary: str,
                 higher: bool, command: str, rules: Rules, invocation: str) -> None:
    summary = summarize(outcomes, lambda o: (o.norm, o.lr))
    one_lr = len(lrs) == 1
    label = (lambda k: [k[0]]) if one_lr else (lambda k: [k[0], fmt_lr(k[1])])
    parts = [
        f"# Comparison: {config}",
        "",
        f"`{command.strip()}`",
        "",
        f"{len(outcomes)} runs: norms {', '.join(norms)}; seeds {', '.join(map(str, seeds))}; "
        f"lr {', '.join(map(fmt_lr, lrs))}. Primary metric: `{primary}` ({'higher' if higher else 'lower'} is better). "
        + invocation,
        "",
        "## Final metrics",
        "",
        "Last evaluation of each run; mean ± std over seeds (sample std), per-seed values in brackets "
        "(`div`: that seed diverged and is left out of the mean).",
        "",
        metrics_table(summary, label, ["norm"] if one_lr else ["norm", "lr"], primary),
        "",
        "## Convergence per learning rate",
        "",
        lr_table(summary, norms, lrs, primary),
        "",
        "Rule: " + rules.text(),
        "",
        "![curves](curves.png)",
        "",
        "## Runs",
        "",
        runs_table(outcomes),
        "",
        "Each run directory (`runs/<name>/`) holds the engine's `metrics.jsonl`, `status.json`, `config.yaml`, "
        "`train.log` and checkpoints.",
        "",
    ]
    (out / "report.md").write_text("\n".join(parts))
    results = {
        "command": command.strip(), "config": str(config), "primary_metric": primary, "higher_is_better": higher,
        "norms": list(norms), "seeds": list(seeds), "lrs": list(lrs),
        "rule": {**asdict(rules), "spike_window": SPIKE_WINDOW, "text": rules.text()},
        "largest_converging_lr": largest_converging(summary, norms),
        "summary": [{"norm": n, "lr": lr, **s} for (n, lr), s in summary.items()],
        "runs": [asdict(o) for o in outcomes],
    }
    (out / "results.json").write_text(json.dumps(_json_safe(results), indent=2) + "\n")
    plot_curves(outcomes, out / "curves.png", primary, lambda o: o.lr, lambda lr: f"lr {fmt_lr(lr)}",
                title=f"{config.name}: " + ", ".join(norms))


# ---------------------------------------------------------------------------- depth mode

# DeepNet's 64-128-2 encoder-decoder (Sec. 2, Fig. 4-5) on the generated reversal task.
DEPTH_RECIPE = {
    "run_name": "depth",
    "seed": 0,
    "backbone": {"arch": "encoder_decoder", "norm": "magneto", "dim": 64, "depth": 6, "heads": 2, "ffn_dim": 128},
    "tasks": [{"name": "seq2seq", "problem": "reverse", "vocab_size": 10, "min_len": 3, "max_len": 8,
               "train_size": 10000, "eval_size": 128}],
    "optim": {"lr": 3.0e-3, "weight_decay": 0.01, "clip_grad": 1.0},
    "schedule": {"name": "cosine", "warmup_steps": 20},
    "train": {"steps": 100, "batch_size": 64},
    "eval": {"every": 50, "batch_size": 128},  # greedy decoding re-runs the decoder per token: few, large batches
    "save": {"every": 0, "keep": 1},
    "log": {"progress": False, "tensorboard": False},
}
# 500L-500L: half the batch (a step costs ~5x a 100L-100L one) and a third of the lr: at 3e-3
# DeepNorm's 1000-layer model stalls at the token-frequency plateau (Magneto's trains)
THOUSAND = {"norms": ("deepnorm", "magneto"), "depth": 500, "steps": 100, "batch_size": 32, "lr": 1e-3}

DEPTH_EXAMPLES = """\
defaults: DeepNet's 64-128-2 encoder-decoder (dim 64, ffn 128, 2 heads) reversing sequences of 3-8
symbols (vocabulary 10), 100 steps of batch 64, AdamW lr 3e-3 (warm-up 20, cosine), clip 1.0,
evaluated at steps 50 and 100 on 128 held-out sequences; --thousand: 500L-500L, batch 32, lr 1e-3,
100 steps, evaluated every 25 steps on 64 sequences.

examples:
  foundation compare depth                                   # 4 norms x 6L..100L, the defaults above
  foundation compare depth --depths 6,12,24 --steps 100 --out runs/depth-small
  foundation compare depth --norms postln,magneto --seeds 2 --lr 1e-3 tasks.0.problem=sort
  foundation compare depth --thousand                        # 500L-500L deepnorm + magneto, training curves
  foundation compare depth --thousand --steps 300 --out runs/thousand-300

The recipe (DeepNet's 64-128-2 encoder-decoder on sequence reversal) is written to OUT/config.yaml;
key=value overrides change it for every run. Re-running the same command skips finished runs.
"""


def depth_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(
        prog="foundation compare depth", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=DEPTH_EXAMPLES,
        description="DeepNet's 'convergence with varying depth' in miniature: the seq2seq reversal task with an "
                    "NL-NL encoder-decoder for each norm and depth, a fixed number of steps; plots the final "
                    "metric and loss against depth (OUT/depth.png) and writes OUT/report.md.")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="dotted overrides of the recipe for every run, e.g. backbone.dim=32 tasks.0.problem=sort")
    p.add_argument("--norms", default=None, help="comma-separated (default postln,preln,deepnorm,magneto; "
                                                 "--thousand: deepnorm,magneto)")
    p.add_argument("--depths", default=None, help="comma-separated N for NL-NL (default 6,18,50,100)")
    p.add_argument("--steps", type=int, default=None,
                   help=f"training steps per run (default {DEPTH_RECIPE['train']['steps']}; --thousand: {THOUSAND['steps']})")
    p.add_argument("--lr", type=float, default=None, help=f"peak learning rate (default {DEPTH_RECIPE['optim']['lr']:g}; "
                                                          f"--thousand: {THOUSAND['lr']:g})")
    p.add_argument("--seeds", default="1", help="a count or a comma-separated list (default 1)")
    p.add_argument("--thousand", action="store_true",
                   help=f"train {THOUSAND['depth']}L-{THOUSAND['depth']}L (1000 layers) models instead and plot "
                        "their training curves (OUT/thousand.png)")
    p.add_argument("--out", type=Path, default=None,
                   help="report directory (default runs/compare-depth; --thousand: runs/compare-thousand)")
    _common_flags(p)
    args = p.parse_intermixed_args(argv)
    try:
        norms = parse_norms(args.norms or ",".join(THOUSAND["norms"] if args.thousand else DEPTH_NORMS))
        if args.thousand and args.depths:
            raise ValueError("--thousand trains 500L-500L models; leave out --depths")
        depths = [THOUSAND["depth"]] if args.thousand else sorted(parse_ints(args.depths, "--depths")) if args.depths \
            else list(DEPTH_DEPTHS)
        if min(depths) < 1:
            raise ValueError(f"--depths: depths must be >= 1 (got {min(depths)})")
        steps = args.steps if args.steps is not None else THOUSAND["steps"] if args.thousand else DEPTH_RECIPE["train"]["steps"]
        if steps < 1:
            raise ValueError(f"--steps must be >= 1 (got {steps})")
        lr = args.lr if args.lr is not None else THOUSAND["lr"] if args.thousand else DEPTH_RECIPE["optim"]["lr"]
        if not (lr > 0 and math.isfinite(lr)):
            raise ValueError(f"--lr must be a positive number (got {lr})")
        seeds = parse_seeds(args.seeds, 0)
        _check_overrides(args.overrides, OWNED + ("backbone.depth", "backbone.decoder_depth"))
        rules = _rules(args)
    except ValueError as e:
        print(f"foundation compare depth: error: {e}", file=sys.stderr)
        return 2
    out = args.out or Path("runs") / ("compare-thousand" if args.thousand else "compare-depth")
    command = "foundation compare depth " + " ".join(argv)
    return depth_compare(out, norms, depths, seeds, steps, lr, args.overrides, command=command,
                         thousand=args.thousand, in_process=args.in_process, overwrite=args.overwrite,
                         rules=rules)


def depth_recipe(steps: int, lr: float, thousand: bool = False) -> dict:
    import copy

    recipe = copy.deepcopy(DEPTH_RECIPE)
    recipe["train"]["steps"] = steps
    recipe["optim"]["lr"] = lr
    recipe["eval"]["every"] = max(1, steps // 2)
    if thousand:  # ~5x the cost of a 100L-100L step: half the batch; evaluation decodes through 500 layers
        recipe["train"]["batch_size"] = THOUSAND["batch_size"]
        recipe["tasks"][0]["eval_size"] = 64
        recipe["eval"]["every"] = max(1, steps // 4)
    return recipe


def depth_compare(out: Path, norms: Sequence[str], depths: Sequence[int], seeds: Sequence[int], steps: int,
                  lr: float, overrides: Sequence[str] = (), *, command: str = "", thousand: bool = False,
                  in_process: bool = False, overwrite: bool = False, rules: Rules = Rules(),
                  recipe: Optional[dict] = None, say: Callable[[str], None] = print) -> int:
    from omegaconf import OmegaConf

    out.mkdir(parents=True, exist_ok=True)
    config = out / "config.yaml"
    recipe = recipe if recipe is not None else depth_recipe(steps, lr, thousand)
    config.write_text("# written by foundation compare depth: the recipe every run of this report shares\n"
                      + OmegaConf.to_yaml(OmegaConf.create(recipe)))
    specs = depth_grid(norms, depths, seeds, lr)
    runner = Runner(config, out, overrides, in_process=in_process, overwrite=overwrite, rules=rules, say=say)
    try:
        primary, higher = runner.check(specs)
        base, _ = runner.resolve(specs[0])
    except ConfigError as e:
        print(f"foundation compare depth: error: {e}", file=sys.stderr)
        return 2
    b = base.backbone
    about = (f"{b.dim}-{b.ffn_dim}-{b.heads} encoder-decoder, seq2seq {base.tasks[0].get('problem', '')}, "
             f"{base.train.steps} steps, batch {base.train.batch_size}, AdamW lr {base.optim.lr:g} "
             f"(warm-up {base.schedule.warmup_steps}, {base.schedule.name}), clip {base.optim.clip_grad}")
    say(f"{len(specs)} runs ({len(norms)} norms x {len(depths)} depths x {len(seeds)} seeds): {about} -> {out}/runs")
    try:
        outcomes = runner.run(specs)
    except KeyboardInterrupt:
        print("\ninterrupted; the same command resumes the comparison", file=sys.stderr)
        return 130
    summary = summarize(outcomes, lambda o: (o.norm, o.depth))
    name = "thousand" if thousand else "depth"
    title = about + (f", seeds {', '.join(map(str, seeds))}" if len(seeds) > 1 else f", seed {seeds[0]}")
    plot_curves(outcomes, out / "curves.png", primary, lambda o: o.depth, lambda d: f"{d}L-{d}L", title=title)
    if thousand:
        plot_training(outcomes, out / "thousand.png", title=f"{2 * depths[0]} layers ({depths[0]}L-{depths[0]}L): {title}")
    else:
        plot_depth(summary, out / "depth.png", primary, norms, depths, title=title, higher_is_better=higher)
    write_depth_report(out, outcomes, summary, norms, depths, seeds, primary, higher, about, command,
                       rules, runner.invocation(len(specs)), thousand)
    say(f"wrote {out}/report.md, results.json, {name + '.png' if thousand else 'depth.png'}, curves.png")
    return 0


def depth_table(summary: dict, norms: Sequence[str], depths: Sequence[int], primary: str) -> str:
    loss_key = primary.split("/")[0] + "/loss"
    header = ["norm", *(f"{d}L-{d}L" for d in depths)]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * len(depths)]
    for norm in norms:
        cells = [norm]
        for d in depths:
            s = summary.get((norm, d))
            if s is None:
                cells.append("-")
                continue
            m, loss = s["metrics"].get(primary), s["metrics"].get(loss_key)
            if s["verdict"] == "diverged" and (m is None or not math.isfinite(m["mean"])):
                cells.append(verdict_text(s))
                continue
            text = f"{_fmt(m['mean'])}" if m else "-"
            if m and len(s["seeds"]) > 1:
                text += f" ± {_fmt(m['std'])}"
            if loss and math.isfinite(loss["mean"]):
                text += f" (loss {loss['mean']:.3f})"
            if s["verdict"] != "converged":
                text += f", {verdict_text(s)}"
            cells.append(text)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_depth_report(out: Path, outcomes, summary, norms, depths, seeds, primary, higher, about, command,
                       rules, invocation, thousand) -> None:
    times = [o.wall_s for o in outcomes if o.wall_s is not None]
    per_depth = {d: [o.wall_s for o in outcomes if o.depth == d and o.wall_s is not None] for d in depths}
    timing = "; ".join(f"{d}L-{d}L {statistics.fmean(v):.0f} s" for d, v in per_depth.items() if v)
    figure = "![training curves](thousand.png)" if thousand else "![metric vs depth](depth.png)\n\n![curves](curves.png)"
    parts = [
        "# " + (f"{2 * depths[0]}-layer training ({depths[0]}L-{depths[0]}L)" if thousand
                else "Convergence with varying depth"),
        "",
        f"`{command.strip()}`",
        "",
        f"{about}; {len(outcomes)} runs, recipe in `config.yaml`. Time per run (mean, first to last metrics "
        f"record): {timing or '-'}" + (f"; all runs together {sum(times):.0f} s. " if times else ". ") + invocation,
        "",
        f"Final `{primary}` ({'higher' if higher else 'lower'} is better) and, in brackets, the final evaluation "
        "loss per norm and depth" + (" (mean ± std over seeds)" if len(seeds) > 1 else "") + ":",
        "",
        depth_table(summary, norms, depths, primary),
        "",
        figure,
        "",
        "Rule: " + rules.text(),
        "",
        "## All metrics",
        "",
        metrics_table(summary, lambda k: [k[0], f"{k[1]}L-{k[1]}L"], ["norm", "depth"], primary),
        "",
        "## Runs",
        "",
        runs_table(outcomes),
        "",
    ]
    (out / "report.md").write_text("\n".join(parts))
    results = {
        "command": command.strip(), "about": about, "primary_metric": primary, "higher_is_better": higher,
        "norms": list(norms), "depths": list(depths), "seeds": list(seeds),
        "rule": {**asdict(rules), "spike_window": SPIKE_WINDOW, "text": rules.text()},
        "summary": [{"norm": n, "depth": d, **s} for (n, d), s in summary.items()],
        "runs": [asdict(o) for o in outcomes],
    }
    (out / "results.json").write_text(json.dumps(_json_safe(results), indent=2) + "\n")
