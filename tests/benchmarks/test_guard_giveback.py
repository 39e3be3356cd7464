"""benchmarks/guard_giveback.py replays the engine's giveback rule on logged losses: it fires in a
run that learnt and lost it, not in a healthy one, and starts a new level at a task's new phase."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from support import load_benchmark

guard_giveback = load_benchmark("guard_giveback")


def write_run(path: Path, losses, phase_at=None) -> Path:
    path.mkdir(parents=True)
    with open(path / "metrics.jsonl", "w") as f:
        for step, loss in enumerate(losses, 1):
            record = {"step": step, "loss": float(loss)}
            if phase_at is not None:
                record["asr/phase"] = float(step >= phase_at)
            f.write(json.dumps(record) + "\n")
    (path / "status.json").write_text(json.dumps({"status": "finished"}))
    return path


def test_fires_in_a_collapse_not_in_progress_nor_at_a_new_phase(tmp_path, capsys):
    down = np.linspace(3.0, 1.0, 80)
    collapse = write_run(tmp_path / "collapse", np.concatenate([down, np.full(20, 1.0), 1.02 ** np.arange(1, 61)]))
    healthy = write_run(tmp_path / "healthy", np.linspace(3.0, 0.5, 300) * np.random.default_rng(0).uniform(0.8, 1.2, 300))
    # a second loss joins at step 101: the total jumps, as the ASR head's transducer loss does at rnnt_start
    phased = write_run(tmp_path / "phased", np.concatenate([down, np.full(20, 1.0), np.full(100, 5.0)]), phase_at=101)
    status, n, fired = guard_giveback.replay(collapse, 0.5, 30)
    assert status == "finished" and n == 160 and len(fired) == 1 and 100 < fired[0][0] < 160
    assert guard_giveback.replay(healthy, 0.5, 30)[2] == []
    assert guard_giveback.replay(phased, 0.5, 30)[2] == []
    assert guard_giveback.main([str(tmp_path / "*")]) == 0
    assert "fired in 1 of 3 runs" in capsys.readouterr().out
