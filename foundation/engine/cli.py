"""``foundation train | eval | plot``: argument parsing around loop.train / loop.evaluate / plot."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from foundation.checkpoint import CheckpointError
from foundation.config import ConfigError

EXAMPLES = """\
examples:
  foundation train configs/seq2seq/tiny.yaml
  foundation train configs/seq2seq/tiny.yaml optim.lr=1e-3 train.steps=50 run_name=short
  foundation train configs/seq2seq/tiny.yaml --resume          (or resume=true)
  torchrun --nproc_per_node 2 -m foundation.cli train configs/seq2seq/tiny.yaml
"""


def _main_rank() -> bool:
    return int(os.environ.get("RANK", 0)) == 0


def _fail(prog: str, err: Exception) -> int:
    print(f"{prog}: error: {err}", file=sys.stderr)
    return 2


def train_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="foundation train", formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="Train the tasks a YAML config lists; the run goes to "
                                            "<output_dir>/<run_name> (default checkpoints/<config name>).",
                                epilog=EXAMPLES)
    p.add_argument("config", help="YAML config (see configs/)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. optim.lr=1e-3")
    p.add_argument("--resume", action="store_true", help="continue the run from its last checkpoint (= resume=true)")
    args = p.parse_args(argv)
    from foundation.engine.config import load_config
    from foundation.engine.loop import train

    start = time.perf_counter()
    try:
        cfg, specs = load_config(args.config, args.overrides + (["resume=true"] if args.resume else []))
        result = train(cfg, specs)
    except (ConfigError, CheckpointError, FileNotFoundError) as e:
        return _fail("foundation train", e)
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
    return {"diverged": 1, "interrupted": 130}.get(result.status, 0)


def resolve_checkpoint(path: str | Path) -> Path:
    """A .safetensors file, a checkpoint directory, or a run directory (best/, else last)."""
    path = Path(path)
    if path.is_file():
        return path
    for candidate in (path / "model.safetensors", path / "best" / "model.safetensors"):
        if candidate.is_file():
            return candidate
    from foundation.engine.checkpointing import Checkpointer
    from foundation.engine.distributed import Env

    latest = Checkpointer(path, 1, Env(0, 1, 0, None, False)).latest()
    if latest is None:
        raise FileNotFoundError(f"no model.safetensors in {path} (nor best/ or a checkpoint under ckpt/)")
    return latest / "model.safetensors"


def eval_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="foundation eval",
                                description="Evaluate a checkpoint on every task of a config.",
                                epilog="example: foundation eval configs/seq2seq/tiny.yaml "
                                       "checkpoint=checkpoints/seq2seq-tiny/best/model.safetensors")
    p.add_argument("config")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="checkpoint=PATH (a .safetensors, a checkpoint dir or a run dir; default: the config's run dir)")
    p.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    args = p.parse_args(argv)
    from foundation import checkpoint
    from foundation.engine import distributed
    from foundation.engine.config import load_config
    from foundation.engine.loop import evaluate
    from foundation.engine.model import ModelConfig, MultiTaskModel

    try:
        cfg, specs = load_config(args.config, args.overrides)
        path = resolve_checkpoint(cfg.checkpoint or cfg.run_dir)
        env = distributed.setup(cfg.device)
        try:
            model = MultiTaskModel(ModelConfig.from_specs(cfg.backbone, specs))
            checkpoint.load_state_into(model, path)
            metrics = evaluate(model.to(env.device), specs, cfg, env)
        finally:
            distributed.teardown(env)
    except (ConfigError, CheckpointError, FileNotFoundError) as e:
        return _fail("foundation eval", e)
    if _main_rank():
        if args.json:
            print(json.dumps({"checkpoint": str(path), **metrics}))
        else:
            print(f"{path}:")
            for k, v in metrics.items():
                print(f"  {k:<28} {v:.4f}")
    return 0


def plot_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="foundation plot", description="Draw a run's curves to RUN_DIR/curves.png.")
    p.add_argument("run_dir")
    p.add_argument("--out", help="PNG path (default RUN_DIR/curves.png)")
    args = p.parse_args(argv)
    from foundation.engine.plot import plot_run

    try:
        out = plot_run(args.run_dir, args.out)
    except (FileNotFoundError, ValueError) as e:
        return _fail("foundation plot", e)
    print(out)
    return 0
