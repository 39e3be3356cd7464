"""Smoke test of ``foundation bench backbone`` at toy sizes: every row is there, numbers are sane."""
import json

import pytest

from foundation.checkpoint import import_torchscale
from studies import bench

TINY = ["--dim", "16", "--depth", "2", "--heads", "2", "--tokens", "5", "--batch", "2",
        "--reps", "1", "--warmup", "1", "--threads", "1"]


def _have_torchscale() -> bool:
    try:
        import_torchscale()
        return True
    except ImportError:
        return False


def test_bench_backbone_prints_every_row(tmp_path, capsys):
    out_json = tmp_path / "bench.json"
    assert bench.main(TINY + ["--json", str(out_json)]) == 0
    text = capsys.readouterr().out
    rows = list(bench.OURS) + [r for r in bench.REFERENCES if _have_torchscale() or "torchscale" not in r]

    assert text.startswith("config: D=16 depth=2 heads=2 ffn=64 T=5 B=2")
    assert "torch " in text and "1 threads" in text
    table = [line for line in text.splitlines() if line.startswith("| ")]
    for name in rows:
        assert any(line.startswith(f"| {name} |") for line in table), name
    assert "saved for backward" in text and "Targets:" in text

    data = json.loads(out_json.read_text())
    results = {r["name"]: r for r in data["results"]}
    assert set(results) == set(rows)
    for r in results.values():
        assert len(r["ms"]) == 1 and r["median_ms"] > 0
        assert r["saved_bytes"] > 0 and r["params"] > 0
        if r["name"] in bench.SAME_MATH:  # the references got our weights: same function
            assert r["max_abs_diff"] == pytest.approx(0.0, abs=1e-4)
    # Sub-LN keeps two more LayerNorm inputs per layer than Pre-LN
    assert results["ours magneto"]["saved_bytes"] > results["ours preln"]["saved_bytes"]
    for ours in bench.OURS:
        assert all(v > 0 for v in data["ratios"][ours].values())


def test_bench_rejects_heads_that_do_not_divide_dim(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--dim", "10", "--heads", "3"])
    assert "must divide" in capsys.readouterr().err
