"""benchmarks/step_cost.py: our engine's step against the plain timm loop, side by side."""
from __future__ import annotations

import re

import pytest
import torch
from support import load_benchmark

from foundation_tasks.classification import demo


@pytest.mark.usefixtures("one_thread")
def test_the_step_cost_benchmark_prints_its_ratios(tmp_path, capsys):
    data = tmp_path / "vision-demo"
    demo.write_dataset(data, seed=0, size=32, train_per_class=4, val_per_class=1, num_classes=10)
    bench = load_benchmark("step_cost")
    assert bench.main(["--tasks", "vision", "--norms", "preln,magneto", "--vision-data", str(data), "--steps", "30",
                       "--warmup", "10", "--rounds", "1", "--batch-size", "8", "--out", str(tmp_path / "runs")]) == 0
    table = capsys.readouterr().out.split("| task |", 1)[1]
    # each norm against the plain loop of its own architecture: Magneto against timm's Sub-LN ViT
    for norm, plain_name in (("preln", "timm ViT"), ("magneto", "timm ViT, Sub-LN")):
        plain = re.search(rf"\| vision \| {plain_name}, plain AdamW loop \| (\d+) \| 1\.00 \|", table)
        ours = re.search(rf"\| vision \| ours, {norm} \| (\d+) \| (\d+\.\d\d) \| (\d+) \| (\d+) \|", table)
        assert plain and ours, table
        ratio = int(ours[1]) / int(plain[1])
        assert abs(float(ours[2]) - ratio) < 0.1 * ratio + 0.02  # the ratio is of the two printed times
        assert int(plain[1]) > 0 and int(ours[4]) > 0  # the data of 8 small images may round to 0 ms
        assert (tmp_path / "runs" / f"vision-{norm}-30" / "metrics.jsonl").is_file()  # ours ran through the engine


def test_the_sub_ln_plain_loop_is_timms_sub_ln_vit():
    """The plain loop Magneto is held against has Magneto's two extra LayerNorms a block, where it has them."""
    bench = load_benchmark("step_cost")
    for sub_ln in (False, True):
        block = bench.plain_vit(10, 32, sub_ln).blocks[0]
        assert isinstance(block.attn.norm, torch.nn.LayerNorm) == sub_ln  # before the attention's output projection
        assert isinstance(block.mlp.norm, torch.nn.LayerNorm) == sub_ln  # before the FFN's second layer
        if sub_ln:  # over the attention's output (dim) and the FFN's hidden layer (4 x dim), as Magneto's
            assert block.attn.norm.normalized_shape == (64,) and block.mlp.norm.normalized_shape == (256,)


def test_per_step_takes_the_interval_after_warmup():
    bench = load_benchmark("step_cost")
    assert bench.per_step([(10, 1.0), (20, 2.0), (30, 2.5), (40, 3.0)], 20) == pytest.approx(0.05)
    with pytest.raises(SystemExit, match="--steps must exceed --warmup"):
        bench.per_step([(10, 1.0), (20, 2.0)], 20)
