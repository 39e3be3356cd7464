"""Metrics writers (jsonl, csv, TensorBoard, a user's own ``module:Class``), the one-line
error for a task whose install extra is missing, and ``${by_norm:...}`` in configs."""
from __future__ import annotations

import csv
import sys
import textwrap

import pytest

from foundation.config import ConfigError
from foundation.engine import task as task_module
from foundation.engine.config import load_config
from support import read_records, run_config as run

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from test_engine import tiny_config  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def csv_rows(run_dir):
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_csv_holds_every_scalar_of_the_jsonl_and_resumes_like_it(tmp_path):
    cfg = tiny_config(tmp_path, train={"steps": 8}, save={"every": 4}, log={"writers": ["jsonl", "csv"]})
    run(cfg, "run_name=straight")
    rows = csv_rows(tmp_path / "straight")
    losses = {r["step"]: r["loss"] for r in read_records(tmp_path / "straight") if "loss" in r}
    assert {int(r["step"]): float(r["value"]) for r in rows if r["name"] == "loss"} == losses
    assert {r["name"] for r in rows} >= {"loss", "lr", "eval/seq2seq/exact_match"}

    run(cfg, "run_name=split", "train.stop_at=4")
    with open(tmp_path / "split" / "metrics.csv", "a") as f:  # written after the checkpoint, before a kill
        f.write("5,0,loss,99.0\n")
    run(cfg, "run_name=split", "resume=true")
    split = [r for r in csv_rows(tmp_path / "split") if r["name"] == "loss"]
    assert [(r["step"], r["value"]) for r in split] == [
        (r["step"], r["value"]) for r in rows if r["name"] == "loss"]  # the torn-off step 5 is gone


class Recorder:
    """A writer of a user's own, named in the config as module:Class."""

    seen: list = []

    def __init__(self, run_dir, resume_step):
        self.run_dir = run_dir

    def write(self, step, record):
        Recorder.seen.append((step, record.get("loss")))

    def close(self):
        Recorder.seen.append("closed")


def test_a_writer_of_your_own_by_module_and_class(tmp_path):
    Recorder.seen = []
    run(tiny_config(tmp_path, train={"steps": 3}, log={"writers": ["jsonl", "test_metrics_log:Recorder"]}))
    assert [s for s, loss in Recorder.seen[:3]] == [1, 2, 3] and Recorder.seen[-1] == "closed"


@pytest.mark.parametrize("writers, message", [
    (["csv"], "must include jsonl"),
    (["jsonl", "nope"], "unknown writer 'nope'"),
    (["jsonl", "no_such_module_x:W"], "cannot load writer"),
])
def test_bad_writers_are_named(tmp_path, writers, message):
    with pytest.raises(ConfigError, match=message):
        run(tiny_config(tmp_path, log={"writers": writers}))


def test_a_missing_extra_is_one_line_naming_it(tmp_path, monkeypatch):
    """A task package whose third-party packages are absent fails when the config is read."""
    pkg = tmp_path / "foundation_tasks_fake" / "needs_extra"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text(textwrap.dedent("""\
        from foundation.engine.task import require_extra

        require_extra("speech", "no_such_module_for_the_test", "json")
        raise AssertionError("not reached: the check comes first")
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(task_module, "TASKS_PACKAGE", "foundation_tasks_fake")
    with pytest.raises(task_module.MissingExtra) as e:
        task_module.get_task("needs_extra")
    text = str(e.value)
    assert "\n" not in text and "task 'needs_extra' needs no_such_module_for_the_test" in text
    assert "pip install 'foundation-suite[speech]'" in text and "json" not in text.split("(")[0]


def test_by_norm_picks_the_value_of_the_config_norm(tmp_path):
    path = tmp_path / "c.yaml"
    cfg = tiny_config(tmp_path)
    import yaml

    cfg["optim"]["lr"] = "${by_norm:{magneto: 0.005, preln: 0.003}}"
    cfg["run_name"] = "r-${backbone.norm}"
    path.write_text(yaml.safe_dump(cfg))
    magneto, _ = load_config(path, check_data=False)
    preln, _ = load_config(path, ["backbone.norm=preln"], check_data=False)
    assert (magneto.optim.lr, magneto.run_name) == (0.005, "r-magneto")
    assert (preln.optim.lr, preln.run_name) == (0.003, "r-preln")
    with pytest.raises(ConfigError, match=r"optim.lr.*no value for backbone.norm='postln'"):
        load_config(path, ["backbone.norm=postln"], check_data=False)
