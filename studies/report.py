"""The markdown tables and the results.json of the comparisons (compare, depth, pretraining)."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from studies.verdict import Outcome, largest_converging


def fmt_lr(lr: float) -> str:
    return f"{lr:g}"


def fmt(v: Optional[float]) -> str:
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
    text = fmt(stat["mean"])
    if len(values) > 1:
        text += f" ± {fmt(stat['std'])} (" + ", ".join("div" if v is None else fmt(v) for v in values) + ")"
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


def norm_table(summary: dict, norms: Sequence[str], columns: Sequence, header: list[str], align: str,
               text: Callable[[dict], str], last: Optional[Callable[[str], str]] = None) -> str:
    """One row per norm, one cell per column value (lr or depth): ``text`` of that setting's
    summary, '-' where it was not run; ``last(norm)``, if given, an extra final cell."""
    lines = ["| " + " | ".join(header) + " |", align]
    for norm in norms:
        cells = [norm] + [text(summary[norm, c]) if (norm, c) in summary else "-" for c in columns]
        if last is not None:
            cells.append(last(norm))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def lr_table(summary: dict, norms: Sequence[str], lrs: Sequence[float], primary: str) -> str:
    best = largest_converging(summary, norms)

    def text(s: dict) -> str:
        if s["verdict"] != "converged":
            return verdict_text(s)
        return f"converged ({primary.split('/')[-1]} {fmt(s['metrics'][primary]['mean']) if primary in s['metrics'] else '-'})"

    return norm_table(summary, norms, lrs, ["norm", *(f"lr {fmt_lr(lr)}" for lr in lrs), "largest lr that converges"],
                      "|---|" + "---|" * len(lrs) + "---:|", text,
                      lambda norm: fmt_lr(best[norm]) if best[norm] is not None else "none")


def depth_table(summary: dict, norms: Sequence[str], depths: Sequence[int], primary: str) -> str:
    loss_key = primary.split("/")[0] + "/loss"

    def text(s: dict) -> str:
        m, loss = s["metrics"].get(primary), s["metrics"].get(loss_key)
        if s["verdict"] == "diverged" and (m is None or not math.isfinite(m["mean"])):
            return verdict_text(s)
        out = f"{fmt(m['mean'])}" if m else "-"
        if m and len(s["seeds"]) > 1:
            out += f" ± {fmt(m['std'])}"
        if loss and math.isfinite(loss["mean"]):
            out += f" (loss {loss['mean']:.3f})"
        if s["verdict"] != "converged":
            out += f", {verdict_text(s)}"
        return out

    return norm_table(summary, norms, depths, ["norm", *(f"{d}L-{d}L" for d in depths)],
                      "|---|" + "---:|" * len(depths), text)


def runs_table(outcomes: Sequence[Outcome]) -> str:
    lines = ["| run | verdict | steps | first loss | final loss | time (s), first to last record | note |", "|---|---|---:|---:|---:|---:|---|"]
    for o in outcomes:
        lines.append(f"| {o.name} | {o.verdict}{'' if o.diverged_step is None else f' at {o.diverged_step}'} | "
                     f"{o.steps} | {fmt(o.initial_loss)} | {fmt(o.final_loss)} | "
                     f"{'-' if o.wall_s is None else f'{o.wall_s:.0f}'} | {o.reason.replace('|', '/')[:160]} |")
    return "\n".join(lines)


def json_safe(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else str(x)
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


def write_json(path: Path, results: dict) -> None:
    """results.json: non-finite floats as strings (NaN as null), keys as strings."""
    path.write_text(json.dumps(json_safe(results), indent=2) + "\n")
