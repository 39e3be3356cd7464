"""``foundation compare stability``: the lr ladder and the plan, the report's table (a diverged
cell, the largest lr that converges, the best metric), resumption, the norm presets in --norms
and the command line end to end on the seq2seq recipe (depth 2, 3 steps, in-process: seconds)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from foundation.engine.config import load_config
from studies import compare, stability
from studies.recipes import recipes
from studies.stability_report import best_of, lr_ladder_table
from studies.verdict import Outcome, summarize

ROOT = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def at_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # the recipes name their configs relative to the repository


def recipe(task: str):
    return next(r for r in recipes() if r.task == task)


def test_ladder_and_quick_rungs():
    lrs = stability.ladder(1e-3)
    assert lrs == [0.001, 0.003, 0.009, 0.027, 0.081]
    assert stability.ladder(5e-3 / 9, 3, 10) == [0.000556, 0.00556, 0.0556]
    assert stability.quick_rungs(lrs) == [0.001, 0.081]  # the ends
    assert stability.quick_rungs(lrs, 3) == [0.001, 0.009, 0.081]  # both ends and the middle
    assert stability.quick_rungs([1.0, 2.0]) == [1.0, 2.0]


def test_every_modality_has_a_recipe():
    tasks = {r.task for r in recipes()}
    assert {"classification", "mim", "segmentation", "asr", "vqa", "nlvr2", "seq2seq"} <= tasks
    assert recipe("mim").before and "{run}" in recipe("mim").before_override
    from studies.demo import stages

    assert {s.task for s in stages()}.isdisjoint({"mim", "seq2seq"})  # no demo steps: not in the demo


def test_plan(at_root, tmp_path):
    s2s = stability.plan_task(recipe("seq2seq"), tmp_path, depths=None, lrs=None, steps=None, clip=None,
                              quick=False, user=["train.batch_size=8"])
    assert s2s.depths == [24, 48] and s2s.steps == 150 and s2s.encoder_decoder
    assert s2s.lrs == stability.ladder(5e-3 / 3)  # the config's lr / 3, then x3
    cfg, _ = load_config(s2s.config, [], check_data=False)
    warmup = round(cfg.schedule.warmup_steps * 150 / cfg.train.steps)  # the recipe's fraction of the run
    assert f"schedule.warmup_steps={warmup}" in s2s.overrides and 0 < warmup < cfg.schedule.warmup_steps
    assert "optim.clip_grad=null" in s2s.overrides and s2s.overrides[-1] == "train.batch_size=8"
    assert not any(o.startswith("backbone.dim=") for o in s2s.overrides)  # width 32 already: kept
    cfg, _ = load_config(s2s.config, [*s2s.overrides, *stability.depth_overrides(24, True)], check_data=False)
    assert (cfg.backbone.depth, cfg.backbone.decoder_depth, cfg.optim.clip_grad) == (24, 24, None)

    quick = stability.plan_task(recipe("seq2seq"), tmp_path, depths=None, lrs=None, steps=5, clip=2.0, quick=True,
                                user=[])
    assert quick.depths == [24] and len(quick.lrs) == 2 and quick.steps == 5
    assert "optim.clip_grad=2.0" in quick.overrides and "train.steps=5" in quick.overrides

    vis = stability.plan_task(recipe("classification"), tmp_path / "data", depths=[3], lrs=[1e-3], steps=None,
                              clip=None, quick=False, user=[])
    assert "backbone.dim=32" in vis.overrides and "init_from=null" in vis.overrides  # 64 wide: narrowed
    assert f"tasks.classification.data_dir={tmp_path / 'data' / 'vision-demo'}" in vis.overrides
    assert vis.steps == 160 and vis.depths == [3] and "train.batch_size=32" in vis.overrides  # the recipe's
    quick = stability.plan_task(recipe("classification"), tmp_path / "data", depths=[3], lrs=[1e-3], steps=7,
                                clip=None, quick=False, user=["schedule.warmup_steps=3"])
    assert quick.overrides[-1] == "schedule.warmup_steps=3" and "schedule.warmup_steps=1" in quick.overrides

    asr = stability.plan_task(recipe("asr"), tmp_path / "data", depths=None, lrs=None, steps=None, clip=None,
                              quick=False, user=[])
    # read by its held-out loss; the transducer from the first step, so the loss is one sum throughout
    assert recipe("asr").stability_metric == "loss" and "tasks.asr.rnnt_start=0" in asr.overrides


def outcome(norm: str, lr: float, seed: int, verdict: str, acc=None, step=None) -> Outcome:
    return Outcome(f"{norm}_{lr}_{seed}", norm, seed, lr, 24, verdict, diverged_step=step,
                   metrics={} if acc is None else {"t/acc": acc}, initial_loss=2.0, final_loss=1.0)


def test_report_table_with_a_diverged_cell():
    runs = [outcome("preln", 1e-3, s, "converged", 0.5 + s / 10) for s in (0, 1)]
    runs += [outcome("preln", 1e-2, 0, "converged", 0.8), outcome("preln", 1e-2, 1, "diverged", step=7)]
    runs += [outcome("magneto", lr, s, "converged", 0.7 if lr == 1e-2 else 0.6) for lr in (1e-3, 1e-2) for s in (0, 1)]
    summary = summarize(runs, lambda o: (o.norm, o.lr))
    table = lr_ladder_table(summary, ["preln", "magneto"], [1e-3, 1e-2], "t/acc", 100, True).splitlines()
    assert table[0].split(" | ")[-2:] == ["largest lr that converges", "best over the ladder |"]
    preln = [c.strip() for c in table[2].strip("|").split("|")]
    assert preln == ["preln", "55.0 ± 7.1", "diverged at step 7, 1/2 seeds", "0.001", "55.0 (lr 0.001)"]
    magneto = [c.strip() for c in table[3].strip("|").split("|")]
    assert magneto == ["magneto", "60.0 ± 0.0", "70.0 ± 0.0", "0.01", "70.0 (lr 0.01)"]
    assert best_of(summary, "magneto", "t/acc", higher=False) == (0.6, 1e-3)  # lower is better: the lowest


def test_norm_presets_in_every_compare_command():
    assert compare.parse_norms("foundation_ln,upscale_ln,magneto") == ["foundation_ln", "upscale_ln", "magneto"]
    with pytest.raises(ValueError, match="unknown norm 'bogus'.*foundation_ln, upscale_ln"):
        compare.parse_norms("bogus")
    assert compare.norm_overrides("foundation_ln") == ["backbone.norm=postln", "backbone.residual_scale=0.974"]
    assert compare.norm_overrides("upscale_ln") == ["backbone.norm=deepnorm", "backbone.init_gain=1.0"]
    assert compare.norm_overrides("preln") == ["backbone.norm=preln"]
    (spec,) = compare.grid(["foundation_ln"], [0], [1e-3])
    cfg, _ = load_config(ROOT / "configs/seq2seq/tiny.yaml", spec.overrides, check_data=False)
    assert (cfg.backbone.norm, cfg.backbone.residual_scale) == ("postln", 0.974)
    from studies.depth import depth_grid

    (deep,) = depth_grid(["upscale_ln"], [4], [0], 1e-3)
    cfg, _ = load_config(ROOT / "configs/seq2seq/tiny.yaml", deep.overrides, check_data=False)
    assert (cfg.backbone.norm, cfg.backbone.init_gain, cfg.backbone.depth) == ("deepnorm", 1.0, 4)


def test_cli_end_to_end_divergence_and_resume(at_root, tmp_path, nan_losses, capsys):
    """seq2seq, depth 2, 3 steps, two rules x two lrs; Post-LN's losses (foundation_ln) turn NaN
    from the second step on: its runs diverge at step 2; the same command again trains nothing."""
    nan_losses("postln", 2)
    out = tmp_path / "st"
    argv = ["--tasks", "seq2seq", "--quick", "--depths", "2", "--steps", "3", "--lrs", "1e-3,3e-3", "--norms",
            "magneto,foundation_ln", "--in-process", "--data", str(tmp_path / "data"), "--out", str(out),
            "train.max_nonfinite=1", "tasks.0.train_size=64", "tasks.0.eval_size=16", "train.batch_size=8"]
    assert stability.main(argv) == 0
    report = (out / "report.md").read_text()
    assert "| foundation_ln | diverged at step 2 | diverged at step 2 | none | - |" in report
    assert "no gradient clipping" in report and "2 layers" in report
    assert (out / "stability.png").read_bytes()[:8] == PNG
    res = json.loads((out / "results.json").read_text())
    (task,) = res["tasks"]
    assert task["task"] == "seq2seq" and task["depth"] == 2 and task["lrs"] == [1e-3, 3e-3]
    runs = {r["name"]: r for r in res["runs"]}
    assert sorted(runs) == ["foundation_ln_lr0.001_seed0", "foundation_ln_lr0.003_seed0", "magneto_lr0.001_seed0",
                            "magneto_lr0.003_seed0"]
    assert runs["magneto_lr0.001_seed0"]["verdict"] != "diverged"
    run_cfg = (out / "seq2seq" / "2L" / "runs" / "foundation_ln_lr0.001_seed0" / "config.yaml").read_text()
    assert "residual_scale: 0.974" in run_cfg and "clip_grad: null" in run_cfg
    capsys.readouterr()
    assert stability.main(argv) == 0  # resumes: every run finished or diverged earlier
    said = capsys.readouterr().out
    assert said.count("earlier, skipped") == 4 and "training ..." not in said
    more = [a if a != "1e-3,3e-3" else "1e-3,3e-3,9e-3" for a in argv if a != "--quick"]  # a rung and a seed never run
    assert stability.main([*more, "--report"]) == 0  # the report of what ended so far; nothing trains
    assert "training ..." not in capsys.readouterr().out
    assert not (out / "seq2seq" / "2L" / "runs" / "magneto_lr0.009_seed0").exists()
    assert len(json.loads((out / "results.json").read_text())["runs"]) == 4


def test_cli_errors(at_root, capsys):
    assert stability.main(["--tasks", "nope"]) == 2
    assert "unknown nope" in capsys.readouterr().err
    assert stability.main(["--norms", "preln", "backbone.depth=3"]) == 2
    assert "--depths" in capsys.readouterr().err
    from foundation.cli import main

    assert main(["compare", "stability", "--lrs", "0"]) == 2
