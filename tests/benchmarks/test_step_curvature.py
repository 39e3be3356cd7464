"""benchmarks/step_curvature.py: the loss along each optimizer step, measured without changing the run."""
from __future__ import annotations

import json
import math

import pytest
from support import load_benchmark

from foundation.engine.config import load_config
from foundation.engine.loop import train

SMALL = ["backbone.depth=1", "train.steps=8", "train.batch_size=8", "tasks.seq2seq.train_size=64",
         "tasks.seq2seq.eval_size=16", "eval.every=0", "save.every=0", "log.every=1", "log.progress=false",
         "log.writers=[jsonl]"]


@pytest.mark.usefixtures("one_thread")
def test_the_parabola_through_each_step_and_the_run_unchanged(tmp_path, capsys):
    cfg, specs = load_config("configs/seq2seq/tiny.yaml", [*SMALL, f"output_dir={tmp_path / 'plain'}", "run_name=r"])
    train(cfg, specs)
    plain = tmp_path / "plain" / "r"
    bench = load_benchmark("step_curvature")
    assert bench.main([str(plain), "--out", str(tmp_path / "curv"), "--every", "2", "--window", "4"]) == 0
    rows = json.loads((tmp_path / "curv" / "r.json").read_text())
    assert [r["step"] for r in rows] == [3, 5, 7]  # every 2nd step after the first (which draws the probe)
    for r in rows:  # L(theta + s D) = L0 + a s + b s^2 through the three measured losses
        assert r["L0"] + r["a"] + r["b"] == pytest.approx(r["L1"], abs=1e-5)
        assert r["L0"] + 2 * r["a"] + 4 * r["b"] == pytest.approx(r["L2"], abs=1e-5)
        assert r["q"] == (r["b"] / -r["a"] if r["a"] < 0 else math.inf)
    losses = [[json.loads(line)["loss"] for line in (d / "metrics.jsonl").open() if '"loss"' in line]
              for d in (plain, tmp_path / "curv" / "r")]
    assert losses[0] == losses[1] and len(losses[0]) == 8  # measuring moved nothing: the same run, bit for bit
    table = (tmp_path / "curv" / "curvature.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| r |"))
    assert row.startswith("| r | finished | - | 1: ") and row in capsys.readouterr().out

    (plain / "config.yaml").unlink()
    with pytest.raises(SystemExit, match="config.yaml not found"):
        bench.main([str(plain), "--out", str(tmp_path / "curv2")])


def test_the_summary_reads_the_steps_a_warning_would_have_had():
    bench = load_benchmark("step_curvature")
    rows = lambda q_of: [{"step": s, "q": q_of(s)} for s in range(2, 101, 2)]  # noqa: E731
    results = [("blows", rows(lambda s: 3.0 if 30 <= s < 50 else 0.5), 70),  # q high over [onset-40, onset-20)
               ("calm", rows(lambda s: 0.8), None), ("early", rows(lambda s: 9.0), 10)]  # onset <= lead: left out
    line, = bench.summary(results, lead=20)
    assert "runs that diverged 3.00 (3.00-3.00, 1)" in line and "did not, over the same steps: 0.80 (0.80-0.80, 1)" in line
