"""``benchmarks/gpu_check.sh`` in its CPU smoke mode: every step of the GPU check runs (the
CUDA tests skip), so the script cannot break unseen between the runs on a GPU machine."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_gpu_check_runs_every_step_on_cpu(tmp_path):
    out = tmp_path / "check"
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["bash", str(REPO / "benchmarks/gpu_check.sh"), str(out), "--device", "cpu", "--tiny",
                           "--paper", "vit_finetune"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    steps = dict(line.split("\t")[:2] for line in (out / "steps.tsv").read_text().splitlines())
    assert steps == {name: "0" for name in ("environment", "gpu_tests", "vitb_eager", "vitb_compiled", "profile",
                                             "rnnt_joint", "speech_eager", "speech_compiled", "paper_sizes")}
    eager = json.loads((out / "vitb_eager.json").read_text())
    assert {r["name"] for r in eager["results"]} >= {"ours preln", "ours magneto", "timm Pre-LN", "timm Sub-LN"}
    compiled = json.loads((out / "vitb_compiled.json").read_text())
    assert compiled["config"]["compile"] and [r["name"] for r in compiled["results"]] == ["ours magneto"]
    assert all(r["median_ms"] > 0 for r in eager["results"] + compiled["results"])
    summary = (out / "summary.md").read_text()
    assert "skipped" in summary and "needs a CUDA device" in summary  # the GPU tests, each skipped without CUDA
    for section in ("## Backbone", "### ViT-B", "### speech", "## Where the Magneto step's time goes", "| eager | 2 |",
                    "## RNN-T joint", "| sub=1 |", "## Paper-size configs",
                    "| vit_finetune | finished |"):
        assert section in summary, section
