"""benchmarks/attention_logits.py: the largest attention logit a step, measured without changing the run."""
from __future__ import annotations

import json
import math

import pytest
import torch
from support import load_benchmark

from foundation.engine.config import load_config
from foundation.engine.loop import train

SMALL = ["backbone.depth=1", "train.steps=8", "train.batch_size=8", "tasks.seq2seq.train_size=64",
         "tasks.seq2seq.eval_size=16", "eval.every=0", "save.every=0", "log.every=1", "log.progress=false",
         "log.writers=[jsonl]"]


@pytest.mark.usefixtures("one_thread")
def test_the_logits_of_each_step_and_the_run_unchanged(tmp_path, capsys, monkeypatch):
    cfg, specs = load_config("configs/seq2seq/tiny.yaml", [*SMALL, f"output_dir={tmp_path / 'plain'}", "run_name=r"])
    train(cfg, specs)
    plain = tmp_path / "plain" / "r"
    bench = load_benchmark("attention_logits")
    from foundation import layers

    seen = []  # every training attention's own largest logit, computed apart from the benchmark's
    original = layers._Heads._attend

    def spy(self, q, k, v, mask, is_causal):
        if torch.is_grad_enabled():
            seen.append(float((q @ k.transpose(-1, -2)).detach().abs().max()) / math.sqrt(q.shape[-1]))
        return original(self, q, k, v, mask, is_causal)

    monkeypatch.setattr(layers._Heads, "_attend", spy)
    assert bench.main([str(plain), "--out", str(tmp_path / "attn"), "--search"]) == 0
    assert layers._Heads._attend is spy  # put back as found
    rows = json.loads((tmp_path / "attn" / "r.json").read_text())
    assert [r["step"] for r in rows] == list(range(1, 9))
    per_step = len(seen) // 8  # the encoder's, the decoder's and the cross attention of each forward
    assert per_step >= 2 and len(seen) == 8 * per_step
    for i, r in enumerate(rows):
        assert r["logit_max"] == pytest.approx(max(seen[i * per_step:(i + 1) * per_step]), rel=1e-5)
    losses = [[json.loads(line)["loss"] for line in (d / "metrics.jsonl").open() if '"loss"' in line]
              for d in (plain, tmp_path / "attn" / "r")]
    assert losses[0] == losses[1] and len(losses[0]) == 8  # measuring moved nothing: the same run, bit for bit
    table = (tmp_path / "attn" / "attention.md").read_text()
    assert "| r | finished | - |" in table and "| 0.2 | 4 | 0 of 0 | " in table and "| 0.4 | 16 |" in table
    assert (tmp_path / "attn" / "attention.png").stat().st_size > 0
    capsys.readouterr()
    assert bench.main([str(plain), "--out", str(tmp_path / "attn"), "--replay"]) == 0  # the saved series, not re-trained
    assert "| r | replayed | - |" in capsys.readouterr().out and len(seen) == 8 * per_step
    (plain / "config.yaml").unlink()
    with pytest.raises(SystemExit, match="config.yaml not found"):
        bench.main([str(plain), "--out", str(tmp_path / "attn2")])


def test_the_rule_fires_on_fast_growth_only():
    bench = load_benchmark("attention_logits")
    rows = lambda f: [{"step": s, "logit_max": f(s)} for s in range(1, 61)]  # noqa: E731
    slow = rows(lambda s: 5.0 * math.exp(0.1 * s))  # 0.1 a step: never above 0.2
    fast = rows(lambda s: 5.0 * math.exp(0.1 * s + (0.3 * (s - 10) if s > 10 else 0.0)))  # 0.4 a step from step 10
    assert bench.first_firing(slow, 0.2, 4) is None
    assert bench.first_firing(fast, 0.2, 4) == 12  # ln(L12 / L8) / 4 = (0.4 + 0.6) / 4 = 0.25; at step 11: 0.175
    results = [("fast", fast, 40), ("late", fast, 20), ("slow", slow, None), ("missed", slow, 30)]
    s = bench.score(results, 0.2, 4, lead=20)
    assert s["leads"] == [28, 8, None] and s["warned_early"] == 1 and s["diverged"] == 3
    assert s["calm"] == 1 and s["fired_calm"] == 0


@pytest.mark.usefixtures("one_thread")
def test_the_guard_logs_what_the_benchmark_measures(tmp_path):
    """The stability guard's attention rule measures, while training, the series this benchmark
    measures by re-training (``--logged`` reads it back): the same values, at every second step
    (``ATTENTION_EVERY``), where the guard reads them."""
    cfg, specs = load_config("configs/seq2seq/tiny.yaml", [*SMALL, f"output_dir={tmp_path / 'guarded'}", "run_name=r",
                                                           "guard.mode=warn", "guard.attention=0.2"])
    train(cfg, specs)
    bench = load_benchmark("attention_logits")
    run = tmp_path / "guarded" / "r"
    assert bench.main([str(run), "--out", str(tmp_path / "logged"), "--logged"]) == 0
    assert bench.main([str(run), "--out", str(tmp_path / "offline")]) == 0
    live, offline = (json.loads((tmp_path / d / "r.json").read_text()) for d in ("logged", "offline"))
    assert [r["step"] for r in live] == [2, 4, 6, 8] and [r["step"] for r in offline] == list(range(1, 9))
    assert [r["logit_max"] for r in live] == pytest.approx([r["logit_max"] for r in offline[1::2]], rel=1e-6)
    assert "| r | logged | - |" in (tmp_path / "logged" / "attention.md").read_text()
    with pytest.raises(SystemExit, match="logged no attention/logit_max"):
        bench.main([str(tmp_path / "offline" / "r"), "--out", str(tmp_path / "x"), "--logged"])
