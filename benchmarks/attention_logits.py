"""Attention-logit growth: does the sharpening of attention announce a divergence?

    python benchmarks/attention_logits.py RUN_DIR [RUN_DIR ...] --out DIR      # e.g. a stability study's runs
    python benchmarks/attention_logits.py runs/guard-warmup/seq2seq/12L/runs/* --out runs/attn --search

Wortsman et al. 2023 ("Small-scale proxies for large-scale Transformer training instabilities")
trace one kind of blow-up at high learning rates to the attention logits q.k / sqrt(d) growing
without bound (what qk-layernorm prevents; Dehghani et al. 2023 saw it in ViT-22B). This
re-trains each run from its ``config.yaml`` (same seed and data order: the measurement draws
nothing and changes nothing) and records, per optimizer step, the largest attention logit
|q.k| / sqrt(head dim) over the attentions of that step's training forward whose input is a
LayerNorm's output (before any relative-position bias or mask; ``AttentionWatch``): what the
stability guard's attention rule (``guard.attention``) reads while training. The rule judged: the logit's growth rate, ln(L_t / L_{t-span})
/ span, above ``--rate`` per step; the guard's model update and the loss do not lead a blow-up
by 20 steps here (``foundation compare guard``, docs/studies.md).

Per run: the study's onset of its divergence (``studies.guard_eval.onset``: the first
non-finite step or loss spike), the rule's first firing and the lead between them. Summary:
the share of diverged runs warned at least ``--lead`` steps ahead, and the runs that did not
diverge in which the rule fired at all. ``--search`` scores a grid of (rate, span) on the same
series; ``--replay`` judges the series an earlier invocation wrote to OUT (any subset of its runs,
e.g. for the figure) without re-training; ``--logged`` judges the series the stability guard
measured while the runs trained (``guard.mode=warn guard.attention=0.2 log.every=1``: ``attention/logit_max`` at every
step) and adds the step at which the guard itself warned. Writes ``OUT/<run>.json`` (the series), ``OUT/attention.md`` and ``OUT/attention.png``.
"""
from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

from rerun import check_runs, parser, rerun_config  # noqa: E402

from studies.guard_eval import RATES, SPANS  # noqa: E402  (the study's grid: one grid for both)


def measure_run(run_dir: Path, out: Path, overrides: list[str]) -> tuple[list[dict], str]:
    """Re-train the run at ``run_dir`` under ``out``; one record a step: step, lr, loss and
    ``logit_max``, the largest |q.k| / sqrt(head dim) of that step's training forward, measured by
    the guard's own ``AttentionWatch``. Returns (records, status)."""
    from foundation.engine import loop
    from foundation.engine.guard import AttentionWatch

    cfg, specs = rerun_config(run_dir, out, overrides)
    rows: list[dict] = []
    watch: list[AttentionWatch] = []
    original_step = loop.Trainer.train_step

    def step(trainer):
        if not watch:
            watch.append(AttentionWatch(trainer.model))
        record = original_step(trainer)
        rows.append({"step": trainer.step, "lr": record.get("lr"), "loss": record.get("loss"),
                     "logit_max": watch[0].take()})
        return record

    loop.Trainer.train_step = step
    try:
        result = loop.train(cfg, specs)
    finally:
        loop.Trainer.train_step = original_step
        if watch:
            watch[0].close()
    return rows, result.status


def logged(run_dir: Path) -> tuple[list[dict], Optional[int]]:
    """The series the guard logged while ``run_dir`` trained, and the step of its first attention
    warning (None if it gave none)."""
    from studies.runs import read_records

    records = read_records(run_dir)
    rows = sorted(({"step": int(r["step"]), "lr": r.get("lr"), "loss": r.get("loss"), "logit_max": r["attention/logit_max"]}
                   for r in records if "attention/logit_max" in r and "event" not in r), key=lambda r: r["step"])
    if not rows:
        raise SystemExit(f"attention_logits: --logged: {run_dir} logged no attention/logit_max (train it with "
                         "guard.mode=warn guard.attention=0.2 log.every=1)")
    warned = [int(r["step"]) for r in records if r.get("event") == "guard" and r.get("signal") == "attention"]
    return rows, min(warned, default=None)


def first_firing(rows: Sequence[dict], rate: float, span: int) -> Optional[int]:
    """The first step at which the guard's rule (``AttentionRule``) at ``rate`` and ``span`` fires:
    the largest logit grew faster than ``rate`` per step (log scale) over the last ``span`` steps;
    None if it never did."""
    from foundation.engine.guard import AttentionRule

    rule = AttentionRule(rate, span)
    for r in sorted(rows, key=lambda r: r["step"]):
        if rule.check(r["step"], r["logit_max"]) is not None:
            return r["step"]
    return None


def score(results: Sequence[tuple[str, list[dict], Optional[int]]], rate: float, span: int, lead: int) -> dict:
    """Diverged runs warned at least ``lead`` steps ahead; the runs that did not diverge in which it fired."""
    leads, fired_calm, calm = [], 0, 0
    for _, rows, at in results:
        fired = first_firing(rows, rate, span)
        if at is None:
            calm += 1
            fired_calm += fired is not None
        else:
            leads.append(at - fired if fired is not None and fired <= at else None)
    early = sum(x is not None and x >= lead for x in leads)
    return {"diverged": len(leads), "warned_early": early, "leads": leads, "calm": calm, "fired_calm": fired_calm}


def plot(results: Sequence[tuple[str, list[dict], Optional[int]]], rate: float, span: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, rows, at in results:
        steps = [r["step"] for r in rows if r["logit_max"] > 0]
        line, = ax.plot(steps, [r["logit_max"] for r in rows if r["logit_max"] > 0], lw=1,
                        ls="-" if at is not None else "--", label=f"{name}" + (f" (onset {at})" if at else ""))
        fired = first_firing(rows, rate, span)
        if fired is not None:
            ax.plot([fired], [next(r["logit_max"] for r in rows if r["step"] == fired)], "o", color=line.get_color())
    ax.set(yscale="log", xlabel="step", ylabel="largest attention logit |q.k|/sqrt(d)",
           title=f"growth above {rate:g}/step over {span} steps: dots")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--rate", type=float, default=0.2, help="growth per step (log scale) that fires (default 0.2)")
    ap.add_argument("--span", type=int, default=4, help="steps the growth is measured over (default 4)")
    ap.add_argument("--lead", type=int, default=20, help="the warning's lead that counts (default 20)")
    ap.add_argument("--search", action="store_true", help=f"also score every rate in {RATES} x span in {SPANS}")
    ap.add_argument("--replay", action="store_true", help="judge the series OUT already holds, without re-training")
    ap.add_argument("--logged", action="store_true", help="judge the series the guard logged in each run, without re-training")
    args = ap.parse_args(argv)
    from studies.guard_eval import onset

    check_runs(args.runs, "attention_logits")
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    lines = ["| run | status | onset | fired | lead | largest logit at steps 1 / 5 / 10 / 20 / 40 |"
             + (" the guard warned |" if args.logged else ""), "|---|---|---:|---:|---:|---|" + ("---:|" if args.logged else "")]
    for run in args.runs:
        saved = args.out / f"{run.name}.json"
        if args.replay:
            if not saved.is_file():
                raise SystemExit(f"attention_logits: --replay: {saved} not found (measure the run first)")
            rows, status = json.loads(saved.read_text()), "replayed"
        elif args.logged:
            rows, warned = logged(run)
            status = "logged"
            saved.write_text(json.dumps(rows) + "\n")
        else:
            rows, status = measure_run(run, args.out, args.overrides)
            saved.write_text(json.dumps(rows) + "\n")
        at = onset(run, None)  # the loss's first spike (or non-finite step), whatever the status (re-trained: the same)
        results.append((run.name, rows, at))
        fired = first_firing(rows, args.rate, args.span)
        lead = at - fired if at is not None and fired is not None and fired <= at else None
        by_step = {r["step"]: r["logit_max"] for r in rows}
        cells = " / ".join(f"{by_step[s]:.3g}" if s in by_step else "-" for s in (1, 5, 10, 20, 40))
        lines.append(f"| {run.name} | {status} | {at if at is not None else '-'} | {fired if fired is not None else '-'} "
                     f"| {lead if lead is not None else '-'} | {cells} |"
                     + (f" {warned if warned is not None else '-'} |" if args.logged else ""))
        print(lines[-1], flush=True)
    settings = list(dict.fromkeys([(args.rate, args.span), *(itertools.product(RATES, SPANS) if args.search else [])]))
    lines += ["", f"| rate / step | span | diverged runs warned >= {args.lead} steps ahead | runs that did not diverge, "
                  "fired in |", "|---:|---:|---:|---:|"]
    for rate, span in settings:
        s = score(results, rate, span, args.lead)
        lines.append(f"| {rate:g} | {span} | {s['warned_early']} of {s['diverged']} | {s['fired_calm']} of {s['calm']} |")
    print("\n".join(lines[-len(settings) - 2:]))
    (args.out / "attention.md").write_text("\n".join(lines) + "\n")
    plot(results, args.rate, args.span, args.out / "attention.png")
    print(f"wrote {args.out / 'attention.md'}, {args.out / 'attention.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
