"""benchmarks/paper_sizes.py: each paper-size config, shrunk (--tiny), runs through `foundation train` on
the data the benchmark generates in its task's layout, and its row has a finite loss and a throughput."""
from __future__ import annotations

import importlib.util
import json
import math

from support import load_benchmark

# what each config's task imports beyond the core (the tasks' require_extra lines)
EXTRAS = {"upernet": ("mmseg", "mmengine", "mmcv"),
          "asr_18l": ("espnet2", "torchaudio", "sentencepiece", "editdistance", "soundfile"),
          "vl_pretrain": ("open_clip", "sentencepiece")}


def test_every_config_runs_tiny_on_cpu(tmp_path, monkeypatch, capsys):
    bench = load_benchmark("paper_sizes")
    names = [n for n in bench.NAMES if all(importlib.util.find_spec(m) for m in EXTRAS.get(n, ()))]
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the runs are subprocesses: tiny models, one thread
    assert bench.main(["--tiny", "--device", "cpu", "--out", str(tmp_path), "--only", *names]) == 0
    rows = json.loads((tmp_path / "paper_sizes.json").read_text())["rows"]
    assert [r["name"] for r in rows] == names
    for r in rows:
        assert r["status"] == "finished" and r["steps"] == 3 and r["batch"] == 2, r
        assert math.isfinite(r["loss_first"]) and math.isfinite(r["loss_last"]), r
        assert r["samples_per_s"] > 0 and r["mem_gib"] is None, r  # no CUDA: no peak memory
    if "asr_18l" in names:  # equal-length utterances: every bucket holds --batch of them
        assert next(r for r in rows if r["name"] == "asr_18l")["note"] == "2 utterances a bucket"
    table = (tmp_path / "paper_sizes.md").read_text()
    assert all(f"| {n} | finished | 3 | 2 |" in table for n in names)
    assert table.split("\n\n", 1)[1] in capsys.readouterr().out  # the same table, printed


def test_read_run_skips_warmup_and_takes_the_peak_memory(tmp_path):
    bench = load_benchmark("paper_sizes")
    records = [{"step": s, "loss": 10.0 - s, "samples_per_s": 1.0 if s <= 5 else 100.0 + s, "mem_gib": 0.1 * s}
               for s in range(1, 11)]
    records.insert(3, {"step": 3, "event": "nonfinite"})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "status.json").write_text(json.dumps({"status": "finished", "message": "finished at step 10"}))
    out = bench.read_run(tmp_path)
    assert out["status"] == "finished" and out["steps"] == 10
    assert out["samples_per_s"] == 108.0  # median of steps 6..10
    assert (out["loss_first"], out["loss_last"], out["loss_fell"]) == (8.0, 1.0, True)
    assert out["mem_gib"] == 1.0


def test_a_deadline_skips_the_configs_left(tmp_path, capsys):
    bench = load_benchmark("paper_sizes")
    assert bench.main(["--tiny", "--deadline", "0", "--out", str(tmp_path), "--batch", "asr_18l=4"]) == 0
    rows = json.loads((tmp_path / "paper_sizes.json").read_text())["rows"]
    assert [r["status"] for r in rows] == ["not run: deadline"] * len(bench.NAMES)
    assert [r["batch"] for r in rows if r["name"] == "asr_18l"] == [4]
    assert not (tmp_path / "runs").exists()
