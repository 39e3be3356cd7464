"""The one reader of a run directory (studies/runs.py) and the studies that read through it:
the MIM table (studies/mim.py), the vision-language table (studies/vl_table.py)."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

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


# ---------------------------------------------------------------------------- owners of run and output folders


HOLD = """
import sys, time
from pathlib import Path
from foundation.engine.distributed import Env
from foundation.engine.rundir import RunDir
with RunDir(sys.argv[1], Env(0, 1, 0, None, False)):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
    if len(sys.argv) > 3:  # the run ends: its status, then its lock
        (Path(sys.argv[1]) / "status.json").write_text(sys.argv[3])
"""


@contextlib.contextmanager
def held(folder: Path, seconds: float = 600, status: str | None = None):
    """Another process holding ``folder``'s lock (for ``seconds``, then writing ``status``)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), str(seconds), *([status] if status else [])],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_overwrite_never_deletes_a_run_that_another_process_holds(tmp_path, capsys, toy, write_config):
    """`compare --overwrite` takes a run's lock before emptying its directory: a run another
    process is training is refused in one line and left as it is."""
    from studies import compare

    out = tmp_path / "cmp"
    run_dir = out / "runs" / compare.run_name("magneto", 3e-3, 0)
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    with held(run_dir) as holder:
        code = compare.main([str(write_config(toy(steps=2))), "--norms", "magneto", "--out", str(out),
                             "--overwrite", "--in-process"])
    assert code == 0 and (run_dir / "metrics.jsonl").read_text() == '{"step": 1, "loss": 1.0}\n'
    lines = [line for line in capsys.readouterr().out.splitlines() if "in use" in line]
    assert len(lines) == 1 and f"pid {holder.pid}" in lines[0] and "failed" in lines[0] and "not replaced" in lines[0]
    assert json.loads((out / "results.json").read_text())["runs"][0]["verdict"] == "failed"


def test_a_second_compare_into_one_output_folder_is_refused(tmp_path, capsys, toy, write_config):
    """One `foundation compare` per output folder: a second one (the same command in another
    terminal) is refused in one line, exit 5, before it trains or reports anything."""
    from studies import compare

    out = tmp_path / "cmp"
    with held(out) as holder:
        code = compare.main([str(write_config(toy(steps=2))), "--norms", "magneto", "--out", str(out), "--in-process"])
    assert code == 5
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"pid {holder.pid}" in err and "--out" in err
    assert sorted(p.name for p in out.iterdir()) == [".lock"]


def test_a_rerun_waits_for_a_run_still_held_and_judges_it_by_its_status(tmp_path, monkeypatch):
    """A run that another process still holds (left by a killed study) is waited for, then
    judged by the status.json it wrote, not trained again nor marked failed."""
    monkeypatch.setattr(runs, "train", lambda *a, **k: pytest.fail("a held run was trained again"))
    said = []
    run_dir = tmp_path / "run"
    with held(run_dir, 1.0, json.dumps({"status": "finished", "step": 2})):
        assert runs.ensure(Path("cfg.yaml"), [], run_dir, say=said.append, head="[1/1] run") is None
    assert "waiting for it to end" in said[0] and said[-1] == "[1/1] run: finished earlier, skipped"


def test_a_run_that_fails_is_said_to_have_failed(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "train", lambda *a, **k: "exit code 2: foundation train: error: ...")
    said = []
    assert runs.ensure(Path("cfg.yaml"), [], tmp_path / "run", say=said.append, head="  run").startswith("exit code 2")
    assert said[0] == "  run: training ..." and said[-1].startswith("  run: failed in ")
    monkeypatch.setattr(runs, "train", lambda *a, **k: "")
    runs.ensure(Path("cfg.yaml"), [], tmp_path / "other", say=said.append, head="  other")
    assert said[-1].startswith("  other: done in ")


PARENT = """
import sys
from pathlib import Path
from studies import runs
runs.launch(Path(sys.argv[1]), sys.argv[3:], Path(sys.argv[2]))
"""


def test_a_killed_study_takes_its_training_child_with_it(tmp_path, toy, write_config):
    """kill -9 of a study's process ends the `foundation train` it started (no run trains on
    alone to be found locked, and judged failed, by the re-run)."""
    run_dir = tmp_path / "out" / "run"
    config = write_config(toy(steps=10**6, eval_every=0))
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(config), str(tmp_path / "train.log"),
                               f"output_dir={run_dir.parent}", "run_name=run"])
    child = None
    try:
        deadline = time.monotonic() + 120
        while child is None and time.monotonic() < deadline:  # the engine names itself in the run's lock
            text = (run_dir / ".lock").read_text() if (run_dir / ".lock").is_file() else ""
            child = int(text.split()[1]) if text.startswith("pid ") else None
            time.sleep(0.2)
        assert child is not None, (tmp_path / "train.log").read_text()
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 30
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(child)
    finally:
        parent.kill()
        if child is not None and _alive(child):
            os.kill(child, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended (its parent is gone; init reaps it)
