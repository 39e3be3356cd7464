"""Adding a task touches only its folder and its config: a throw-away task with its own demo
data set and recipe is found by `foundation data make`, `foundation demo --only` and the studies,
with no table anywhere else naming it."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import yaml

import foundation_tasks

NAME = "throwaway_reverse"  # a task name no real task takes

TASK = '''\
"""A throw-away task for the test: seq2seq's reversal under its own name."""
from foundation.engine.task import register_task
from foundation_tasks.seq2seq.task import Seq2Seq


@register_task("{name}")
class ThrowawayReverse(Seq2Seq):
    pass
'''

DEMO = '''\
"""Writes reversal pairs in seq2seq's file layout."""
from foundation.engine.demo_cli import demo_parser
from foundation_tasks.seq2seq.data import generate, write_split

DEMO_DATA = {{"name": "{name}", "folder": "{name}-demo"}}


def main(argv=None):
    a = demo_parser("{name}", "reversal pairs").parse_args(argv)
    for split, n, seed in (("train", 256, a.seed), ("valid", 32, a.seed + 1)):
        write_split(a.out, split, generate("reverse", n, 8, 3, 6, seed))
    return 0
'''

RECIPE = '''\
from foundation.engine.recipe import Recipe

RECIPE = Recipe(task="{name}", config={config!r}, metric="exact_match", scale=100, rank=99,
                label="throw-away reversal (exact match %)", data="{name}",
                data_field="tasks.{name}.data_dir", steps=6, minutes=0.1)
'''


@pytest.fixture
def throwaway_task(tmp_path):
    """The task's folder in the task package (where a new task goes), removed afterwards."""
    folder = Path(foundation_tasks.__path__[0]) / NAME
    assert not folder.exists(), f"{folder} is left from an interrupted test run: remove it"
    config = tmp_path / "configs" / f"{NAME}.yaml"
    config.parent.mkdir()
    config.write_text(yaml.safe_dump({
        "run_name": f"{NAME}-${{backbone.norm}}",
        "backbone": {"arch": "encoder_decoder", "dim": 16, "depth": 1, "heads": 2, "ffn_dim": 32},
        "tasks": [{"name": NAME, "vocab_size": 8, "data_dir": "data/nowhere"}],
        "train": {"steps": 6, "batch_size": 8}, "eval": {"batch_size": 16},
        "log": {"progress": False, "writers": ["jsonl"]}}))
    folder.mkdir()
    try:
        (folder / "__init__.py").write_text(TASK.format(name=NAME))
        (folder / "demo.py").write_text(DEMO.format(name=NAME))
        (folder / "recipe.py").write_text(RECIPE.format(name=NAME, config=str(config)))
        yield folder
    finally:
        shutil.rmtree(folder)
        from foundation.engine.task import TASKS

        TASKS.pop(NAME, None)  # the registry and the module cache forget it, as a new process would
        for module in [m for m in sys.modules if m.startswith(f"foundation_tasks.{NAME}")]:
            del sys.modules[module]


def test_a_new_task_is_found_everywhere(throwaway_task, tmp_path, capsys):
    from foundation import cli
    from foundation.engine.demo_cli import demo_data_sets
    from studies import demo
    from studies.recipes import recipes

    assert demo_data_sets()[NAME].folder == f"{NAME}-demo"
    assert cli.main(["data", "make", NAME, "--out", str(tmp_path / "made")]) == 0
    assert (tmp_path / "made" / "train.src").read_text().count("\n") == 256
    assert NAME in [r.task for r in recipes()] and NAME in [s.stage_name for s in demo.stages()]

    data, out = tmp_path / "data", tmp_path / "demo"
    rc = demo.main(["--only", NAME, "--data", str(data), "--out", str(out), "--jobs", "1"])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert (data / f"{NAME}-demo" / "valid.tgt").is_file()  # made by its own generator, into its own folder
    row = next(line for line in (out / "summary.md").read_text().splitlines() if "throw-away reversal" in line)
    assert len([c for c in row.split("|") if c.strip()]) >= 4  # a number per norm
    for norm in ("preln", "magneto"):  # each run was the recipe's config under that norm
        config = yaml.safe_load(next((out / NAME / "runs").glob(f"{norm}_*/config.yaml")).read_text())
        assert config["backbone"]["norm"] == norm and config["tasks"][0]["data_dir"].endswith(f"{NAME}-demo")
