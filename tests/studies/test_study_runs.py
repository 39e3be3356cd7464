"""The one reader of a run directory (studies/runs.py) and the studies that read through it:
the MIM table (studies/mim.py), the vision-language table (studies/vl_table.py)."""
from __future__ import annotations

import json
from pathlib import Path

from studies import runs


def write_metrics(run_dir: Path, records: list[dict], tail: str = "") -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + tail)


def test_reader_last_evaluation_curves_and_a_torn_line(tmp_path):
    write_metrics(tmp_path, [
        {"step": 1, "loss": 2.0}, {"step": 2, "loss": "nan", "skipped": True}, {"step": 2, "event": "nonfinite"},
        {"step": 3, "loss": 1.0, "eval/t/acc": 0.25}, {"step": 4, "loss": 0.5},
        {"step": 4, "eval/t/acc": 0.5, "eval/t/loss": "inf"}], tail='{"step": 5, "lo')  # a line cut by a kill
    records = runs.read_records(tmp_path)
    assert len(records) == 6
    assert runs.last_eval(records) == (4, {"t/acc": 0.5, "t/loss": float("inf")})
    assert runs.train_losses(records) == ([1, 3, 4], [2.0, 1.0, 0.5])
    assert runs.eval_series(records, "t/acc") == ([3, 4], [0.25, 0.5])
    assert runs.read_records(tmp_path / "none") == [] and runs.last_eval([]) == (None, {})
    try:
        runs.read_records(tmp_path / "none", required=True)
    except FileNotFoundError as e:
        assert "is " in str(e) and "a run directory" in str(e)
    else:
        raise AssertionError("required=True: a missing metrics.jsonl is an error")
    assert runs.status(tmp_path) is None
    (tmp_path / "status.json").write_text(json.dumps({"status": "finished", "step": 4}))
    assert runs.status(tmp_path) == "finished"


def test_mim_study_reads_final_evaluations(tmp_path):
    from studies.mim import final_eval, table

    run_dir = tmp_path / "run"
    write_metrics(run_dir, [{"step": 100, "eval/classification/top1": 0.5}, {"step": 150, "loss": 1.0},
                            {"step": 200, "eval/classification/top1": 0.4}])
    assert final_eval(run_dir, "classification/top1") is None  # not finished: no status.json
    (run_dir / "last").write_text("ckpt/step_000200\n")
    assert final_eval(run_dir, "classification/top1") is None  # a checkpoint pointer is not the end of a run
    (run_dir / "status.json").write_text('{"status": "finished"}')
    assert final_eval(run_dir, "classification/top1") == 0.4  # the final evaluation, not the best
    results = {(n, i): [0.5, 0.25] for n in ("magneto", "preln") for i in ("scratch", "MIM")}
    text = table(results, [0, 1], "x")
    assert "| Magneto | MIM | 37.5 | 50.0 / 25.0 |" in text and "| Pre-LN (ViT) | scratch |" in text


def test_vl_table_reads_the_last_evaluation(tmp_path):
    from studies.vl_table import finished, last_eval

    run_dir = tmp_path / "vqa-magneto-scratch-s0"
    assert last_eval(run_dir) is None and not finished(run_dir)
    write_metrics(run_dir, [{"step": 5, "eval/vqa/vqa_accuracy": 0.2}, {"step": 10, "loss": 1.0}])
    (run_dir / "config.yaml").write_text("train:\n  steps: 10\n")
    assert last_eval(run_dir) == (5, {"vqa/vqa_accuracy": 0.2}) and not finished(run_dir)
    write_metrics(run_dir, [{"step": 5, "eval/vqa/vqa_accuracy": 0.2}, {"step": 10, "eval/vqa/vqa_accuracy": 0.3}])
    assert last_eval(run_dir) == (10, {"vqa/vqa_accuracy": 0.3}) and not finished(run_dir)  # the engine says when
    (run_dir / "status.json").write_text('{"status": "stopped"}')
    assert not finished(run_dir)
    (run_dir / "status.json").write_text('{"status": "finished"}')
    assert finished(run_dir)


def test_a_run_started_by_a_study_never_imports_the_working_directory(tmp_path, monkeypatch):
    """Studies start each run as its own process; files of the user's beside them (a tasks.py
    as Invoke and Celery write, a studies/ folder) are not imported in place of the project's."""
    marker = tmp_path / "executed"
    for name in ("tasks.py", "foundation_tasks.py"):
        (tmp_path / name).write_text(f"open({str(marker)!r}, 'w').write({name!r})\n")
    (tmp_path / "studies").mkdir()
    (tmp_path / "studies" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('studies')\n")
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "out" / "run"
    failure = runs.train(Path("seq2seq/tiny"), ["train.steps=2", "eval.every=0", "log.progress=false",
                                                f"output_dir={run_dir.parent}", "run_name=run"], run_dir)
    assert failure == "" and runs.status(run_dir) == "finished"
    assert not marker.exists(), marker.read_text()
