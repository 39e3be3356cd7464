"""The core install (``pip install foundation-suite``, no extra) in a fresh virtual environment:
no mmseg, ESPnet, open_clip, torchaudio, matplotlib or TensorBoard, and still the backbone,
the engine and the tasks that need nothing more train; a task whose extra is missing stops at
start with one line naming the extra."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import venv
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
EXTRAS_ONLY = ("mmseg", "mmengine", "espnet2", "open_clip", "torchaudio", "matplotlib", "tensorboard", "sentencepiece")


def sh(*cmd, cwd=None, check=True):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["OMP_NUM_THREADS"] = "1"
    p = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=1200)
    if check and p.returncode:
        raise AssertionError(f"{' '.join(map(str, cmd))} -> {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def core_closure(here: dict) -> set[str]:
    """The distributions the core install pulls in: foundation-suite's requirements with no
    extra, and theirs (with the extras they name), markers evaluated, read from this environment's
    metadata. The same set as ``pip install --dry-run --report`` pinned to these versions, without
    the ~45 s that pip spends asking the index."""
    todo, done = [("foundation-suite", "")], set()
    while todo:
        name, extra = todo.pop()
        if (name, extra) in done:
            continue
        done.add((name, extra))
        for line in here[name].requires or ():
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": extra}):
                todo += [(canonical(req.name), e) for e in ("", *sorted(req.extras))]
    return {name for name, _ in done}


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    """A fresh venv holding exactly what the core install resolves to. Its distributions are
    linked from this environment rather than installed again, because a second copy of a CUDA
    torch build (~5 GB with its nvidia libraries) fills a CI machine's disk."""
    root = tmp_path_factory.mktemp("core")
    venv.create(root / "venv", with_pip=True)
    py = root / "venv" / "bin" / "python"
    here = {canonical(d.metadata["Name"]): d for d in metadata.distributions()}
    resolved = core_closure(here)
    assert "foundation-suite" in resolved and "torch" in resolved, sorted(resolved)
    site = Path(sh(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    for name in resolved - {"foundation-suite"}:
        dist = here[name]
        for top in {Path(f).parts[0] for f in dist.files or ()} - {"..", "__pycache__"}:
            if not (site / top).exists():
                (site / top).symlink_to(Path(dist.locate_file(top)))
    sh(py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", REPO)
    yield root, py
    shutil.rmtree(root, ignore_errors=True)


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def test_core_alone_trains_seq2seq_and_classification(core):
    root, py = core
    bin_ = py.parent
    missing = sh(py, "-c", "import importlib.util as u; print(' '.join(m for m in %r if u.find_spec(m) is None))"
                 % (EXTRAS_ONLY,)).stdout.split()
    assert missing == list(EXTRAS_ONLY)  # the core pulled in none of the extras' packages
    work = root / "work"  # outside the clone: shipped configs by name
    work.mkdir()
    common = ["train.steps=3", "eval.max_batches=1", "log.progress=false"]
    out = sh(bin_ / "foundation", "train", "seq2seq/tiny", *common, cwd=work).stdout
    assert "finished at step 3" in out
    sh(bin_ / "foundation", "data", "make", "vision", "--out", "data/vision-demo", "--train-per-class", "4",
       "--val-per-class", "2", cwd=work)
    out = sh(bin_ / "foundation", "train", "vision/tiny_finetune", "init_from=null", "backbone.norm=preln",
             "train.batch_size=8", *common, cwd=work).stdout
    assert "finished at step 3" in out and (work / "checkpoints" / "vision-ft-tiny-preln" / "best").is_dir()
    # TensorBoard is in the default writers; without it the run says so once and logs to jsonl
    p = sh(bin_ / "foundation", "train", "seq2seq/tiny", "run_name=again", *common, cwd=work)
    assert "tensorboard is not installed" in p.stderr


def test_a_task_without_its_extra_stops_with_one_line(core):
    root, py = core
    p = sh(py.parent / "foundation", "train", "asr/tiny", cwd=root, check=False)
    assert p.returncode == 2, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert "task 'asr' needs espnet2" in last and "pip install 'foundation-suite[speech]'" in last, p.stderr
    assert "Traceback" not in p.stderr
