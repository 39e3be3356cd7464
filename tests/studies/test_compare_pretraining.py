"""``foundation compare pretraining``: single-modality runs are the cross-modal config minus
the other modalities' entries, every fine-tuning init gets the right weights, and the report
tabulates task x init; on two toy seq2seq "modalities" (CPU, seconds)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from foundation.engine.config import load_config
from foundation.engine.recipe import Recipe
from studies import pretraining as cp

REPO = Path(__file__).resolve().parents[2]

PNG = b"\x89PNG\r\n\x1a\n"


pytestmark = pytest.mark.usefixtures("one_thread")


def pretraining_config(toy, seq2seq) -> dict:
    """Two "modalities": reversal (rev) and sorting (srt)."""
    return toy(4, [seq2seq(id="rev", problem="reverse"), seq2seq(id="srt", problem="sort")], eval_every=0)


def test_pretraining_comparison_end_to_end(tmp_path, capsys, toy, seq2seq, write_config):
    # the fine-tuning task is reversal, with a narrower recipe than the pretraining backbone:
    # every init gets the pretraining shape
    pre = write_config(pretraining_config(toy, seq2seq), "pre.yaml")
    ft_cfg = toy(3, [seq2seq(id="rev", problem="reverse")], eval_every=0)
    ft_cfg["backbone"].update(dim=8, ffn_dim=16)
    ft_cfg["optim"]["lr"] = 1e-3  # its own lr, not the pretraining one
    # the cells show the recipe's metric, not the config's checkpoint metric (exact_match)
    ft = Recipe("rev", str(write_config(ft_cfg, "ft.yaml")), "token_accuracy", 100, modality="rev")
    runs = {"rev": ("rev",), "srt": ("srt",), "crossmodal": ("rev", "srt")}
    base, specs = load_config(pre, check_data=False)
    arch = {k: getattr(base.backbone, k) for k in cp.ARCH_FIELDS}
    out = tmp_path / "out"

    def go():
        return cp.run(out, "magneto", [0, 1], [ft], pre, [], [s.id for s in specs], arch, jobs=2,
                      in_process=True, pretrain_runs=runs, command="test")

    assert go() == 0
    # only the runs the tasks need; the single-modality run kept only its entry
    assert sorted(p.name for p in out.glob("pretrain-*")) == ["pretrain-crossmodal", "pretrain-rev"]
    for seed in (0, 1):  # one pretraining run per seed
        run_cfg = lambda d: OmegaConf.load(out / d / "runs" / f"magneto_lr0.003_seed{seed}" / "config.yaml")  # noqa: E731
        assert [t.id for t in run_cfg("pretrain-rev").tasks] == ["rev"]
        assert [t.id for t in run_cfg("pretrain-crossmodal").tasks] == ["rev", "srt"]
        assert run_cfg("pretrain-rev").train.steps == run_cfg("pretrain-crossmodal").train.steps == 4
        assert run_cfg("pretrain-rev").seed == run_cfg("pretrain-crossmodal").seed == seed
    # the inits: scratch none, single the rev run, crossmodal the cross-modal run of the same
    # seed; all with the pretraining backbone's width
    weights = {(r, s): str(cp.weights(out, r, "magneto", 3e-3, s)) for r in ("rev", "crossmodal") for s in (0, 1)}
    for seed in (0, 1):
        for init, want in [("scratch", None), ("single", weights["rev", seed]),
                           ("crossmodal", weights["crossmodal", seed])]:
            cfg = OmegaConf.load(out / f"rev-{init}" / "runs" / f"magneto_lr0.001_seed{seed}" / "config.yaml")
            assert cfg.init_from == want and cfg.backbone.dim == 16 and cfg.backbone.ffn_dim == 32
            assert cfg.optim.lr == 1e-3
            assert cfg.seed == seed and cfg.train.steps == 3
    # the three inits trained different models (same seed, same data: only the start differs)
    from safetensors.torch import load_file

    final = {i: load_file(str(out / f"rev-{i}" / "runs" / "magneto_lr0.001_seed0" / "best" / "model.safetensors"))
             for i in cp.INITS}
    key = next(k for k in final["scratch"] if k.startswith("backbone.") and k.endswith("fc1.weight"))
    assert not torch.equal(final["scratch"][key], final["single"][key])
    assert not torch.equal(final["single"][key], final["crossmodal"][key])
    # the report
    results = json.loads((out / "results.json").read_text())
    cells = {(c["task"], c["init"]): c for c in results["cells"]}
    assert set(cells) == {("rev", i) for i in cp.INITS}
    assert all(len(c["per_seed"]) == 2 and c["metric"] == "token_accuracy" for c in cells.values())
    cell = json.loads((out / "rev-single" / "results.json").read_text())  # each cell's compare report: both seeds
    assert [r["seed"] for r in cell["runs"]] == [0, 1] and (out / "rev-single" / "curves.png").is_file()
    assert json.loads((out / "pretrain-rev" / "results.json").read_text())["seeds"] == [0, 1]
    report = (out / "report.md").read_text()
    assert "| rev | token_accuracy ↑ |" in report and "| srt |" not in report  # srt was not run
    # the objective alone and in the cross-modal run, both seeds
    row = next(line for line in report.splitlines() if line.startswith("| rev (`rev` run) | rev/exact_match |"))
    assert len(re.findall(r"\(\d+\.\d / \d+\.\d\)", row)) == 2
    assert (out / "pretraining.png").read_bytes()[:8] == PNG
    # the same command again trains nothing
    stamps = {p: p.stat().st_mtime for p in out.rglob("metrics.jsonl")}
    capsys.readouterr()
    assert go() == 0
    assert {p: p.stat().st_mtime for p in out.rglob("metrics.jsonl")} == stamps
    assert "training ..." not in capsys.readouterr().out
    # a fine-tuning recipe changed under finished cells: one line per cell, no report from stale runs
    ft_cfg["train"]["steps"] = 4
    write_config(ft_cfg, "ft.yaml")
    assert go() == 1
    err = capsys.readouterr().err
    assert "holds a run of another configuration" in err and "fine-tuning failed:" in err and "rev-scratch seed 0" in err


def test_a_bad_recipe_stops_everything_before_training(tmp_path, capsys, toy, seq2seq, write_config):
    pre = write_config(pretraining_config(toy, seq2seq), "pre.yaml")
    bad = toy(3, [seq2seq(data_dir=str(tmp_path / "none"))], eval_every=0)
    ft = Recipe("rev", str(write_config(bad, "ft.yaml")), "exact_match", 100, modality="rev")
    base, specs = load_config(pre, check_data=False)
    arch = {k: getattr(base.backbone, k) for k in cp.ARCH_FIELDS}
    runs = {"rev": ("rev",), "srt": ("srt",), "crossmodal": ("rev", "srt")}
    out = tmp_path / "out"
    assert cp.run(out, "magneto", [0], [ft], pre, [], [s.id for s in specs], arch, jobs=1, in_process=True,
                  pretrain_runs=runs) == 2
    err = capsys.readouterr().err
    assert "ft.yaml" in err and "data_dir" in err and str(tmp_path / "none") in err
    assert not out.exists()  # nothing trained


def test_cli_errors(capsys):
    from foundation.cli import main

    assert main(["compare", "pretraining", "--tasks", "asr,nosuch"]) == 2
    assert "nosuch" in capsys.readouterr().err
    assert main(["compare", "pretraining", "seed=3"]) == 2
    assert "--seeds" in capsys.readouterr().err
    assert main(["compare", "pretraining", "--norm", "preln,magneto"]) == 2
    assert "one rule per comparison" in capsys.readouterr().err


def test_the_tasks_come_from_their_recipes():
    """Every task whose foundation_tasks/<task>/recipe.py names a pretraining modality is a fine-tuning
    task: the longest modality's first, each with its tiny config and metric scale."""
    assert [(r.task, r.modality, r.config, r.scale) for r in cp.finetunes()] == [
        ("asr", "speech", "configs/asr/tiny.yaml", 1),
        ("vqa", "vl", "configs/vl/tiny_vqa.yaml", 100),
        ("nlvr2", "vl", "configs/vl/tiny_nlvr2.yaml", 100),
        ("classification", "vision", "configs/vision/tiny_finetune.yaml", 100),
        ("segmentation", "vision", "configs/segmentation/tiny.yaml", 1)]
    assert all(r.modality in cp.PRETRAIN_RUNS for r in cp.finetunes())


def test_the_runs_keep_the_entries_of_the_shipped_config():
    """The cross-modal run keeps every entry of configs/crossmodal/tiny.yaml and each single-modality
    run a part of them, every entry in exactly one single-modality run."""
    _, specs = load_config(REPO / cp.PRETRAIN_CONFIG, [], check_data=False)
    ids = [s.id for s in specs]
    assert list(cp.PRETRAIN_RUNS["crossmodal"]) == ids
    single = [i for run, keep in cp.PRETRAIN_RUNS.items() if run != "crossmodal" for i in keep]
    assert sorted(single) == sorted(ids)


def test_scarce_fine_tunes_every_init_on_the_scarcest_budget(tmp_path, write_config):
    """--scarce: each fine-tuning cell (every init, every seed) on the recipe's first label budget, the
    subset drawn with the cell's seed, for the recipe's label steps; the report names the budget."""
    from foundation_tasks.classification import demo

    data = tmp_path / "vision-demo"
    demo.write_dataset(data, seed=0, size=32, train_per_class=3, val_per_class=1, num_classes=10)
    pre = OmegaConf.to_container(OmegaConf.load("configs/vision/tiny_mim_pixels.yaml"))
    pre["tasks"][0].update(id="mim", data_dir=str(data))
    pre.update(train={"steps": 2, "batch_size": 8}, eval={"every": 0, "batch_size": 10})
    ft_cfg = OmegaConf.to_container(OmegaConf.load("configs/vision/tiny_finetune.yaml"))
    ft_cfg["tasks"][0]["data_dir"] = str(data)
    ft_cfg.update(train={"steps": 50, "batch_size": 8}, eval={"every": 0, "batch_size": 10}, init_from=None)
    pre_path, ft_path = write_config(pre, "pre.yaml"), write_config(ft_cfg, "ft.yaml")
    ft = Recipe("classification", str(ft_path), "top1", 100, modality="vision",
                label_field="tasks.classification.train_per_class", label_budgets=("1", "all"),
                label_unit="labelled images per class", label_steps=2, pretrained_overrides=("optim.layer_decay=0.75",))
    base, specs = load_config(pre_path, check_data=False)
    arch = {k: getattr(base.backbone, k) for k in cp.ARCH_FIELDS}
    out = tmp_path / "out"
    assert cp.run(out, "magneto", [0, 1], [ft], pre_path, [], ["mim"], arch, jobs=1, in_process=True,
                  pretrain_runs={"vision": ("mim",), "crossmodal": ("mim",)}, scarce=True) == 0
    for init in cp.INITS:
        for seed in (0, 1):
            cfg = OmegaConf.load(out / f"classification-{init}" / "runs" / f"magneto_lr0.002_seed{seed}" / "config.yaml")
            task = cfg.tasks[0]
            assert (task.train_per_class, task.subset_seed, cfg.train.steps) == (1, seed, 2)
            assert cfg.optim.layer_decay == (None if init == "scratch" else 0.75)  # only from a pretraining
    report = (out / "report.md").read_text()
    assert "on its scarcest label budget (classification: 1 labelled images per class, 2 steps)" in report
    assert re.search(r"\| mim \(`vision` run\) \| mim/pix_loss \| \d\.\d{3} ± 0\.\d{3} \(\d\.\d{3} / \d\.\d{3}\) \|", report)
    questions = Recipe("vqa", "x.yaml", "vqa_accuracy", 100, label_budgets=("0.1", "all"),
                       label_unit="fraction of the questions")
    assert cp.budget_text(questions) == "10 % of the questions"


def test_scarce_leaves_out_the_tasks_without_label_budgets(capsys):
    from foundation.cli import main

    assert main(["compare", "pretraining", "--scarce", "--tasks", "nlvr2"]) == 2
    assert "--tasks: unknown nlvr2 (without label budgets); known: asr, vqa, classification, segmentation" in (
        capsys.readouterr().err)
