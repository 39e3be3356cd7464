"""``foundation compare depth``: DeepNet's "convergence with varying depth" in miniature.

    foundation compare depth [--norms ...] [--depths 6,18,50,100] [--steps N] [--out DIR] [key=value ...]
    foundation compare depth --thousand [--steps N] [--out DIR]

Each (norm, depth, seed) is a ``foundation compare`` run (``studies.compare.Runner``) of one
recipe - DeepNet's 64-128-2 encoder-decoder on sequence reversal, written to OUT/config.yaml -
with ``backbone.norm=``, ``seed=``, ``backbone.depth=`` and ``backbone.decoder_depth=`` set:

    OUT/report.md, results.json   final metric and loss per norm and depth, every run's outcome
    OUT/curves.png                training loss and the primary metric against step, per depth
    OUT/depth.png                 final metric and loss against depth, one line per norm
    OUT/thousand.png              (--thousand) training loss and evaluation metrics against step
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Optional, Sequence

from foundation.config import ConfigError
from studies.compare import OWNED, Runner, check_overrides, common_flags, exclusive, norm_overrides, parse_ints, \
    parse_norms, parse_seeds, rules_from_args
from studies.plots import plot_curves, plot_depth, plot_training
from studies.report import depth_table, metrics_table, runs_table, write_json
from studies.verdict import Rules, RunSpec, summarize

NORMS = ("postln", "preln", "deepnorm", "magneto")
DEPTHS = (6, 18, 50, 100)


def depth_grid(norms: Sequence[str], depths: Sequence[int], seeds: Sequence[int], lr: float) -> list[RunSpec]:
    return [RunSpec(f"{norm}_{depth}L_seed{seed}", norm, seed, lr, depth,
                    overrides=[*norm_overrides(norm), f"seed={seed}", f"backbone.depth={depth}",
                               f"backbone.decoder_depth={depth}"])
            for norm in norms for depth in depths for seed in seeds]



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
    "log": {"progress": False, "writers": ["jsonl"]},
}
# 500L-500L: half the batch (a step costs ~5x a 100L-100L one) and a third of the lr: at 3e-3
# DeepNorm's 1000-layer model stalls at the token-frequency plateau (Magneto's trains)
THOUSAND = {"norms": ("deepnorm", "magneto"), "depth": 500, "steps": 100, "batch_size": 32, "lr": 1e-3}

EXAMPLES = """\
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


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(
        prog="foundation compare depth", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES,
        description="DeepNet's 'convergence with varying depth' in miniature: the seq2seq reversal task with an "
                    "NL-NL encoder-decoder for each norm and depth, a fixed number of steps; plots the final "
                    "metric and loss against depth (OUT/depth.png) and writes OUT/report.md.")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="dotted overrides of the recipe for every run, e.g. backbone.dim=32 tasks.0.problem=sort")
    p.add_argument("--norms", default=None, help="comma-separated rules or presets (foundation_ln, upscale_ln) "
                                                 "(default postln,preln,deepnorm,magneto; --thousand: deepnorm,magneto)")
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
    common_flags(p)
    args = p.parse_intermixed_args(argv)
    try:
        norms = parse_norms(args.norms or ",".join(THOUSAND["norms"] if args.thousand else NORMS))
        if args.thousand and args.depths:
            raise ValueError("--thousand trains 500L-500L models; leave out --depths")
        depths = [THOUSAND["depth"]] if args.thousand else sorted(parse_ints(args.depths, "--depths")) if args.depths \
            else list(DEPTHS)
        if min(depths) < 1:
            raise ValueError(f"--depths: depths must be >= 1 (got {min(depths)})")
        steps = args.steps if args.steps is not None else THOUSAND["steps"] if args.thousand else DEPTH_RECIPE["train"]["steps"]
        if steps < 1:
            raise ValueError(f"--steps must be >= 1 (got {steps})")
        lr = args.lr if args.lr is not None else THOUSAND["lr"] if args.thousand else DEPTH_RECIPE["optim"]["lr"]
        if not (lr > 0 and math.isfinite(lr)):
            raise ValueError(f"--lr must be a positive number (got {lr})")
        seeds = parse_seeds(args.seeds, 0)
        check_overrides(args.overrides, OWNED + ("backbone.depth", "backbone.decoder_depth"))
        rules = rules_from_args(args)
    except ValueError as e:
        print(f"foundation compare depth: error: {e}", file=sys.stderr)
        return 2
    out = args.out or Path("runs") / ("compare-thousand" if args.thousand else "compare-depth")
    command = "foundation compare depth " + " ".join(argv)
    return exclusive(out, "foundation compare depth", lambda: depth_compare(
        out, norms, depths, seeds, steps, lr, args.overrides, command=command, thousand=args.thousand,
        in_process=args.in_process, overwrite=args.overwrite, rules=rules))


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
    outcomes = runner.run(specs)
    if outcomes is None:
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
        "rule": rules.as_dict(),
        "summary": [{"norm": n, "depth": d, **s} for (n, d), s in summary.items()],
        "runs": [asdict(o) for o in outcomes],
    }
    write_json(out / "results.json", results)
