"""``foundation compare``: the norm x seed x lr runner, its divergence verdicts, resumption,
the depth mode (``foundation compare depth``) and the command line, on a toy seq2seq config
(CPU, seconds)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from foundation.engine import loop
from studies import compare, depth, verdict
from studies.verdict import Rules, RunSpec, judge

PNG = b"\x89PNG\r\n\x1a\n"


pytestmark = pytest.mark.usefixtures("one_thread")


def results(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


# ---------------------------------------------------------------------------- the grid


def test_report_structure_and_divergence(tmp_path, nan_losses, toy, write_config):
    """2 norms x 2 lrs, 1 seed; Pre-LN's loss turns NaN from its 5th step on, 3 allowed in a
    row: both its runs diverge at step 7 (the engine's stop), Magneto's still run and converge."""
    nan_losses("preln", 5)
    config = write_config(toy(steps=12, max_nonfinite=3))
    out = tmp_path / "cmp"
    code = compare.compare(config, out, ["preln", "magneto"], [0], [1e-3, 3e-3], in_process=True,
                           command="foundation compare toy.yaml", rules=Rules(converge_ratio=1.0))
    assert code == 0
    res = results(out)
    runs = {r["name"]: r for r in res["runs"]}
    assert sorted(runs) == ["magneto_lr0.001_seed0", "magneto_lr0.003_seed0", "preln_lr0.001_seed0",
                            "preln_lr0.003_seed0"]
    for lr in ("0.001", "0.003"):
        pre, mag = runs[f"preln_lr{lr}_seed0"], runs[f"magneto_lr{lr}_seed0"]
        assert pre["verdict"] == "diverged" and pre["diverged_step"] == 7 and pre["engine_status"] == "diverged"
        assert mag["verdict"] == "converged" and mag["steps"] == 12 and mag["engine_status"] == "finished"
        assert mag["final_loss"] < mag["initial_loss"]
        assert set(mag["metrics"]) == {"seq2seq/exact_match", "seq2seq/token_accuracy", "seq2seq/loss"}
        status = json.loads((out / "runs" / f"preln_lr{lr}_seed0" / "status.json").read_text())
        assert status["status"] == "diverged" and status["step"] == 7
    assert res["primary_metric"] == "seq2seq/exact_match" and res["higher_is_better"] is True
    assert res["largest_converging_lr"] == {"preln": None, "magneto": 0.003}
    summary = {(s["norm"], s["lr"]): s for s in res["summary"]}
    assert summary["preln", 0.001]["verdict"] == "diverged" and summary["preln", 0.001]["diverged_step"] == 7
    assert summary["magneto", 0.003]["metrics"]["seq2seq/exact_match"]["per_seed"] == \
        [runs["magneto_lr0.003_seed0"]["metrics"]["seq2seq/exact_match"]]

    report = (out / "report.md").read_text()
    assert "## Final metrics" in report and "## Convergence per learning rate" in report
    lr_rows = {line.split("|")[1].strip(): line for line in report.splitlines()
               if line.startswith("| preln |") or line.startswith("| magneto |")}
    assert "diverged at step 7" in lr_rows["preln"] and lr_rows["preln"].rstrip(" |").endswith("none")
    assert lr_rows["magneto"].rstrip(" |").endswith("0.003") and "converged (exact_match" in lr_rows["magneto"]
    assert "| magneto | 0.003 | converged |" in report
    assert (out / "curves.png").read_bytes()[:8] == PNG
    for name in runs:  # the raw metrics stay in the run directories
        assert (out / "runs" / name / "metrics.jsonl").is_file()


def test_seeds_mean_std_and_resume(tmp_path, monkeypatch, toy, write_config):
    """2 seeds: mean ± std with per-seed values. Re-invoking trains nothing; a run whose
    status.json is gone (interrupted) is the only one trained again, and resumes."""
    config = write_config(toy(steps=4))
    out = tmp_path / "cmp"
    assert compare.compare(config, out, ["magneto"], [0, 1], [3e-3], in_process=True) == 0
    res = results(out)
    em = res["summary"][0]["metrics"]["seq2seq/token_accuracy"]
    per_seed = [r["metrics"]["seq2seq/token_accuracy"] for r in res["runs"]]
    assert em["per_seed"] == per_seed and em["mean"] == pytest.approx(sum(per_seed) / 2)
    assert em["std"] == pytest.approx(abs(per_seed[0] - per_seed[1]) / 2 ** 0.5)
    report = (out / "report.md").read_text()
    assert "± " in report and f"({per_seed[0]:.4f}, {per_seed[1]:.4f})" in report

    trained = []
    real = loop.train
    monkeypatch.setattr(loop, "train", lambda cfg, specs=None: trained.append((cfg.run_name, cfg.resume)) or real(cfg, specs))
    lines = []
    assert compare.compare(config, out, ["magneto"], [0, 1], [3e-3], in_process=True, say=lines.append) == 0
    assert trained == [] and sum("skipped" in line for line in lines) == 2

    (out / "runs" / "magneto_lr0.003_seed1" / "status.json").unlink()
    assert compare.compare(config, out, ["magneto"], [0, 1], [3e-3], in_process=True, say=lines.append) == 0
    assert trained == [("magneto_lr0.003_seed1", True)]
    assert results(out)["runs"][1]["engine_status"] == "finished" and (out / "runs" / "magneto_lr0.003_seed1" / "status.json").is_file()

    # a changed recipe in the same report directory is refused, not mixed in
    code = compare.compare(write_config(toy(steps=5)), out, ["magneto"], [0, 1], [3e-3], in_process=True)
    assert code == 2


def test_subprocess_run_and_a_real_divergence(tmp_path, toy, write_config):
    """The default launcher (each run its own `foundation train` process; one run here, as a
    process start costs seconds): lr 1e4 really diverges, with non-finite gradients, and the
    verdict takes the step of the engine's `diverged` event."""
    config = write_config(toy(steps=6, max_nonfinite=2))
    out = tmp_path / "cmp"
    code = compare.main([str(config), "--norms", "magneto", "--lrs", "1e4", "--out", str(out), "eval.every=0"])
    assert code == 0
    run_dir = out / "runs" / "magneto_lr10000_seed0"
    (bad,) = results(out)["runs"]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    nonfinite = [r["step"] for r in records if r.get("event") == "nonfinite"]
    event = next(r for r in records if r.get("event") == "diverged")
    assert bad["verdict"] == "diverged" and bad["diverged_step"] == event["step"] == nonfinite[-1] < 6
    assert len(nonfinite) == 2 and nonfinite[1] == nonfinite[0] + 1  # max_nonfinite=2 in a row
    assert (run_dir / "train.log").read_text().count("training stopped at step") == 1
    assert results(out)["largest_converging_lr"] == {"magneto": None}
    assert "| magneto | diverged at step %d | none |" % event["step"] in (out / "report.md").read_text()


# ---------------------------------------------------------------------------- verdicts


def _write_run(run_dir: Path, losses: list, status: str = "finished", evals: dict | None = None) -> None:
    run_dir.mkdir(parents=True)
    lines = [{"step": i + 1, "time": float(i), "loss": v} for i, v in enumerate(losses)]
    lines.append({"step": len(losses), "time": float(len(losses)),
                  **{f"eval/t/{k}": v for k, v in (evals or {"acc": 0.5}).items()}})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (run_dir / "status.json").write_text(json.dumps({"status": status, "step": len(losses)}))


@pytest.mark.parametrize("losses, evals, verdict, step", [
    ([2.0, 1.8, 1.5, 1.0, 0.8, 0.5, 0.3, 0.2], None, "converged", None),
    ([2.0, 1.8, 1.8, 1.7, 1.7, 1.7, 1.7, 1.7], None, "not converged", None),  # 0.85 x the first: a plateau
    # a spike: the mean of 5 logged steps (2..6) passes 2 x the first loss at step 6; the
    # blow-up began at step 4, the window's first loss above 4.0
    ([2.0, 1.9, 3.0, 5.0, 6.0, 9.0, 9.0, 1.0], None, "diverged", 4),
    ([2.0, 1.9, 3.0, 3.9, 4.1, 4.1, 1.0, 1.0], None, "converged", None),  # a mean of 3.4 at most
    ([2.0, 2.1, 2.2, 2.1, 2.0, 2.1, 2.2, 2.3], None, "not converged", None),
    ([2.0, 1.5, 1.0, 0.5, 0.4, 0.3, 0.2, 0.1], {"acc": "nan"}, "diverged", 8),
])
def test_verdict_rules(tmp_path, losses, evals, verdict, step):
    spec = RunSpec("r", "magneto", 0, 1e-3)
    _write_run(tmp_path / "r", losses, evals=evals)
    o = judge(spec, tmp_path / "r", Rules(explode_factor=2.0, converge_ratio=0.8))
    assert o.verdict == verdict and o.diverged_step == step
    assert o.initial_loss == 2.0


def test_a_run_the_engine_ended_for_a_blown_up_loss_diverged_where_the_blow_up_began(tmp_path):
    run = tmp_path / "r"
    _write_run(run, [2.0, 1.9, 3.0, 5.0, 6.0, 9.0, 9.0, 9.5], status="diverged")
    message = ("training ended at step 8 diverged: the training loss blew up and did not come back: 7.7 over the "
               "last 5 steps against 2 at the first (train.explode_factor=2); its last model was neither evaluated nor saved")
    with (run / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 8, "event": "diverged", "what": "loss", "message": message}) + "\n")
    (run / "status.json").write_text(json.dumps({"status": "diverged", "step": 8, "message": message}))
    o = judge(RunSpec("r", "magneto", 0, 1e-3), run)
    assert o.verdict == "diverged" and o.diverged_step == 4  # not the last step, where the engine ended it
    assert o.reason.startswith("engine: the loss blew up and did not come back") and "non-finite" not in o.reason


def test_spike_rule_can_be_switched_off(tmp_path):
    _write_run(tmp_path / "r", [2.0, 1.9, 3.0, 5.0, 6.0, 9.0, 9.0, 1.0])
    o = judge(RunSpec("r", "magneto", 0, 1e-3), tmp_path / "r", Rules(explode_factor=0))
    assert o.verdict == "converged"  # the last 10% (one step, 1.0) is below 0.8 x the first loss


def test_a_loss_that_changes_form_mid_run_is_judged_phase_by_phase(tmp_path):
    """The speech recipe adds the transducer loss to CTC at step 300 (its head logs ``asr/phase``):
    the jump there is a new objective, not a divergence; a blow-up inside a phase still is."""
    losses = [20.0, 14.0, 12.0, 12.0, 60.0, 70.0, 55.0, 40.0, 10.0, 6.0, 5.0, 4.0]
    phases = [0.0] * 4 + [1.0] * 8
    run = tmp_path / "r"
    run.mkdir()
    lines = [{"step": 10 * (i + 1), "time": float(i), "loss": v, "asr/phase": ph}
             for i, (v, ph) in enumerate(zip(losses, phases))]
    lines.append({"step": 120, "time": 12.0, "eval/asr/wer": 15.0})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (run / "status.json").write_text(json.dumps({"status": "finished", "step": 120}))
    assert verdict.phase_starts(lines) == [50]
    assert judge(RunSpec("r", "magneto", 0, 1e-3), run, Rules(explode_factor=2.0)).verdict == "converged"
    for r in lines:  # the same losses without the phase marker: a spike against the first loss (20)
        r.pop("asr/phase", None)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    o = judge(RunSpec("r", "magneto", 0, 1e-3), run, Rules(explode_factor=2.0))
    assert o.verdict == "diverged" and o.diverged_step == 50
    # inside the second phase, a blow-up against that phase's first loss (50) is one
    assert verdict.loss_spike([50, 60, 70, 80, 90, 100, 110], [50.0, 40, 150, 160, 170, 180, 190], 2.0, [50])[:2] == (70, 5)


# ---------------------------------------------------------------------------- depth mode


def test_depth_mode(tmp_path, toy):
    recipe = toy(steps=3)
    out = tmp_path / "depth"
    code = depth.depth_compare(out, ["postln", "magneto"], [1, 2], [0], 3, 3e-3, in_process=True,
                                 recipe=recipe, command="foundation compare depth --depths 1,2")
    assert code == 0
    res = results(out)
    assert [(s["norm"], s["depth"]) for s in res["summary"]] == [("postln", 1), ("postln", 2), ("magneto", 1), ("magneto", 2)]
    for r in res["runs"]:
        cfg = OmegaConf.load(out / "runs" / r["name"] / "config.yaml")
        assert cfg.backbone.depth == cfg.backbone.decoder_depth == r["depth"] and cfg.backbone.norm == r["norm"]
        assert r["engine_status"] == "finished"
    report = (out / "report.md").read_text()
    header = next(line for line in report.splitlines() if line.startswith("| norm | 1L-1L"))
    assert header.split("|")[2:4] == [" 1L-1L ", " 2L-2L "]
    rows = [line for line in report.splitlines() if line.startswith("| postln |") or line.startswith("| magneto |")]
    assert len(rows) >= 2 and all("(loss " in row for row in rows[:2])
    assert (out / "depth.png").read_bytes()[:8] == PNG and (out / "curves.png").read_bytes()[:8] == PNG
    assert (out / "config.yaml").is_file()


def test_thousand_mode_figure(tmp_path, toy):
    """--thousand: the same runs at one depth, and a training-curve figure instead of depth.png."""
    out = tmp_path / "thousand"
    code = depth.depth_compare(out, ["deepnorm", "magneto"], [2], [0], 3, 3e-3, in_process=True, thousand=True,
                                 recipe=toy(steps=3))
    assert code == 0
    assert (out / "thousand.png").read_bytes()[:8] == PNG and not (out / "depth.png").exists()
    report = (out / "report.md").read_text()
    assert report.startswith("# 4-layer training (2L-2L)") and "| deepnorm |" in report and "| magneto |" in report
    assert depth.depth_recipe(100, 3e-3, thousand=True)["train"]["batch_size"] == depth.THOUSAND["batch_size"]


# ---------------------------------------------------------------------------- command line


@pytest.mark.parametrize("argv, message", [
    (["missing.yaml"], "config file not found: missing.yaml"),
    (["{config}", "--norms", "preln,rmsnorm"], "unknown norm 'rmsnorm'"),
    (["{config}", "--lrs", "1e-3,fast"], "--lrs: 'fast' is not a number"),
    (["{config}", "--lrs", "1e-3,-1"], "--lrs: '-1' must be a positive number"),
    (["{config}", "--seeds", "0"], "--seeds: the count must be >= 1"),
    (["{config}", "backbone.norm=postln"], "use --norms instead"),
    (["{config}", "optim.lr=1"], "use --lrs instead"),
    (["{config}", "train.stepz=3"], "stepz"),
    (["depth", "--norms", "magneto,foo"], "unknown norm 'foo'"),
    (["depth", "--depths", "6,x"], "--depths: 'x' is not a whole number"),
    (["depth", "--thousand", "--depths", "6"], "leave out --depths"),
    (["{config}", "--converge-ratio", "1.5"], "--converge-ratio must be in (0, 1]"),
])
def test_command_line_errors(tmp_path, capsys, argv, message, toy, write_config):
    """Through `foundation compare ...`: `compare depth` is its own registered command."""
    from foundation import cli

    config = write_config(toy())
    code = cli.main(["compare", *(a.replace("{config}", str(config)) for a in argv)])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_registered_in_the_cli(capsys):
    from foundation import cli

    with pytest.raises(SystemExit):
        cli.main(["compare", "--help"])
    text = capsys.readouterr().out
    assert "foundation compare configs/seq2seq/tiny.yaml" in text and "--lrs" in text
    with pytest.raises(SystemExit):
        cli.main(["compare", "depth", "--help"])
    text = capsys.readouterr().out
    assert "--thousand" in text and "--depths" in text


def test_norm_and_seed_placeholders_in_overrides():
    from studies.compare import Runner, grid, per_run

    assert per_run(["init_from=runs/c/runs/{norm}_lr0.001_seed{seed}/best/model.safetensors", "train.steps=5"],
                   "preln", 1) == ["init_from=runs/c/runs/preln_lr0.001_seed1/best/model.safetensors", "train.steps=5"]
    runner = Runner(Path("x.yaml"), Path("out"), ["init_from=v/{norm}/{seed}.safetensors"])
    got = [next(o for o in runner.run_overrides(s) if o.startswith("init_from")) for s in grid(["preln", "magneto"], [0, 1], [1e-3])]
    assert got == [f"init_from=v/{n}/{s}.safetensors" for n in ("preln", "magneto") for s in (0, 1)]


def test_a_config_with_an_lr_per_norm_runs_each_norm_at_its_own(tmp_path):
    """Without --lrs every norm runs at the lr the config gives it: the speech recipe's
    ``${by_norm:{magneto: 8.0e-3, preln: 4.0e-3}}`` is not flattened to one norm's value."""
    lrs = compare.config_lrs("configs/asr/tiny.yaml", [], ["preln", "magneto"], 0)
    assert lrs == {"preln": 4.0e-3, "magneto": 8.0e-3}
    specs = compare.grid(["preln", "magneto"], [0, 1], lrs)
    assert [(s.name, s.lr) for s in specs] == [("preln_lr0.004_seed0", 4e-3), ("preln_lr0.004_seed1", 4e-3),
                                               ("magneto_lr0.008_seed0", 8e-3), ("magneto_lr0.008_seed1", 8e-3)]
    assert "optim.lr=0.008" in specs[-1].overrides and compare.lr_values(lrs) == [4e-3, 8e-3]
    # a config with one lr: the same value under every norm
    assert compare.config_lrs("configs/seq2seq/tiny.yaml", [], ["preln", "magneto"], 0) == {"preln": 5e-3, "magneto": 5e-3}
