"""The `foundation` command from any directory: shipped configs by name or by the README's
`configs/...` paths, runs written where the user points; the configs travel in the package."""
from __future__ import annotations

import fnmatch
import os
import subprocess
import sys
from pathlib import Path

import pytest

from foundation.config import ConfigError
from foundation.engine.config import find_config, shipped_configs_dir

REPO = Path(__file__).resolve().parents[1]


def test_shipped_config_by_name_and_by_readme_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # outside the clone: configs/ does not exist here
    want = (shipped_configs_dir() / "vision" / "tiny_finetune.yaml").resolve()
    for name in ("vision/tiny_finetune", "vision/tiny_finetune.yaml",
                 "configs/vision/tiny_finetune.yaml"):
        assert find_config(name).resolve() == want, name
    # a file in the current directory wins over a shipped config of the same name
    (tmp_path / "vision").mkdir()
    (tmp_path / "vision" / "tiny_finetune.yaml").write_text("run_name: mine\n")
    assert find_config("vision/tiny_finetune.yaml") == Path("vision/tiny_finetune.yaml")
    with pytest.raises(ConfigError, match="config file not found: vision/nope.*shipped config"):
        find_config("vision/nope")


def test_every_config_is_package_data():
    """setup.py ships configs/ as `foundation_configs` with these patterns: a config of
    another type would be missing from an installed package."""
    import ast

    tree = ast.parse((REPO / "setup.py").read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
    data = ast.literal_eval(next(k.value for k in call.keywords if k.arg == "package_data"))["foundation_configs"]
    files = [p.relative_to(REPO / "configs").as_posix() for p in (REPO / "configs").rglob("*")
             if p.is_file() and "__pycache__" not in p.parts]
    # setuptools' "**/" also matches the top folder
    missed = [f for f in files if not any(fnmatch.fnmatch(f, pat) or fnmatch.fnmatch(f, pat.replace("**/", ""))
                                          for pat in data)]
    assert files and not missed


def test_cli_trains_a_shipped_config_from_another_directory(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "foundation.cli", "train", "seq2seq/tiny", "train.steps=2", "eval.every=0",
           "log.progress=false", "log.writers=[jsonl]", "output_dir=runs"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "runs" / "seq2seq-tiny" / "best" / "model.safetensors").is_file()
    assert not (REPO / "runs" / "seq2seq-tiny").exists()
    bad = subprocess.run(cmd[:4] + ["seq2seq/nope"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "config file not found: seq2seq/nope" in bad.stderr
