"""`foundation demo` end to end on one stage: data made from nothing, both norms run
through `foundation compare`, the summary table filled from their reports."""
from __future__ import annotations

import re

from studies import demo


def test_demo_one_stage_from_nothing(tmp_path, capsys):
    data, out = tmp_path / "data", tmp_path / "out"
    rc = demo.main(["--only", "vision", "--steps-scale", "0.02", "--data", str(data), "--out", str(out), "--jobs", "1"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "[1/3]" in printed and "[2/3]" in printed and "[3/3]" in printed
    assert (data / "vision-demo" / "train").is_dir()  # made, in the ImageNet layout
    assert (out / "vision" / "report.md").is_file() and (out / "vision" / "curves.png").is_file()
    rows = [line for line in (out / "summary.md").read_text().splitlines() if line.startswith("| image")]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert all(re.fullmatch(r"\d+\.\d", c) for c in cells[1:3]), rows  # a top-1 for Pre-LN and for Magneto
    assert cells[3] == "chance 10.0"  # what a model that learnt nothing scores, beside the numbers
    assert cells[4].startswith(">= 85: ")  # the bar, and whether both runs reached it
    assert cells[5] == str(round(demo.stages()[0].steps * 0.02))  # the vision stage's steps x 0.02
    import yaml
    configs = [yaml.safe_load(p.read_text()) for p in (out / "vision").rglob("config.yaml")]
    assert configs and all(c["schedule"]["warmup_steps"] == round(15 / 3) for c in configs)  # the recipe's third
    # the same command again reuses the data and the finished runs
    rc = demo.main(["--only", "vision", "--steps-scale", "0.02", "--data", str(data), "--out", str(out), "--jobs", "1"])
    assert rc == 0 and "exists, reused" in capsys.readouterr().out


def test_demo_rejects_unknown_stage(capsys):
    import pytest

    with pytest.raises(SystemExit):
        demo.main(["--only", "vision,radar"])
    assert "radar" in capsys.readouterr().err


def test_demo_shows_the_vqa_answer_prior_from_the_data(tmp_path):
    import json

    vqa = tmp_path / "vl" / "vqa"
    vqa.mkdir(parents=True)

    def write(split, rows):
        anns = [{"question_id": i, "question_type": qt, "answer_type": at, "multiple_choice_answer": mc,
                 "answers": [{"answer": a} for a in answers]} for i, (qt, at, mc, answers) in enumerate(rows)]
        (vqa / f"v2_mscoco_{split}_annotations.json").write_text(json.dumps({"annotations": anns}))

    write("train2014", [("what color is", "other", "red", []), ("what color is", "other", "red", []),
                        ("what color is", "other", "blue", []), ("is there a", "yes/no", "yes", [])])
    # seen type -> "red" (right); unseen type -> its answer type's most frequent training answer ("yes": wrong)
    write("val2014", [("what color is", "other", "red", ["red"] * 10),
                      ("held-out: does the picture", "yes/no", "no", ["no"] * 10)])
    stage = next(s for s in demo.stages() if s.stage_name == "vqa")
    assert demo.baseline(stage, tmp_path) == "answer prior 50.0"
    assert demo.baseline(stage, tmp_path / "missing").startswith("answer prior: ")


def test_stages_are_the_tasks_recipes_in_the_demo_order():
    """The demo's stages come from foundation_tasks/<task>/recipe.py: the same order, configs, data, steps,
    metrics and timings as the table they replace."""
    from pathlib import Path

    got = [(s.stage_name, s.config, s.data, s.steps, s.metric, s.scale, s.overrides,
            s.minutes) for s in demo.stages()]
    assert got == [
        ("vision", "configs/vision/tiny_finetune.yaml", "vision", 750, "top1", 100, ("init_from=null",), 2.0),
        ("segmentation", "configs/segmentation/tiny.yaml", "segmentation", 300, "mIoU", 1, (), 2),
        ("asr", "configs/asr/tiny.yaml", "speech", 1400, "wer_test", 1, (), 6.0),
        ("vqa", "configs/vl/tiny_vqa.yaml", "vl", 1500, "vqa_accuracy", 100, (), 3.0),
        ("nlvr2", "configs/vl/tiny_nlvr2.yaml", "vl", 400, "accuracy", 100, (), 1.0),
    ]
    assert [demo.data_overrides(s, Path("data"))[0] for s in demo.stages()] == [
        "tasks.classification.data_dir=data/vision-demo", "tasks.segmentation.data_root=data/ade-demo",
        "tasks.asr.data_dir=data/speech-demo", "tasks.vqa.data_dir=data/vl/vqa", "tasks.nlvr2.data_dir=data/vl/nlvr2"]
    assert [s.baseline or s.prior for s in demo.stages()] == [
        "chance 10.0", "one class everywhere <= 12.5", "nothing recognised 100", "foundation_tasks.vqa.prior", "chance 50.0"]


def test_nlvr2_stage_starts_from_the_vqa_runs(tmp_path, capsys):
    """--only nlvr2 brings in the VQA stage it starts from; each NLVR2 run loads the VQA run of
    its own norm and seed."""
    from omegaconf import OmegaConf

    data, out = tmp_path / "data", tmp_path / "out"
    rc = demo.main(["--only", "nlvr2", "--steps-scale", "0.005", "--data", str(data), "--out", str(out), "--jobs", "2"])
    assert rc == 0
    printed = capsys.readouterr().out
    steps = {s.stage_name: round(s.steps * 0.005) for s in demo.stages()}
    assert f"vqa: {steps['vqa']} steps per run" in printed and f"nlvr2: {steps['nlvr2']} steps per run" in printed
    for norm in demo.NORMS:
        run, = (out / "nlvr2" / "runs").glob(f"{norm}_lr*_seed0")
        vqa_run, = (out / "vqa" / "runs").glob(f"{norm}_lr*_seed0")
        source = vqa_run / "best" / "model.safetensors"
        assert OmegaConf.load(run / "config.yaml").init_from == str(source) and source.is_file()
        assert f"init_from {source}: loaded" in (run / "train.log").read_text()
    table = (out / "summary.md").read_text()
    assert "| VQA" in table and "| NLVR2" in table


def test_a_stage_starts_after_the_stage_it_starts_from():
    by_name = {s.stage_name: s for s in demo.stages()}
    order = [s.stage_name for s in demo.start_order([by_name["nlvr2"], by_name["vision"], by_name["vqa"]])]
    assert order.index("vqa") < order.index("nlvr2") and len(order) == 3
    order = [s.stage_name for s in demo.start_order([by_name["nlvr2"], by_name["vqa"]])]
    assert order == ["vqa", "nlvr2"]


def test_each_stage_runs_the_slower_norm_first():
    """Two threads take the runs in this order: whichever finished first takes the next stage's
    Magneto run (the longer one), so neither thread collects all the longer runs."""
    items = [(s.stage_name, n) for s, n, _ in demo.run_order(demo.stages())]
    assert [n for _, n in items] == ["magneto", "preln"] * 5
    stages = [name for name, _ in items]
    assert stages[::2] == [s.stage_name for s in demo.start_order(demo.stages())] and stages[::2] == stages[1::2]


def test_with_several_seeds_every_seed_runs_each_norm_slower_first():
    items = [(s.stage_name, n, seed) for s, n, seed in demo.run_order(demo.stages(), [0, 1, 2])]
    assert len(items) == 5 * 2 * 3 and len(set(items)) == len(items)
    assert items[:6] == [(items[0][0], n, seed) for seed in (0, 1, 2) for n in ("magneto", "preln")]


def outcome(norm, seed, value, metric="eval/classification/top1", verdict="not converged"):
    from studies.verdict import Outcome

    return Outcome(f"{norm}_seed{seed}", norm, seed, 1e-3, None, verdict,
                   metrics={} if value is None else {metric: value}, wall_s=10.0)


def test_a_row_over_seeds_shows_mean_and_range_and_which_run_missed_its_bar(tmp_path):
    vision = next(s for s in demo.stages() if s.stage_name == "vision")
    runs = {("preln", 0): outcome("preln", 0, 0.934), ("preln", 1): outcome("preln", 1, 0.926),
            ("preln", 2): outcome("preln", 2, 0.942), ("magneto", 0): outcome("magneto", 0, 0.874),
            ("magneto", 1): outcome("magneto", 1, 0.846), ("magneto", 2): outcome("magneto", 2, 0.90)}
    row = demo.stage_row(vision, runs, 750)
    assert row["values"] == {"preln": "93.4 (92.6-94.2)", "magneto": "87.3 (84.6-90.0)"}
    assert row["seconds"] == 60.0
    assert demo.bar_cell(vision, tmp_path, runs) == ">= 85: missed by Magneto seed 1: 84.6"
    runs["magneto", 1] = outcome("magneto", 1, 0.851)
    assert demo.bar_cell(vision, tmp_path, runs) == ">= 85: met"
    runs["preln", 2] = outcome("preln", 2, None, verdict="failed")  # a run without an evaluation misses its bar
    assert demo.bar_cell(vision, tmp_path, runs) == ">= 85: missed by Pre-LN seed 2: -"
    assert demo.stage_row(vision, runs, 750)["values"]["preln"] == "93.0 (92.6-93.4) (failed)"


def test_bars_read_lower_is_better_and_relative_to_the_prior(tmp_path, monkeypatch):
    from dataclasses import replace

    asr = next(s for s in demo.stages() if s.stage_name == "asr")
    assert demo.bar_threshold(asr, tmp_path) == ("<=", 20.0)
    runs = {("preln", 0): outcome("preln", 0, 13.0, "eval/asr/wer_test"),
            ("magneto", 0): outcome("magneto", 0, 21.5, "eval/asr/wer_test")}
    assert demo.bar_cell(asr, tmp_path, runs) == "<= 20: missed by Magneto seed 0: 21.5"
    vqa = next(s for s in demo.stages() if s.stage_name == "vqa")
    monkeypatch.setattr(demo, "prior_value", lambda stage, data: 46.2)
    assert demo.bar_threshold(vqa, tmp_path) == (">=", 66.2)
    runs = {("preln", 0): outcome("preln", 0, 0.92, "eval/vqa/vqa_accuracy"),
            ("magneto", 0): outcome("magneto", 0, 0.66, "eval/vqa/vqa_accuracy")}
    assert demo.bar_cell(vqa, tmp_path, runs) == ">= 66.2: missed by Magneto seed 0: 66.0"
    assert demo.bar_threshold(replace(vqa, bar="about 80"), tmp_path) is None
    assert [s.bar for s in demo.stages()] == [">= 85", ">= 75", "<= 20", ">= prior + 20", ">= 75"]


def test_seeds_must_be_integers(capsys):
    import pytest

    with pytest.raises(SystemExit):
        demo.main(["--seeds", "0,x"])
    assert "--seeds" in capsys.readouterr().err
