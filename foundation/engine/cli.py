"""``foundation train | eval``: argument parsing around loop.train / loop.evaluate."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

EXAMPLES = """\
examples:
  foundation train configs/seq2seq/tiny.yaml
  foundation train configs/seq2seq/tiny.yaml optim.lr=1e-3 train.steps=50 run_name=short
  foundation train configs/seq2seq/tiny.yaml --resume          (or resume=true)
  foundation train configs/seq2seq/tiny.yaml --resume optim.lr=5e-4 --allow-change optim.lr

exit codes: 0 finished or stopped, 1 diverged, 2 config, 3 data, 4 checkpoint, 5 run directory
in use, 6 disk full, 7 other write error, 70 internal error (a bug), 130 interrupted
  torchrun --nproc_per_node 2 --no-python foundation train configs/seq2seq/tiny.yaml
"""


def _main_rank() -> bool:
    return int(os.environ.get("RANK", 0)) == 0


def _fail(prog: str, err: Exception, debug: bool = False, run_dir: Path | None = None) -> int:
    """One line on stderr (the traceback too with ``debug``); the failure class's exit code."""
    from foundation.engine.failure import classify
    from foundation.engine.rundir import ERROR_LOG

    kind, code, message = classify(err)
    if debug:
        traceback.print_exception(err)
    elif kind == "internal":
        log = run_dir / ERROR_LOG if run_dir is not None and (run_dir / ERROR_LOG).is_file() else None
        message += f" (a bug; the traceback: {log if log else 'run again with --debug'})"
    print(f"{prog}: {'internal ' if kind == 'internal' else ''}error: {message}", file=sys.stderr)
    return code


def train_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="foundation train", formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="Train the tasks a YAML config lists; the run goes to "
                                            "<output_dir>/<run_name> (default checkpoints/<config name>).",
                                epilog=EXAMPLES)
    p.add_argument("config", help="YAML config (see configs/)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. optim.lr=1e-3")
    p.add_argument("--resume", action="store_true", help="continue the run from its last checkpoint (= resume=true)")
    p.add_argument("--allow-change", action="append", default=[], metavar="KEY",
                   help="on resume, accept a field that differs from the run's config.yaml (e.g. optim.lr; "
                        "a section such as optim accepts its fields); repeat for several")
    p.add_argument("--debug", action="store_true", help="print the full traceback of a failure")
    args = p.parse_intermixed_args(argv)  # options before, between or after the key=value pairs
    from foundation.engine.config import load_config
    from foundation.engine.loop import train

    start = time.perf_counter()
    cfg = None
    extra = (["resume=true"] if args.resume else []) + (
        [f"allow_change=[{','.join(args.allow_change)}]"] if args.allow_change else [])
    try:
        cfg, specs = load_config(args.config, args.overrides + extra)
        result = train(cfg, specs)
    except Exception as e:  # noqa: BLE001 - every failure: one line and its class's exit code
        return _fail("foundation train", e, args.debug, cfg.run_dir if cfg is not None else None)
    if _main_rank():
        elapsed = time.perf_counter() - start
        skipped = f", {result.nonfinite_total} non-finite steps skipped" if result.nonfinite_total else ""
        print(f"\n{result.message} ({elapsed:.1f} s{skipped})",
              file=sys.stderr if result.status in ("diverged", "interrupted") else sys.stdout)
        for k, v in result.metrics.items():
            print(f"  {k:<28} {v:.4f}")
        if result.best_value is not None:
            print(f"  best {result.best_key} {result.best_value:.4f} at step {result.best_step}: "
                  f"{result.run_dir / 'best' / 'model.safetensors'}")
        print(f"  run directory: {result.run_dir}  (last checkpoint: {result.last_checkpoint})")
        print(f"  curves: foundation plot {result.run_dir}")
    from foundation.engine.failure import EXIT_CODES

    return EXIT_CODES.get(result.status, 0)


def eval_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="foundation eval",
                                description="Evaluate a checkpoint on every task of a config.",
                                epilog="example: foundation eval configs/seq2seq/tiny.yaml "
                                       "checkpoint=checkpoints/seq2seq-tiny/best/model.safetensors")
    p.add_argument("config")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="checkpoint=PATH (a .safetensors, a checkpoint dir or a run dir; default: the config's run dir)")
    p.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    p.add_argument("--debug", action="store_true", help="print the full traceback of a failure")
    args = p.parse_intermixed_args(argv)  # options before, between or after the key=value pairs
    from foundation import checkpoint
    from foundation.engine import distributed
    from foundation.engine.config import load_config
    from foundation.engine.evaluation import evaluate
    from foundation.engine.model import ModelConfig, MultiTaskModel
    from foundation.engine.run_state import model_file

    try:
        cfg, specs = load_config(args.config, args.overrides)
        path = model_file(cfg.checkpoint or cfg.run_dir)
        env = distributed.setup(cfg.device)
        try:
            model = MultiTaskModel(ModelConfig.from_specs(cfg.backbone, specs))
            checkpoint.load_state_into(model, path)
            metrics = evaluate(model.to(env.device), specs, cfg, env)
        finally:
            distributed.teardown(env)
    except Exception as e:  # noqa: BLE001
        return _fail("foundation eval", e, args.debug)
    if _main_rank():
        if args.json:
            print(json.dumps({"checkpoint": str(path), **metrics}))
        else:
            print(f"{path}:")
            for k, v in metrics.items():
                print(f"  {k:<28} {v:.4f}")
    return 0

