"""``foundation compare``: one training recipe under several norms, seeds and learning rates.

    foundation compare CONFIG [--norms preln,magneto] [--seeds 2] [--lrs 1e-3,3e-3] [--out DIR] [key=value ...]

Each (norm, seed, lr) is an ordinary ``foundation train`` run of the config with
``backbone.norm=``, ``seed=`` and ``optim.lr=`` overridden, in its own run directory
``OUT/runs/<name>`` and by default in its own process, so a crash or a divergence ends
that run alone. The engine leaves ``status.json`` in a run directory when the run returns;
a run whose status is ``finished`` or ``diverged`` is not run again, and any other run is
resumed from its last checkpoint, so an interrupted comparison continues where it stopped
(``studies.runs``). Then the report is written from the runs' ``metrics.jsonl``:

    OUT/report.md       final metrics per norm (mean +- std over seeds, per-seed values),
                        convergence per learning rate, and the largest lr that converges
    OUT/results.json    the same, machine-readable, with every run's outcome
    OUT/curves.png      training loss and the primary metric against step, one colour per norm

How a run is judged: ``studies.verdict``. The same runner serves ``foundation compare depth``
(``studies.depth``) and ``foundation compare pretraining`` (``studies.pretraining``).
"""
from __future__ import annotations

import argparse
import math
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from foundation.config import ConfigError
from foundation.engine.failure import EXIT_CODES, RunDirInUse
from studies import runs
from studies.plots import plot_curves
from studies.report import fmt_lr, lr_table, metrics_table, runs_table, write_json
from studies.verdict import SPIKE_WINDOW, Outcome, Rules, RunSpec, describe, judge, largest_converging, summarize

DEFAULT_NORMS = ("preln", "magneto")
REPORT_LOCK = threading.Lock()  # pyplot is not thread-safe: `foundation demo` runs comparisons in threads


def norm_presets() -> dict[str, dict]:
    """The named normalisation presets (foundation.config.PRESETS entries that set a rule:
    foundation_ln, upscale_ln) -> their backbone fields."""
    from foundation.config import PRESETS

    return {name: fields for name, fields in PRESETS.items() if "norm" in fields}


def known_norms() -> list[str]:
    """What --norms accepts: the four rules and the presets built on them."""
    from foundation.scaling import NORMS

    return [*NORMS, *norm_presets()]


def norm_overrides(norm: str) -> list[str]:
    """The one place a --norms name becomes overrides: a rule sets backbone.norm; a preset sets
    its fields (foundation_ln: postln + residual_scale 0.974; upscale_ln: deepnorm + init_gain 1.0)."""
    preset = norm_presets().get(norm)
    if preset is None:
        return [f"backbone.norm={norm}"]
    return [f"backbone.{k}={v}" for k, v in preset.items()]


def run_name(norm: str, lr: float, seed) -> str:
    """A run's directory name under OUT/runs (``seed`` may be the placeholder "{seed}")."""
    return f"{norm}_lr{fmt_lr(lr)}_seed{seed}"


def grid(norms: Sequence[str], seeds: Sequence[int], lrs: Sequence[float] | Mapping[str, float]) -> list[RunSpec]:
    """norm-major, then lr, then seed: the runs of one norm finish together. ``lrs``: the peak lrs
    every norm runs, or one per norm (``config_lrs``: a config that sets ``${by_norm:...}``)."""
    def of(norm: str) -> Sequence[float]:
        return [lrs[norm]] if isinstance(lrs, Mapping) else lrs

    return [RunSpec(run_name(norm, lr, seed), norm, seed, lr,
                    overrides=[*norm_overrides(norm), f"seed={seed}", f"optim.lr={lr!r}"])
            for norm in norms for lr in of(norm) for seed in seeds]


def config_lrs(config, overrides: Sequence[str], norms: Sequence[str], seed: int) -> dict[str, float]:
    """Each norm's peak lr as the config resolves it under that norm: a config may set one per norm
    (``optim.lr: ${by_norm:{magneto: 8.0e-3, preln: 4.0e-3}}``), and a comparison runs each at its own."""
    from foundation.engine.config import load_config

    return {norm: load_config(config, [*per_run(overrides, norm, seed), *norm_overrides(norm)],
                              check_data=False)[0].optim.lr for norm in norms}


def lr_values(lrs: Sequence[float] | Mapping[str, float]) -> list[float]:
    """The distinct peak lrs of a grid, ascending (the report's lr columns)."""
    return sorted(set(lrs.values())) if isinstance(lrs, Mapping) else list(lrs)


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
        return [*per_run(self.user, spec.norm, spec.seed), *spec.overrides, f"output_dir={self.out / 'runs'}",
                f"run_name={spec.name}", "log.progress=false"]

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
                diff = runs.config_mismatch(cfg.run_dir, to_dict(cfg))
                if diff:
                    raise ConfigError(
                        f"{cfg.run_dir} holds a run of another configuration ({', '.join(diff[:6])}"
                        f"{' ...' if len(diff) > 6 else ''} differ); pass --overwrite to replace it or --out "
                        "for another report directory")
        from foundation.engine.config import best_metric

        return best_metric(cfg, task_specs)

    def run(self, specs: Sequence[RunSpec]) -> Optional[list[Outcome]]:
        """Every run's outcome; None, once said, when Ctrl-C ended the comparison."""
        try:
            return [self.one(i, spec, len(specs)) for i, spec in enumerate(specs, 1)]
        except KeyboardInterrupt:
            print("\ninterrupted; the same command resumes the comparison", file=sys.stderr)
            return None

    def one(self, i: int, spec: RunSpec, total: int) -> Outcome:
        """Bring one run to its end (trained, resumed or skipped) and judge it; [i/total] in its messages."""
        run_dir = self.out / "runs" / spec.name
        head = f"[{i}/{total}] {spec.name}"
        start = time.perf_counter()
        try:
            failure = runs.ensure(self.config, self.run_overrides(spec), run_dir, in_process=self.in_process,
                                  overwrite=self.overwrite, say=self.say, head=head)
        except RunDirInUse as e:  # --overwrite of a run another process is training: that run refused
            outcome = Outcome(spec.name, spec.norm, spec.seed, spec.lr, spec.depth, "failed", str(e), run_dir=str(run_dir))
            self.say(f"{head}: {describe(outcome)}")
            return outcome
        if failure is not None:
            self.trained += 1
            self.seconds += time.perf_counter() - start
        outcome = judge(spec, run_dir, self.rules, failure or "")
        self.say(f"{head}: {describe(outcome)}")
        return outcome


# ---------------------------------------------------------------------------- argument parsing


def parse_norms(text: str) -> list[str]:
    known = known_norms()
    norms = [t.strip() for t in text.split(",") if t.strip()]
    if not norms:
        raise ValueError("--norms: give at least one norm")
    for n in norms:
        if n not in known:
            raise ValueError(f"--norms: unknown norm {n!r}; known: {', '.join(known)}")
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


def per_run(overrides: Sequence[str], norm: str, seed: int) -> list[str]:
    """``{norm}`` and ``{seed}`` in an override become the run's, e.g. to start each run from the
    same norm and seed of another comparison: ``init_from=runs/compare-vqa/runs/{norm}_lr0.001_seed{seed}/best/model.safetensors``."""
    return [o.replace("{norm}", norm).replace("{seed}", str(seed)) for o in overrides]


def check_overrides(overrides: Sequence[str], owned: Sequence[str]) -> None:
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
  foundation compare configs/vision/tiny_finetune.yaml --seeds 2 train.steps=100
  foundation compare configs/vl/tiny_nlvr2.yaml --seeds 2 \
      init_from=runs/compare-vqa/runs/{norm}_lr0.001_seed{seed}/best/model.safetensors   # {norm}, {seed}: each run's
  foundation compare depth                                              # DeepNet's depth figure in miniature
  foundation compare depth --thousand                                   # 500L-500L, deepnorm and magneto
  foundation compare pretraining --seeds 2                              # cross-modal vs own-modality pretraining

Re-running the same command skips finished runs and resumes unfinished ones.
Run directories: OUT/runs/<norm>_lr<lr>_seed<seed> (standard `foundation train` runs: metrics.jsonl,
status.json, train.log, checkpoints). Report: OUT/report.md, OUT/results.json, OUT/curves.png.
"""


def common_flags(p: argparse.ArgumentParser) -> None:
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


def rules_from_args(args: argparse.Namespace) -> Rules:
    if args.explode_factor < 0 or (args.explode_factor and args.explode_factor <= 1):
        raise ValueError(f"--explode-factor must be > 1, or 0 to switch the rule off (got {args.explode_factor:g})")
    if not 0 < args.converge_ratio <= 1:
        raise ValueError(f"--converge-ratio must be in (0, 1] (got {args.converge_ratio:g})")
    return Rules(args.explode_factor, args.converge_ratio)


def main(argv: Sequence[str]) -> int:
    argv = list(argv)
    p = argparse.ArgumentParser(
        prog="foundation compare", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES,
        description="Train one recipe (a `foundation train` config) under several norms, seeds and learning "
                    "rates, each its own run, and write a report: final metrics per norm (mean ± std over "
                    "seeds), convergence per learning rate and the curves. "
                    "`foundation compare depth --help`: the depth-stability sweep; `foundation compare pretraining "
                    "--help`: cross-modal against single-modality pretraining per task.")
    p.add_argument("config", help="a `foundation train` YAML config (see configs/)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides for every run, e.g. train.steps=200")
    p.add_argument("--norms", default=",".join(DEFAULT_NORMS),
                   help="comma-separated rules (postln, preln, deepnorm, magneto) or presets (foundation_ln, "
                        "upscale_ln) (default preln,magneto)")
    p.add_argument("--seeds", default="1", help="a count (from the config's seed) or a comma-separated list (default 1)")
    p.add_argument("--lrs", default=None, help="comma-separated peak learning rates (default: the config's optim.lr under each norm)")
    p.add_argument("--out", type=Path, default=None, help="report directory (default runs/compare-<config name>)")
    common_flags(p)
    args = p.parse_intermixed_args(argv)
    from foundation.engine.config import load_config

    try:
        norms = parse_norms(args.norms)
        check_overrides(args.overrides, OWNED)
        plain = [o for o in args.overrides if "{norm}" not in o and "{seed}" not in o]
        seeds = parse_seeds(args.seeds, load_config(args.config, plain, check_data=False)[0].seed)
        load_config(args.config, per_run(args.overrides, norms[0], seeds[0]))  # a bad path or override fails here, named
        lrs = parse_floats(args.lrs) if args.lrs is not None else config_lrs(args.config, args.overrides, norms, seeds[0])
        rules = rules_from_args(args)
    except (ValueError, ConfigError) as e:
        print(f"foundation compare: error: {e}", file=sys.stderr)
        return 2
    out = args.out or Path("runs") / f"compare-{Path(args.config).stem}"
    command = "foundation compare " + " ".join(argv)
    return exclusive(out, "foundation compare", lambda: compare(
        Path(args.config), out, norms, seeds, lrs, args.overrides, command=command, in_process=args.in_process,
        overwrite=args.overwrite, rules=rules))


def exclusive(out: Path, prog: str, study: Callable[[], int]) -> int:
    """``study()`` (its exit code) while this process owns the output folder ``out``: a second
    invocation into it is refused in one line (exit 5), so that two never run, and judge, the same runs."""
    try:
        with runs.owned(out):
            return study()
    except RunDirInUse as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return EXIT_CODES["locked"]


def compare(config: Path, out: Path, norms: Sequence[str], seeds: Sequence[int], lrs: Sequence[float] | Mapping[str, float],
            overrides: Sequence[str] = (), *, command: str = "", in_process: bool = False, overwrite: bool = False,
            rules: Rules = Rules(), say: Callable[[str], None] = print) -> int:
    specs = grid(norms, seeds, lrs)
    lr_text = (f"the config's lr per norm: {', '.join(f'{n} {fmt_lr(lr)}' for n, lr in lrs.items())}"
               if isinstance(lrs, Mapping) else f"{len(lrs)} lrs")
    lrs = lr_values(lrs)
    runner = Runner(config, out, overrides, in_process=in_process, overwrite=overwrite, rules=rules, say=say)
    try:
        primary, higher = runner.check(specs)
    except ConfigError as e:
        print(f"foundation compare: error: {e}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    say(f"{len(specs)} runs ({len(norms)} norms x {lr_text} x {len(seeds)} seeds) -> {out}/runs")
    outcomes = runner.run(specs)
    if outcomes is None:
        return 130
    with REPORT_LOCK:
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
        "rule": rules.as_dict(),
        "largest_converging_lr": largest_converging(summary, norms),
        "summary": [{"norm": n, "lr": lr, **s} for (n, lr), s in summary.items()],
        "runs": [asdict(o) for o in outcomes],
    }
    write_json(out / "results.json", results)
    plot_curves(outcomes, out / "curves.png", primary, lambda o: o.lr, lambda lr: f"lr {fmt_lr(lr)}",
                title=f"{config.name}: " + ", ".join(norms))


