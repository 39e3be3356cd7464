"""``foundation plot RUN_DIR``: loss, lr and evaluation curves from metrics.jsonl to PNG."""
from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: is {run_dir} a run directory?")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    data = series(records)
    per_task = [k for k in data if k.startswith("loss/")]
    losses = [k for k in data if k == "loss"] + (per_task if len(per_task) > 1 else [])
    evals = sorted(k for k in data if k.startswith("eval/"))
    events = [r for r in records if r.get("event") in ("nonfinite", "diverged", "resume")]
    panels = [("training loss", losses, True), ("learning rate", ["lr"] if "lr" in data else [], False),
              ("gradient norm (before clipping)", ["grad_norm"] if "grad_norm" in data else [], True)]
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
            ax.axvline(e["step"], color={"resume": "grey"}.get(e["event"], "red"), lw=0.6, ls=":")
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
