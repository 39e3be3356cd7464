"""The report of ``foundation compare stability`` (studies.stability): per task and depth a
learning-rate table (the final metric, or 'diverged at step N', per rule and lr), the largest lr
that converges and the best metric of the ladder; OUT/results.json; OUT/stability.png."""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Optional, Sequence

from studies.plots import plot_ladder
from studies.report import fmt_lr, norm_table, runs_table, verdict_text, write_json
from studies.verdict import Outcome, Rules, largest_converging, summarize


def metric_key(outcomes: Sequence[Outcome], metric: str) -> Optional[str]:
    """The ``task_id/metric`` key of the recipe's metric in the runs' evaluations."""
    keys = {k for o in outcomes for k in o.metrics if k.split("/")[-1] == metric}
    return sorted(keys)[0] if keys else None


def cell_text(s: dict, key: Optional[str], scale: float) -> str:
    """'87.5 ± 1.2' (seed mean ± std, x scale); 'diverged at step N'; '... (not converged)'."""
    if s["verdict"] in ("diverged", "failed", "incomplete"):
        return verdict_text(s)
    m = s["metrics"].get(key) if key else None
    if m is None or not math.isfinite(m["mean"]):
        return verdict_text(s)
    text = f"{m['mean'] * scale:.1f}" + (f" ± {m['std'] * scale:.1f}" if len(s["seeds"]) > 1 else "")
    return text if s["verdict"] == "converged" else f"{text} ({verdict_text(s)})"


def best_of(summary: dict, norm: str, key: Optional[str], higher: bool) -> Optional[tuple[float, float]]:
    """(metric mean, lr) of the rule's best setting that did not diverge, or None."""
    cells = [(s["metrics"][key]["mean"], lr) for (n, lr), s in summary.items()
             if key and n == norm and s["verdict"] not in ("diverged", "failed", "incomplete")
             and key in s["metrics"] and math.isfinite(s["metrics"][key]["mean"])]
    if not cells:
        return None
    return max(cells) if higher else min(cells, key=lambda c: (c[0], -c[1]))


def lr_ladder_table(summary: dict, norms: Sequence[str], lrs: Sequence[float], key: Optional[str], scale: float,
                    higher: bool) -> str:
    stable = largest_converging(summary, norms)

    def last(norm: str) -> str:
        best = best_of(summary, norm, key, higher)
        top = fmt_lr(stable[norm]) if stable[norm] is not None else "none"
        return f"{top} | " + (f"{best[0] * scale:.1f} (lr {fmt_lr(best[1])})" if best else "-")

    return norm_table(summary, norms, lrs,
                      ["rule", *(f"lr {fmt_lr(lr)}" for lr in lrs), "largest lr that converges", "best over the ladder"],
                      "|---|" + "---:|" * len(lrs) + "---:|---:|", lambda s: cell_text(s, key, scale), last)


def write_report(out: Path, plans, outcomes: dict[tuple[str, int], list[Outcome]], norms: Sequence[str],
                 seeds: Sequence[int], rules: Rules, command: str, wall: float) -> None:
    out.mkdir(parents=True, exist_ok=True)
    all_runs = [o for v in outcomes.values() for o in v]
    trained = [o.wall_s for o in all_runs if o.wall_s is not None]
    parts = [
        "# Learning-rate stability at depth",
        "",
        f"`{command.strip()}`",
        "",
        f"{len(all_runs)} runs: rules {', '.join(norms)}; seeds {', '.join(map(str, seeds))}. This invocation took "
        f"{wall / 60:.1f} min of wall time; the runs' training time (first to last metrics record, all runs) adds up "
        f"to {sum(trained) / 60:.1f} min.",
        "",
        "Each cell: the final metric of the run (mean ± std over seeds), or `diverged at step N` (the first step "
        "of the first seed that diverged). 'largest lr that converges': every seed converged there. "
        "'best over the ladder': the best metric of a setting that did not diverge.",
        "",
        "Rule: " + rules.text(),
        "",
        "![metric against learning rate](stability.png)",
        "",
    ]
    panels, results = [], []
    for plan in plans:
        r = plan.recipe
        for depth in plan.depths:
            runs = outcomes.get((r.task, depth), [])
            if not runs:
                continue
            runner = plan.runners.get(depth)
            higher = getattr(runner, "higher", True)
            key = metric_key(runs, r.stability_metric or r.metric)
            summary = summarize(runs, lambda o: (o.norm, o.lr))
            times = [o.wall_s for o in runs if o.wall_s is not None]
            per_run = f"{statistics.fmean(times):.0f} s" if times else "-"
            title = (f"{(r.label or r.task).split(' (')[0]} (held-out {r.stability_metric}, "
                     f"{'higher' if higher else 'lower'} is better)" if r.stability_metric else r.label)
            parts += [f"## {title or r.task}, {depth} layers", "",
                      f"`{plan.config}` made deep and narrow: {depth} layers, {plan.about}. Metric `{key or r.metric}` "
                      f"x {r.scale:g} ({'higher' if higher else 'lower'} is better). Training time per run "
                      f"(mean): {per_run}.", "",
                      lr_ladder_table(summary, norms, plan.lrs, key, r.scale, higher), ""]
            panels.append((f"{r.task} {depth}L", summary, key, r.scale, higher, plan.lrs, depth))
            results.append({"task": r.task, "depth": depth, "metric": key, "scale": r.scale, "higher_is_better": higher,
                            "config": str(plan.config), "overrides": plan.overrides, "lrs": plan.lrs,
                            "steps": plan.steps, "about": plan.about,
                            "largest_converging_lr": largest_converging(summary, norms),
                            "best": {n: best_of(summary, n, key, higher) for n in norms},
                            "summary": [{"norm": n, "lr": lr, **s} for (n, lr), s in summary.items()]})
    parts += ["## Runs", "", runs_table(all_runs), ""]
    (out / "report.md").write_text("\n".join(parts))
    write_json(out / "results.json", {"command": command.strip(), "norms": list(norms), "seeds": list(seeds),
                                      "rule": rules.as_dict(), "wall_s": wall, "tasks": results,
                                      "runs": [asdict(o) for o in all_runs]})
    if panels:
        plot_ladder(panels, norms, out / "stability.png")
