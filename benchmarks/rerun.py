"""What the benchmarks that measure inside a study's runs share (``step_curvature.py``,
``attention_logits.py``): the run directories named on the command line, each re-trained from
its own ``config.yaml`` (the same seed and data order) with nothing saved, evaluated or guarded."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence


def parser(doc: str) -> argparse.ArgumentParser:
    """The shared arguments: the run directories, ``--out`` and ``--set KEY=VALUE`` (repeatable)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run directories (each with its config.yaml)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every run (repeatable)")
    return ap


def check_runs(runs: Sequence[Path], prog: str) -> None:
    """One clear line for a path that is not a run directory, before anything is trained."""
    for run in runs:
        if not (run / "config.yaml").is_file():
            raise SystemExit(f"{prog}: {run / 'config.yaml'} not found (a run directory is expected)")


def rerun_config(run_dir: Path, out: Path, overrides: Sequence[str]):
    """(config, task specs) of the run at ``run_dir``, re-trained under ``out``."""
    from foundation.engine.config import load_config

    return load_config(run_dir / "config.yaml", [f"output_dir={out}", "log.progress=false", "guard.mode=off",
                                                  "save.every=0", "eval.every=0", "overwrite=true", *overrides])
