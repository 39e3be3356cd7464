"""The studies' figures (matplotlib, Agg): a run's curves (``foundation plot RUN_DIR``) and the
comparisons' curves.png, depth.png and thousand.png."""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Sequence

from studies.runs import eval_series, read_records, train_losses
from studies.verdict import Outcome

NORM_COLORS = {"postln": "tab:red", "preln": "tab:blue", "deepnorm": "tab:green", "magneto": "tab:purple",
               "foundation_ln": "tab:orange", "upscale_ln": "tab:olive"}


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# ---------------------------------------------------------------------------- one run: foundation plot


def series(records: list[dict]) -> dict[str, tuple[list[int], list[float]]]:
    """{name: (steps, values)} of every numeric field; a later record for a step wins."""
    by_name: dict[str, dict[int, float]] = defaultdict(dict)
    for r in records:
        if "event" in r:
            continue
        for k, v in r.items():
            if k not in ("step", "time", "samples") and isinstance(v, (int, float)) and not isinstance(v, bool) \
                    and math.isfinite(v):
                by_name[k][r["step"]] = v
    return {k: (sorted(d), [d[s] for s in sorted(d)]) for k, d in by_name.items()}


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    plt = pyplot()
    run_dir = Path(run_dir)
    records = read_records(run_dir, required=True)
    data = series(records)
    per_task = [k for k in data if k.startswith("loss/")]
    losses = [k for k in data if k == "loss"] + (per_task if len(per_task) > 1 else [])
    evals = sorted(k for k in data if k.startswith("eval/"))
    events = [r for r in records if r.get("event") in ("nonfinite", "diverged", "resume", "guard")]
    updates = [k for k in ("update/output", "update/weights_max") if k in data]  # the guard's measurement
    panels = [("training loss", losses, True), ("learning rate", ["lr"] if "lr" in data else [], False),
              ("gradient norm (before clipping)", ["grad_norm"] if "grad_norm" in data else [], True),
              ("model update (relative, over guard.every steps)", updates, True),
              ("largest attention logit |q.k|/sqrt(d) (guard)", [k for k in ("attention/logit_max",) if k in data], True)]
    panels += [(f"eval {k[len('eval/'):]}", [k], False) for k in evals]
    panels = [p for p in panels if p[1]]
    if not panels:
        raise ValueError(f"{run_dir}/metrics.jsonl holds no numeric records yet")
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.4 * rows), squeeze=False)
    for ax, (title, keys, log_y) in zip(axes.flat, panels):
        for k in keys:
            steps, values = data[k]
            ax.plot(steps, values, marker="o" if len(steps) < 20 else None, ms=3, label=k)
        if log_y and all(v > 0 for k in keys for v in data[k][1]):
            ax.set_yscale("log")
        for e in events:
            ax.axvline(e["step"], color={"resume": "grey", "guard": "orange"}.get(e["event"], "red"), lw=0.6, ls=":")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(keys) > 1:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    out = Path(out) if out is not None else run_dir / "curves.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="foundation plot", description="Draw a run's curves to RUN_DIR/curves.png.")
    p.add_argument("run_dir")
    p.add_argument("--out", help="PNG path (default RUN_DIR/curves.png)")
    args = p.parse_args(argv)
    try:
        out = plot_run(args.run_dir, args.out)
    except (FileNotFoundError, ValueError) as e:
        print(f"foundation plot: error: {e}", file=sys.stderr)
        return 2
    print(out)
    return 0


# ---------------------------------------------------------------------------- comparisons


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
    plt = pyplot()
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
        low, high = ax_metric.dataLim.intervaly  # the values, not the padded axis
        if low > 0 and high / low > 100:  # e.g. a WER of 3000 % before the decoder works: log scale
            ax_metric.set_yscale("log")
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
    plt = pyplot()
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
    plt = pyplot()
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



def plot_ladder(panels: Sequence[tuple], norms: Sequence[str], path: Path) -> Path:
    """``foundation compare stability``'s figure: one panel per (task, depth) - ``panels`` of
    (title, summary {(norm, lr): ...}, metric key, scale, higher_is_better, lrs, depth) - the
    final metric against the peak lr (log x), one line per rule; a diverged setting is an x on
    the panel's floor (the worst end of its axis), a setting that did not converge a hollow marker."""
    plt = pyplot()
    from matplotlib.lines import Line2D

    cols = min(4, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows + 0.5), squeeze=False)
    for ax, (title, summary, key, scale, higher, lrs, _) in zip(axes.flat, panels):
        finite = [s["metrics"][key]["mean"] * scale for s in summary.values()
                  if key and key in s["metrics"] and s["verdict"] != "diverged" and math.isfinite(s["metrics"][key]["mean"])]
        lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
        floor = lo if higher else hi
        for i, norm in enumerate(norms):
            color = NORM_COLORS.get(norm)
            shift = 1.06 ** (i - (len(norms) - 1) / 2)
            xs, ys, open_, div = [], [], [], []
            for lr in lrs:
                s = summary.get((norm, lr))
                if s is None:
                    continue
                m = s["metrics"].get(key) if key else None
                if s["verdict"] == "diverged":
                    div.append(lr * shift)
                elif m is not None and math.isfinite(m["mean"]):
                    xs.append(lr * shift)
                    ys.append(m["mean"] * scale)
                    if s["verdict"] != "converged":
                        open_.append((lr * shift, m["mean"] * scale))
            ax.plot(xs, ys, color=color, marker="o", ms=4, lw=1.6, label=norm)
            if open_:
                ax.plot(*zip(*open_), ls="none", marker="o", ms=7, mfc="white", mec=color, mew=1.5)
            if div:
                ax.plot(div, [floor] * len(div), ls="none", marker="x", ms=9, mew=2.2, color=color)
        ax.set_xscale("log")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("peak learning rate")
        ax.set_ylabel((key or "metric").split("/")[-1] + ("" if higher else " (lower is better)"), fontsize=8)
        ax.grid(alpha=0.3, which="both")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    handles = [Line2D([], [], color=NORM_COLORS.get(n), marker="o", label=n) for n in norms]
    handles += [Line2D([], [], ls="none", marker="o", mfc="white", mec="grey", mew=1.5, label="not converged"),
                Line2D([], [], ls="none", marker="x", color="grey", mew=2.2, label="diverged")]
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
