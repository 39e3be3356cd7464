"""`foundation compare guard`: the guard's rule replayed on a stability study's logged updates."""
from __future__ import annotations

import json
from pathlib import Path

from studies import guard_eval


def write_run(root: Path, task: str, name: str, rates: dict[int, float], lr: float = 0.01) -> str:
    run = root / task / "24L" / "runs" / name
    run.mkdir(parents=True)
    lines = [json.dumps({"step": s, "time": 0.0, "loss": 1.0, "lr": lr, "update/output": rate * lr})
             for s, rate in sorted(rates.items())]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return str(run)


def study(tmp_path: Path) -> Path:
    steady = {s: 1.0 for s in range(2, 101, 2)}
    runs = [
        # diverges at step 90, its update jumping 10x from step 60 on: warned 30 steps ahead
        ("seq2seq", "postln_lr1_seed0", "postln", "diverged", 90, {**steady, **{s: 10.0 for s in range(60, 101, 2)}}),
        # diverges at step 40, jumping only at step 30: warned 10 steps ahead (too late for the bar)
        ("seq2seq", "postln_lr3_seed0", "postln", "diverged", 40, {**steady, **{s: 10.0 for s in range(30, 101, 2)}}),
        # converges, steady: no alarm
        ("seq2seq", "preln_lr1_seed0", "preln", "converged", None, steady),
        # converges with one 5x spike: an alarm at factor 4, none at factor 6
        ("classification", "preln_lr1_seed0", "preln", "converged", None, {**steady, 50: 5.0}),
    ]
    out = tmp_path / "study"
    records = []
    for task, name, norm, verdict, at, rates in runs:
        records.append({"name": name, "norm": norm, "seed": 0, "lr": 0.01, "verdict": verdict, "diverged_step": at,
                        "run_dir": write_run(out, task, name, rates)})
    (out / "results.json").write_text(json.dumps({"tasks": [], "runs": records}))
    return out


def test_leads_misses_and_false_alarms_are_counted_on_replayed_series(tmp_path):
    runs = guard_eval.load_study(study(tmp_path))
    assert {r.task for r in runs} == {"seq2seq", "classification"} and len(runs[0].steps) == 50
    s = guard_eval.score(runs, guard_eval.Setting(factor=4.0, window=20, warmup=5, every=2))
    assert (s["diverged"], s["warned_early"], s["misses"], s["median_lead"]) == (2, 1, 0, 20.0)  # leads 30 and 10
    assert (s["converged"], s["false_alarms"]) == (2, 1)
    s6 = guard_eval.score(runs, guard_eval.Setting(factor=6.0, window=20, warmup=5, every=2))
    assert s6["false_alarms"] == 0 and s6["warned_early"] == 1
    # measuring every 10 steps sees the step-30 jump at step 30 and the spike at 50 still
    s10 = guard_eval.score(runs, guard_eval.Setting(factor=4.0, window=20, warmup=2, every=10))
    assert s10["median_lead"] == 20.0 and s10["false_alarms"] == 1


def test_the_command_writes_its_report_and_figure(tmp_path, capsys):
    out = study(tmp_path)
    assert guard_eval.main([str(out), "--search", "--factor", "6"]) == 0
    text = (out / "guard.md").read_text()
    assert "| seq2seq | postln | 2 | 1 (50 %) | 20 | 0 | 0 | 0 (-) |" in text
    assert "| classification | preln | 0 | 0 (-) | - | 0 | 1 | 0 (0 %) |" in text
    assert "## Every setting of the grid" in text and (out / "guard.png").stat().st_size > 0
    assert json.loads((out / "guard.json").read_text())["score"]["false_alarms"] == 0


def test_a_study_without_measurements_is_one_line(tmp_path):
    import pytest

    (tmp_path / "results.json").write_text(json.dumps({"tasks": [], "runs": []}))
    with pytest.raises(SystemExit, match="guard.mode=warn"):
        guard_eval.load_study(tmp_path)
    with pytest.raises(SystemExit, match="results.json not found"):
        guard_eval.load_study(tmp_path / "nowhere")


def test_the_onset_is_where_the_loss_blew_up_not_where_the_run_ended(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    losses = {s: (2.0 if s < 50 else 9.0) for s in range(2, 101, 2)}
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": v}) + "\n" for s, v in losses.items()))
    assert guard_eval.onset(run, fallback=100) == 50  # the engine dated it at the end (100)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 2.0}) + "\n" for s in range(2, 101, 2))
                                       + json.dumps({"step": 30, "event": "nonfinite", "what": "loss"}) + "\n")
    assert guard_eval.onset(run, fallback=100) == 30
    (run / "metrics.jsonl").write_text(json.dumps({"step": 2, "loss": 2.0}) + "\n")
    assert guard_eval.onset(run, fallback=7) == 7


def test_the_rule_replays_on_another_logged_signal(tmp_path):
    """--signal grad_norm: the same rule on the gradient norm as logged (not per unit lr), at the
    guard's measured steps; its own report files, the default's left alone."""
    out = study(tmp_path)
    for line_file in out.rglob("metrics.jsonl"):  # a gradient norm that jumps 10x at step 70 in every run
        rows = [json.loads(x) for x in line_file.read_text().splitlines()]
        for r in rows:
            r["grad_norm"] = 10.0 if r["step"] >= 70 else 1.0
        line_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    runs = guard_eval.load_study(out, "grad_norm")
    assert {tuple(r.lrs) for r in runs} == {(0.0,) * 50} and runs[0].updates[-1] == 10.0
    s = guard_eval.score(runs, guard_eval.Setting(factor=4.0, window=20, warmup=5, every=2))
    # the step-90 divergence warned 20 ahead; the step-40 one missed; both converged runs "alarmed" at 70
    assert (s["warned_early"], s["misses"], s["false_alarms"]) == (1, 1, 2)
    assert guard_eval.main([str(out), "--signal", "grad_norm"]) == 0
    assert "judges `grad_norm`" in (out / "guard-grad_norm.md").read_text()
    assert (out / "guard-grad_norm.png").is_file() and not (out / "guard.md").exists()


def test_the_loss_rule_is_replayed_beside_the_update_as_the_engine_has_it(tmp_path):
    """A run whose update stays level while its loss triples from step 70: the loss rule
    (``--loss-factor``, the engine's guard.loss_factor, on the median of the last 3 logged losses)
    fires at 72, once two of them are high; the update rule alone never fires."""
    out = tmp_path / "study"
    run = out / "seq2seq" / "12L" / "runs" / "deepnorm_lr1_seed0"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "time": 0.0, "loss": 3.0 if s >= 70 else 1.0, "lr": 0.01, "update/output": 0.01}) + "\n"
        for s in range(2, 101, 2)))
    (out / "results.json").write_text(json.dumps({"tasks": [], "runs": [
        {"name": run.name, "norm": "deepnorm", "seed": 0, "lr": 1.0, "verdict": "diverged", "diverged_step": 80,
         "run_dir": str(run)}]}))
    runs = guard_eval.load_study(out)
    assert runs[0].losses[-1] == 3.0 and len(runs[0].losses) == len(runs[0].steps)
    both, alone = guard_eval.Setting(4.0, 20, 5, 2, loss_factor=2.0), guard_eval.Setting(4.0, 20, 5, 2)
    assert guard_eval.first_firing(runs[0], both) == 72 and guard_eval.first_firing(runs[0], alone) is None
    assert guard_eval.main([str(out), "--loss-factor", "0"]) == 0
    assert "| **all** |  | 1 | 0 (0 %) | - | 1 |" in (out / "guard.md").read_text()
    assert guard_eval.main([str(out)]) == 0  # the engine's default: loss factor 3
    assert "loss factor 3" in (out / "guard.md").read_text()


def test_the_attention_rule_replays_on_the_logits_the_guard_logged(tmp_path, capsys):
    import math

    import pytest

    def logits(grows_from: int | None = None, rate: float = 0.0) -> dict[int, float]:
        return {s: 5.0 * math.exp(rate * max(0, s - grows_from)) if grows_from else 5.0 for s in range(2, 101, 2)}

    out = tmp_path / "study"
    records = []
    for name, verdict, at, series in [
        ("preln_lr3_seed0", "diverged", 60, logits(20, 0.3)),  # the rule fires at step 24: 36 ahead
        ("preln_lr1_seed0", "diverged", 40, logits(30, 0.3)),  # at 34: 6 ahead, too late for the bar
        ("preln_lr0.01_seed0", "converged", None, logits(10, 0.1)),  # sharpening slowly: quiet at 0.2, not at 0.05
        ("magneto_lr0.01_seed0", "converged", None, logits()),
    ]:
        run = out / "seq2seq" / "12L" / "runs" / name
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text("".join(  # as the guard logs it: no update/output at these steps
            json.dumps({"step": s, "time": 0.0, "loss": 1.0, "lr": 0.01, "attention/logit_max": v}) + "\n"
            for s, v in series.items()))
        records.append({"name": name, "norm": name.split("_")[0], "seed": 0, "lr": 0.01, "verdict": verdict,
                        "diverged_step": at, "run_dir": str(run)})
    (out / "results.json").write_text(json.dumps({"tasks": [], "runs": records}))
    runs = guard_eval.load_study(out, guard_eval.ATTENTION)
    assert len(runs) == 4 and all(len(r.steps) == 50 for r in runs)
    s = guard_eval.score(runs, guard_eval.Setting(4.0, 20, 5, 2, rate=0.2, span=4))
    assert (s["diverged"], s["warned_early"], s["median_lead"], s["false_alarms"]) == (2, 1, 21.0, 0)
    assert guard_eval.score(runs, guard_eval.Setting(4.0, 20, 5, 2, rate=0.05, span=4))["false_alarms"] == 1
    assert guard_eval.main([str(out), "--signal", guard_eval.ATTENTION, "--search"]) == 0
    text = (out / "guard-attention_logit_max.md").read_text()
    assert "## The setting asked for (rate 0.2, span 4, every 2)" in text and "largest attention logit" in text
    assert "| seq2seq | preln | 2 | 1 (50 %) | 21 | 0 | 1 | 0 (0 %) |" in text
    assert (out / "guard-attention_logit_max.png").stat().st_size > 0
    with pytest.raises(SystemExit, match="logged update/output"):  # the update rule: nothing logged for it
        guard_eval.load_study(out)
    assert guard_eval.main([str(out), "--signal", guard_eval.ATTENTION, "--rate", "0"]) == 2
