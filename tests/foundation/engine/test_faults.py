"""Fault injection: each defect of issue 16 ("runs that cannot corrupt each other or lie")
reproduced and checked. Two runs into one directory, a resume with a changed config or a
checkpoint that does not fit, non-finite learning rates and weights, bad files met
mid-run, a full disk, a torn log line, a truncated or malicious checkpoint, images of
every PIL mode, and the smaller reader cases. All CPU, tiny."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image
from safetensors.torch import load_file
from test_engine import records, run, tiny_config

from foundation import checkpoint
from foundation.checkpoint import CheckpointError
from foundation.config import ConfigError
from foundation.engine import cli, run_state
from foundation.engine.failure import EXIT_CODES, DiskFull, RunDirInUse, WriteFailed, write_failure

REPO = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}

pytestmark = pytest.mark.usefixtures("one_thread")


def write_config(tmp_path: Path, cfg: dict, name: str = "cfg.yaml") -> Path:
    path = tmp_path / name
    path.write_text(OmegaConf.to_yaml(OmegaConf.create(cfg)))
    return path


def snapshot(run_dir: Path) -> dict[str, str]:
    """{relative path: sha256} of every file of a run directory but its lock."""
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file() and p.name != ".lock"}


def status(run_dir: Path) -> dict:
    return json.loads((run_dir / "status.json").read_text())


def all_finite(path: Path) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in load_file(str(path)).values() if t.is_floating_point())


# ---------------------------------------------------------------------------- 1. one owner per run directory


HOLD = """
import sys, time
from foundation.engine.distributed import Env
from foundation.engine.rundir import RunDir
with RunDir(sys.argv[1], Env(0, 1, 0, None, False)):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_second_run_into_a_held_directory_is_refused_and_a_killed_holder_frees_it(tmp_path, capsys):
    cfg = tiny_config(tmp_path, train={"steps": 2})
    run_dir = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunDirInUse, match=f"in use by another run \\(pid {holder.pid} on "):
            run(cfg)
        assert snapshot(run_dir) == {}  # the refused run wrote nothing
        assert cli.train_main([str(write_config(tmp_path, cfg))]) == EXIT_CODES["locked"] == 5
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and f"pid {holder.pid}" in err
    finally:
        holder.send_signal(signal.SIGKILL)  # kill -9: the kernel drops the lock with the process
        holder.wait()
    assert run(cfg).status == "finished"


@pytest.mark.slow  # two training processes (~20 s on 2 cores); the test above checks the lock itself
def test_two_runs_started_at_once_never_mix(tmp_path):
    """Two `foundation train` processes, other seeds and lrs, one run directory: one trains,
    the other is refused in one line (in use, or already holding a run if it came late);
    the directory holds one run, its config and its records."""
    paths = [write_config(tmp_path, tiny_config(tmp_path, seed=seed, optim={"lr": lr}, train={"steps": 6},
                                                save={"every": 1}), f"cfg{seed}.yaml")
             for seed, lr in ((0, 5e-3), (7, 1e-2))]
    procs = [subprocess.Popen([sys.executable, "-m", "foundation.cli", "train", str(p)], env=ENV, cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for p in paths]
    outs = [p.communicate(timeout=300) for p in procs]
    codes = [p.returncode for p in procs]
    assert sorted(codes) in ([0, EXIT_CODES["locked"]], [0, EXIT_CODES["config"]]), outs
    loser = codes.index(0) ^ 1
    assert "Traceback" not in outs[loser][1] and outs[loser][1].strip().count("\n") == 0
    winner_seed = (0, 7)[codes.index(0)]
    run_dir = tmp_path / "run"
    assert OmegaConf.load(run_dir / "config.yaml").seed == winner_seed
    steps = [r["step"] for r in records(run_dir) if "loss" in r and "event" not in r]
    assert steps == list(range(1, 7))
    assert status(run_dir)["status"] == "finished"


# ---------------------------------------------------------------------------- 2, 3. resume compares configs


def test_resume_with_a_changed_lr_is_refused_and_changes_nothing(tmp_path):
    cfg = tiny_config(tmp_path, train={"steps": 8})
    run(cfg, "train.stop_at=4")
    before = snapshot(tmp_path / "run")
    with pytest.raises(ConfigError, match=r"1 field\(s\) differ .*optim.lr: 0.003 -> 0.001.*--allow-change optim.lr"):
        run(cfg, "resume=true", "optim.lr=1e-3")
    assert snapshot(tmp_path / "run") == before


def test_an_allow_change_key_that_names_no_field_is_refused(tmp_path, capsys):
    """`--allow-change bogus.key` was accepted silently (a typo: the change meant is then refused
    as if no flag were given); it names the key in one line and changes nothing."""
    path = write_config(tmp_path, tiny_config(tmp_path, train={"steps": 4}))
    assert cli.train_main([str(path), "train.stop_at=2"]) == 0
    before = snapshot(tmp_path / "run")
    capsys.readouterr()
    assert cli.train_main([str(path), "--resume", "--allow-change", "bogus.key"]) == EXIT_CODES["config"]
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--allow-change bogus.key: the config has no such field or section" in err
    assert snapshot(tmp_path / "run") == before
    # a section and a pattern name fields
    assert cli.train_main([str(path), "--resume", "--allow-change", "optim", "--allow-change", "log.*"]) == 0


def test_resume_with_an_allowed_lr_change_trains_with_it_and_records_it(tmp_path, capsys):
    """Steps 5-8 after `--resume optim.lr=1e-3 --allow-change optim.lr` use exactly the lrs
    of a run trained with 1e-3 from the start; config.yaml says 1e-3 and keeps the history."""
    path = write_config(tmp_path, tiny_config(tmp_path, train={"steps": 8}))
    assert cli.train_main([str(path), "train.stop_at=4"]) == 0
    assert cli.train_main([str(path), "--resume", "optim.lr=1e-3", "--allow-change", "optim.lr"]) == 0
    assert "with optim.lr: 0.003 -> 0.001 (--allow-change)" in capsys.readouterr().out
    straight = run(tiny_config(tmp_path, run_name="straight", optim={"lr": 1e-3}, train={"steps": 8}))
    lrs = {r["step"]: r["lr"] for r in records(tmp_path / "run") if "lr" in r}
    want = {r["step"]: r["lr"] for r in records(straight.run_dir) if "lr" in r}
    assert [lrs[s] for s in range(5, 9)] == pytest.approx([want[s] for s in range(5, 9)], rel=1e-12)
    text = (tmp_path / "run" / "config.yaml").read_text()
    assert "#   step 4: optim.lr: 0.003 -> 0.001" in text
    saved = OmegaConf.load(tmp_path / "run" / "config.yaml")
    assert saved.optim.lr == 1e-3 and list(saved.allow_change) == []
    change = next(r for r in records(tmp_path / "run") if r.get("event") == "config_change")
    assert change["step"] == 4 and change["field"] == "optim.lr" and change["new"] == 1e-3


def test_resume_refused_for_a_shape_mismatch_leaves_the_run_usable(tmp_path, capsys):
    cfg = tiny_config(tmp_path, train={"steps": 4})
    path = write_config(tmp_path, cfg)
    assert cli.train_main([str(path), "train.stop_at=2"]) == 0
    run_dir = tmp_path / "run"
    before = snapshot(run_dir)
    wider = ["backbone.dim=64", "backbone.ffn_dim=128", "--allow-change", "backbone"]
    assert cli.train_main([str(path), "--resume", *wider]) == EXIT_CODES["checkpoint"]
    err = capsys.readouterr().err
    assert "foundation train: error:" in err and "Traceback" not in err
    assert snapshot(run_dir) == before  # config.yaml, status.json ("stopped"), logs: all as they were
    assert cli.eval_main([str(run_dir / "config.yaml"), f"checkpoint={run_dir}", "--json"]) == 0


# ---------------------------------------------------------------------------- 5. non-finite lr and weights


@pytest.mark.parametrize("value", ["inf", ".inf", "-inf", "nan"])
def test_a_non_finite_learning_rate_is_refused(tmp_path, value):
    with pytest.raises(ConfigError, match="optim.lr.*finite"):
        run(tiny_config(tmp_path), f"optim.lr={value}")
    assert not (tmp_path / "run").exists()


def test_non_finite_init_from_weights_are_refused(tmp_path):
    from foundation import Backbone
    from foundation.engine.config import resolve

    cfg = tiny_config(tmp_path, train={"steps": 2, "max_nonfinite": 10}, eval={"every": 1})
    backbone = Backbone(resolve(cfg)[0].backbone)
    with torch.no_grad():
        backbone.encoder.layers[0].attn.qkv.weight[0, 0] = float("nan")
    checkpoint.save(backbone, tmp_path / "nan.safetensors")
    with pytest.raises(ConfigError, match="init_from.*NaN or inf"):
        run(cfg, f"init_from={tmp_path / 'nan.safetensors'}")
    run_dir = tmp_path / "run"
    assert not (run_dir / "best").exists() and not (run_dir / "ckpt").exists()
    assert status(run_dir)["status"] == "failed" and "NaN or inf" in status(run_dir)["message"]


def test_weights_that_become_non_finite_are_never_saved(tmp_path, monkeypatch):
    """An optimizer step that makes the weights NaN (as optim.lr=inf did) in a run shorter
    than max_nonfinite: the run ends "diverged" (exit 1), best/ and every checkpoint finite."""
    real_step = torch.optim.AdamW.step
    calls = []

    def poisoned(self, *a, **k):
        out = real_step(self, *a, **k)
        calls.append(1)
        if len(calls) == 3:
            with torch.no_grad():
                self.param_groups[0]["params"][0].fill_(float("inf"))
        return out

    monkeypatch.setattr(torch.optim.AdamW, "step", poisoned)
    path = write_config(tmp_path, tiny_config(tmp_path, train={"steps": 5, "max_nonfinite": 10},
                                              eval={"every": 1}, save={"every": 1, "keep": 10}))
    assert cli.train_main([str(path)]) == EXIT_CODES["diverged"]
    run_dir = tmp_path / "run"
    assert status(run_dir)["status"] == "diverged" and "weights are not finite" in status(run_dir)["message"]
    saved = sorted((run_dir / "ckpt").iterdir())
    assert [p.name for p in saved] == ["step_000001", "step_000002"]
    assert all(all_finite(p / "model.safetensors") for p in saved)
    assert all_finite(run_dir / "best" / "model.safetensors")
    assert (run_dir / "last").read_text().strip() == "ckpt/step_000002"


# ---------------------------------------------------------------------------- 6. failures: one line, status, exit code


def test_a_full_disk_is_named_and_recorded(tmp_path, monkeypatch, capsys):
    real_save = run_state.torch.save

    def full(obj, f, *a, **k):
        if "step_000004" in str(f):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(run_state.torch, "save", full)
    path = write_config(tmp_path, tiny_config(tmp_path, train={"steps": 6}, save={"every": 2}))
    assert cli.train_main([str(path)]) == EXIT_CODES["disk_full"]
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert err.startswith("foundation train: error: disk full: could not write ") and "step_000004/state.pt" in err
    run_dir = tmp_path / "run"
    info = status(run_dir)
    assert info["status"] == "failed" and info["failure"] == "disk_full" and info["exit_code"] == 6
    assert info["message"] in err and info["step"] == 4
    assert "OSError" in (run_dir / "error.log").read_text()  # the traceback, for whoever needs it
    assert not (run_dir / "ckpt" / ".tmp-step_000004").exists()  # the partial checkpoint's space given back
    assert (run_dir / "last").read_text().strip() == "ckpt/step_000002"


def test_torch_short_write_is_a_full_disk_when_space_is_low(tmp_path):
    """torch's zip writer says only "unexpected pos A vs B" when the disk fills up."""
    e = RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 195776 vs 195668")
    assert isinstance(write_failure(tmp_path / "state.pt", e, free=4096), DiskFull)
    other = write_failure(tmp_path / "state.pt", e, free=10 * 2**30)
    assert isinstance(other, WriteFailed) and "short write" in str(other)


def test_a_torn_last_line_of_metrics_is_dropped_on_resume(tmp_path, capsys):
    cfg = tiny_config(tmp_path, train={"steps": 6})
    run(cfg, "train.stop_at=3")
    log = tmp_path / "run" / "metrics.jsonl"
    log.write_text(log.read_text() + '{"step": 4, "loss": 2.07, "lr"')  # killed mid-write
    assert run(cfg, "resume=true").status == "finished"
    assert "metrics.jsonl: dropped its last line, torn by an interrupted write" in capsys.readouterr().err
    steps = [r["step"] for r in records(tmp_path / "run") if "loss" in r and "event" not in r]
    assert steps == list(range(1, 7))


def test_a_damaged_line_inside_metrics_is_named(tmp_path):
    cfg = tiny_config(tmp_path, train={"steps": 4})
    run(cfg, "train.stop_at=2")
    log = tmp_path / "run" / "metrics.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("\n".join(["{oops", *lines[1:]]) + "\n")
    with pytest.raises(CheckpointError, match="metrics.jsonl, line 1: not a JSON record"):
        run(cfg, "resume=true")


def test_a_truncated_safetensors_as_init_from(tmp_path, capsys):
    from foundation import Backbone
    from foundation.engine.config import resolve

    cfg = tiny_config(tmp_path)
    checkpoint.save(Backbone(resolve(cfg)[0].backbone), tmp_path / "bb.safetensors")
    data = (tmp_path / "bb.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) - 1000])
    path = write_config(tmp_path, cfg)
    assert cli.train_main([str(path), f"init_from={tmp_path / 'cut.safetensors'}"]) == EXIT_CODES["config"]
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "field 'init_from'" in err and "not a readable safetensors file" in err


class _Exploit:
    def __reduce__(self):
        return (os.system, (f"touch {_Exploit.marker}",))


def test_a_malicious_state_pt_is_refused_without_advice_to_unpickle(tmp_path, capsys):
    cfg = tiny_config(tmp_path, train={"steps": 4})
    path = write_config(tmp_path, cfg)
    assert cli.train_main([str(path), "train.stop_at=2"]) == 0
    _Exploit.marker = tmp_path / "pwned"
    state = tmp_path / "run" / "ckpt" / "step_000002" / "state.pt"
    torch.save({"step": 2, "payload": _Exploit()}, state)
    assert cli.train_main([str(path), "--resume"]) == EXIT_CODES["checkpoint"]
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(state) in err and "refused" in err
    assert "weights_only" not in err and "Traceback" not in err
    assert not _Exploit.marker.exists()


def test_an_internal_error_keeps_its_traceback_in_the_run(tmp_path, monkeypatch, capsys):
    from foundation.engine import loop

    def broken(self, log):
        raise KeyError("bug")

    monkeypatch.setattr(loop.Trainer, "evaluate", broken)
    path = write_config(tmp_path, tiny_config(tmp_path, train={"steps": 2}))
    assert cli.train_main([str(path)]) == EXIT_CODES["internal"]
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("foundation train: internal error: KeyError")
    assert str(tmp_path / "run" / "error.log") in err
    assert 'raise KeyError("bug")' in (tmp_path / "run" / "error.log").read_text()
    assert status(tmp_path / "run")["failure"] == "internal"
    assert cli.train_main([str(path), "overwrite=true", "--debug"]) == EXIT_CODES["internal"]
    assert "Traceback" in capsys.readouterr().err


def test_a_data_error_mid_run_is_one_line_with_a_status(tmp_path, capsys):
    """A truncated JPEG met while training the classifier: exit 3, the file named, status.json."""
    from foundation_tasks.classification import demo

    root = tmp_path / "images"
    demo.write_dataset(root, seed=0, size=16, train_per_class=4, val_per_class=2, num_classes=3)
    bad = sorted((root / "train").rglob("*.JPEG"))[5]
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
    cfg = tiny_config(tmp_path, backbone={"arch": "encoder", "dim": 32, "depth": 2, "heads": 2, "ffn_dim": 64},
                      tasks=[{"name": "classification", "data_dir": str(root), "num_classes": 3, "img_size": 16,
                              "patch_size": 4}], train={"steps": 4, "batch_size": 12})
    path = write_config(tmp_path, cfg)
    assert cli.train_main([str(path)]) == EXIT_CODES["data"]
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert str(bad) in err and "truncated" in err.lower() and "task 'classification' (train data)" in err
    info = status(tmp_path / "run")
    assert info["status"] == "failed" and info["failure"] == "data" and str(bad) in info["message"]


def test_compare_reports_a_failed_run_with_its_line(tmp_path, monkeypatch):
    """`foundation compare` reads status.json: a run that failed is "failed" with the engine's line."""
    from studies import verdict

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(run_state.torch, "save", no_space)
    with pytest.raises(DiskFull):
        run(tiny_config(tmp_path, train={"steps": 2}))
    outcome = verdict.judge(verdict.RunSpec("run", "magneto", 0, 3e-3), tmp_path / "run")
    assert outcome.verdict == "failed" and outcome.reason.startswith("engine: disk full: could not write ")


# ---------------------------------------------------------------------------- 4. every image mode, every reader


def _image(mode: str) -> tuple[Image.Image, tuple[int, int, int]]:
    """A 4x4 image of ``mode`` and the RGB every pixel must read as."""
    if mode == "I;16":  # 16-bit grey, as PNG stores it: 30000 of 65535 -> 117 of 255
        return Image.fromarray(np.full((4, 4), 30000, np.uint16)), (117, 117, 117)
    if mode == "1":
        return Image.new("1", (4, 4), 1), (255, 255, 255)
    if mode == "P":
        im = Image.new("P", (4, 4), 1)
        im.putpalette([0, 0, 0, 10, 20, 30] + [0] * 762)
        return im, (10, 20, 30)
    if mode == "P+transparency":  # palette index 1 transparent: over white
        im, _ = _image("P")
        im.info["transparency"] = 1
        return im, (255, 255, 255)
    if mode == "CMYK":
        return Image.new("CMYK", (4, 4), (255, 0, 0, 0)), (0, 255, 255)  # full cyan
    if mode == "LA":  # half-transparent grey 100 over white: 100 * a + 255 * (1 - a)
        return Image.new("LA", (4, 4), (100, 128)), (178, 178, 178)
    if mode == "RGBA":  # fully transparent: white, whatever colour the pixel holds
        return Image.new("RGBA", (4, 4), (10, 20, 30, 0)), (255, 255, 255)
    raise ValueError(mode)


MODES = ["I;16", "1", "P", "P+transparency", "CMYK", "LA", "RGBA"]


def _write(tmp_path: Path, mode: str) -> tuple[Path, tuple[int, int, int]]:
    image, want = _image(mode)
    path = tmp_path / ("img.tif" if mode == "CMYK" else "img.png")
    image.save(path, **({"transparency": 1} if mode == "P+transparency" else {}))
    return path, want


def _read_classification(path):
    from foundation_tasks.vision_common.images import load_image

    return np.asarray(load_image(path))


def _read_vl(path):
    from foundation_tasks.vl_common.images import load_image

    return np.asarray(load_image(path, "question 1 in q.json"))


def _read_segmentation(path):
    from foundation_tasks.segmentation.transforms import LoadCheckedImageFromFile

    return LoadCheckedImageFromFile()({"img_path": str(path)})["img"][..., ::-1]  # mmseg's BGR -> RGB


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("read", [_read_classification, _read_vl, _read_segmentation],
                         ids=["classification", "vl", "segmentation"])
def test_every_image_mode_reads_as_its_colours(tmp_path, mode, read):
    path, want = _write(tmp_path, mode)
    rgb = read(path)
    assert rgb.shape == (4, 4, 3) and rgb.dtype == np.uint8
    assert np.abs(rgb.astype(int) - np.array(want)).max() <= 1, (mode, rgb[0, 0], want)


def phone_photo(path: Path) -> Path:
    """A JPEG stored 40x20 (W x H), red on the left, blue on the right, with EXIF orientation 6
    (turn 90 degrees clockwise to show): shown 20x40, red on top."""
    stored = np.zeros((20, 40, 3), np.uint8)
    stored[:, :20] = (255, 0, 0)
    stored[:, 20:] = (0, 0, 255)
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation
    Image.fromarray(stored).save(path, exif=exif, quality=95)
    return path


@pytest.mark.parametrize("read", [_read_classification, _read_vl, _read_segmentation],
                         ids=["classification", "vl", "segmentation"])
def test_every_reader_applies_the_exif_orientation(tmp_path, read):
    rgb = read(phone_photo(tmp_path / "photo.jpg")).astype(int)
    assert rgb.shape == (40, 20, 3)
    assert np.abs(rgb[5, 10] - (255, 0, 0)).max() < 40 and np.abs(rgb[35, 10] - (0, 0, 255)).max() < 40


@pytest.mark.parametrize("mode", ["I", "I;16B", "PA"])
def test_modes_made_in_memory_convert_too(mode):
    """Modes PIL produces from other files (32-bit integer TIFFs, big-endian 16-bit, palette
    with alpha): the same rules."""
    from foundation_tasks.vision_common.images import to_rgb

    if mode == "PA":
        image = Image.new("PA", (2, 2), (1, 0))
        image.putpalette([0, 0, 0, 10, 20, 30] + [0] * 762)
        want = 255  # transparent: white
    else:
        image = Image.fromarray(np.full((2, 2), 65535, np.int32), "I")
        image = image if mode == "I" else image.convert("I;16B")
        want = 255  # 16-bit full scale, not clipped from 65535 but scaled
        quarter = to_rgb(Image.fromarray(np.full((2, 2), 16384, np.int32), "I"))
        assert np.asarray(quarter).max() == 64
    assert np.asarray(to_rgb(image)).min() == want


def test_verify_converts_as_training_does_and_counts_the_modes(tmp_path, capsys):
    from foundation_tasks.vision_common import folder as data

    for split in ("train", "val"):
        (tmp_path / split / "cat").mkdir(parents=True)
        Image.fromarray(np.full((8, 8), 30000, np.uint16)).save(tmp_path / split / "cat" / "grey16.png")
        Image.new("RGB", (8, 8), (1, 2, 3)).save(tmp_path / split / "cat" / "rgb.png")
    assert data.main(["verify", str(tmp_path)]) == 0
    assert "4 images, 0 bad; converted to RGB from: I;16 2" in capsys.readouterr().out
    assert np.asarray(data.load_image(tmp_path / "train" / "cat" / "grey16.png")).max() == 117  # not 255 (white)


# ---------------------------------------------------------------------------- 6. bad segmentation files


@pytest.fixture
def ade(tmp_path) -> Path:
    from foundation_tasks.segmentation import demo

    root = tmp_path / "ade"
    demo.write(root, seed=0, n_train=2, n_val=1, height=40, width=56)
    return root


def _seg_item(root: Path):
    from foundation_tasks.segmentation.data import SegDataset, ade20k, train_pipeline

    dataset = SegDataset(ade20k(root, "train", train_pipeline(32, 8), num_classes=8), "train")
    return [dataset[i] for i in range(len(dataset))]


@pytest.mark.parametrize("which", ["image", "annotation"])
def test_a_truncated_segmentation_file_is_named(ade, which):
    from foundation_tasks.segmentation.transforms import AnnotationError
    from foundation_tasks.vision_common.images import ImageDataError

    folder, pattern = {"image": ("images", "*.jpg"), "annotation": ("annotations", "*.png")}[which]
    bad = sorted((ade / folder / "training").glob(pattern))[0]
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
    with pytest.raises((ImageDataError, AnnotationError), match=f"{bad}: cannot read the .*truncated"):
        _seg_item(ade)


def test_an_absurdly_shaped_segmentation_image_is_named(ade):
    from foundation_tasks.segmentation.data import SegDataError

    image = sorted((ade / "images" / "training").glob("*.jpg"))[0]
    Image.new("RGB", (7, 5000), (9, 9, 9)).save(image)
    Image.new("L", (7, 5000), 1).save(ade / "annotations" / "training" / (image.stem + ".png"))
    with pytest.raises(SegDataError, match=f"{image} \\(7x5000 pixels\\): the train pipeline failed"):
        _seg_item(ade)


# ---------------------------------------------------------------------------- 7. smaller cases


def test_a_transcript_line_with_only_an_utterance_id_is_refused(tmp_path):
    from foundation_tasks.speech_common.corpus import SpeechDataError, read_kaldi_dir, read_librispeech

    chapter = tmp_path / "libri" / "19" / "198"
    chapter.mkdir(parents=True)
    (chapter / "19-198.trans.txt").write_text("19-198-0000 HELLO WORLD\n19-198-0001\n")
    with pytest.raises(SpeechDataError, match=r"19-198.trans.txt, line 2: utterance 19-198-0001 has no transcript"):
        read_librispeech(tmp_path / "libri")
    kaldi = tmp_path / "kaldi"
    kaldi.mkdir()
    (kaldi / "wav.scp").write_text("a a.wav\nb b.wav\n")
    (kaldi / "text").write_text("a HELLO\nb\n")
    with pytest.raises(SpeechDataError, match="text: utterance b has no transcript"):
        read_kaldi_dir(kaldi)


@pytest.mark.parametrize("content, kind", [("hello\n", "a bare string"), ("- a\n- b\n", "a list"),
                                           ("42\n", "a number")])
def test_a_yaml_file_that_is_not_a_mapping_is_named(tmp_path, content, kind, capsys):
    from foundation.engine.config import load_config

    path = tmp_path / "cfg.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=f"{path}: the file holds {kind}"):
        load_config(path)
    assert cli.train_main([str(path)]) == EXIT_CODES["config"]
    assert "a config is a mapping of sections" in capsys.readouterr().err


def test_a_compiled_mmcv_op_is_an_import_error_for_user_code():
    """User code with a fallback for a missing compiled op takes it, while mmseg imports."""
    from foundation_tasks.segmentation import mmseg_compat

    mmseg_compat.import_mmseg()
    import mmseg.models  # noqa: F401 - still imports on mmcv-lite

    try:
        from mmcv.ops import nms
    except ImportError as e:
        nms = None
        assert "nms needs mmcv's compiled extension" in str(e)
    assert nms is None
    from mmcv.ops import point_sample  # pure PyTorch: mmcv's own

    assert callable(point_sample)


def test_the_documented_torchrun_command_never_imports_the_working_directory(tmp_path):
    """``torchrun ... -m foundation.cli`` puts the working directory first on sys.path, so a
    ``foundation/`` folder or a ``foundation_tasks.py`` there would be imported in every rank;
    the documented ``torchrun --no-python foundation train`` runs the installed command."""
    bin_dir = Path(sys.executable).parent
    torchrun, foundation_cmd = bin_dir / "torchrun", bin_dir / "foundation"
    assert torchrun.is_file() and foundation_cmd.is_file(), "the package's console scripts are installed beside python"
    marker = tmp_path / "executed"
    (tmp_path / "foundation").mkdir()
    (tmp_path / "foundation" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('foundation')\n")
    (tmp_path / "foundation_tasks.py").write_text(f"open({str(marker)!r}, 'w').write('foundation_tasks')\n")
    env = {k: v for k, v in ENV.items() if k != "PYTHONPATH"}
    proc = subprocess.run([str(torchrun), "--nproc_per_node", "2", "--no-python", str(foundation_cmd), "train",
                           str(REPO / "configs/seq2seq/tiny.yaml"), "train.steps=2", "eval.every=0",
                           "log.progress=false", f"output_dir={tmp_path / 'runs'}", "run_name=ddp"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert not marker.exists(), marker.read_text()
    assert json.loads((tmp_path / "runs/ddp/status.json").read_text())["status"] == "finished"
