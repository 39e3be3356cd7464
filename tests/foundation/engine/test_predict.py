"""Using a trained model: for every task, a tiny run trained a few steps, its best/ copied
elsewhere and the training data deleted, then `foundation predict` (a subprocess) and
`foundation.load_predictor` on files the data never held; bad inputs fail with one line
naming the file."""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from PIL import Image

from foundation import checkpoint
from foundation.engine.loop import train
from support import load_benchmark

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[3]
# every run: the shipped tiny config of its task, shrunk to a couple of steps of a tiny model
TINY = ["backbone.dim=16", "backbone.depth=1", "backbone.heads=2", "backbone.ffn_dim=32", "train.steps=2",
        "eval.every=0", "eval.max_batches=1", "eval.batch_size=4", "save.every=0", "log.progress=false",
        "log.writers=[jsonl]", "device=cpu", "schedule.warmup_steps=1"]


def trained_copy(tmp: Path, data: Path, config: str, *overrides: str) -> Path:
    """Train ``configs/<config>`` briefly, copy best/ to a fresh folder, delete the data and the run."""
    from foundation.engine.config import load_config

    cfg, specs = load_config(ROOT / "configs" / config, TINY + [f"output_dir={tmp / 'runs'}", *overrides])
    result = train(cfg, specs)
    assert result.status == "finished", result.message
    best, last = (checkpoint.read_meta(d / "model.safetensors")
                  for d in (result.run_dir / "best", result.last_checkpoint))
    assert best and last == best  # every model file of the run carries it
    copy = tmp / "elsewhere" / result.run_dir.name
    shutil.copytree(result.run_dir / "best", copy)
    shutil.rmtree(data)
    shutil.rmtree(result.run_dir)
    return copy


def cli(*args: str, expect: int = 0) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "foundation.cli", "predict", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)
    assert done.returncode == expect, done.stderr
    return done


def json_lines(done: subprocess.CompletedProcess) -> list[dict]:
    return [json.loads(line) for line in done.stdout.splitlines()]


def picture(path: Path, size: tuple[int, int] = (40, 30), seed: int = 0) -> Path:
    """An image the demo data never held: noise over a gradient."""
    rng = np.random.default_rng(seed)
    w, h = size
    base = np.linspace(0, 255, w)[None, :, None] * np.ones((h, 1, 3))
    Image.fromarray(np.clip(base + rng.normal(0, 40, (h, w, 3)), 0, 255).astype(np.uint8)).save(path)
    return path


# --------------------------------------------------------------------------- classification


@pytest.fixture(scope="module")
def classifier(tmp_path_factory) -> Path:
    from foundation_tasks.classification.demo import write_dataset

    tmp = tmp_path_factory.mktemp("cls")
    data = tmp / "data"
    write_dataset(data, seed=0, size=16, train_per_class=4, val_per_class=2, num_classes=3)
    classes = sorted(p.name for p in (data / "train").iterdir())
    copy = trained_copy(tmp, data, "vision/tiny_finetune.yaml", "init_from=null", "train.batch_size=4",
                        f"tasks.classification.data_dir={data}", "tasks.classification.num_classes=3",
                        "tasks.classification.img_size=16")
    assert checkpoint.read_meta(copy / "model.safetensors")["classification"]["classes"] == classes
    return copy


def test_classification_cli_and_python(classifier, tmp_path):
    a, b = picture(tmp_path / "a.png"), picture(tmp_path / "b.jpg", (23, 50), seed=1)
    folder = tmp_path / "folder"
    folder.mkdir()
    shutil.copy(a, folder / "c.png")
    done = cli(str(classifier), str(a), str(folder), "--json", "--top-k", "2")
    records = json_lines(done)
    assert [r["input"] for r in records] == [str(a), str(folder / "c.png")]
    classes = checkpoint.read_meta(classifier / "model.safetensors")["classification"]["classes"]
    for r in records:
        assert len(r["classes"]) == 2 and {x["label"] for x in r["classes"]} <= set(classes)
        assert r["classes"][0]["score"] >= r["classes"][1]["score"]
    assert records[0]["classes"] == records[1]["classes"]  # the same picture

    from foundation import load_predictor

    p = load_predictor(classifier / "model.safetensors", device="cpu")
    one = p(str(a))
    assert one["input"] == str(a) and len(one["classes"]) == 3  # all 3 classes (fewer than 5)
    assert sum(x["score"] for x in one["classes"]) == pytest.approx(1.0, abs=1e-5)
    assert [x["label"] for x in one["classes"][:2]] == [x["label"] for x in records[0]["classes"]]
    many = p([str(a), str(b)], batch_size=1)
    assert [r["input"] for r in many] == [str(a), str(b)] and many[0]["classes"] == one["classes"]

    readable = cli(str(classifier), str(b)).stdout.strip()
    assert readable.startswith(f"{b}: ") and readable.count(",") == 2


def test_bad_inputs_name_the_file(classifier, tmp_path):
    empty = tmp_path / "empty.jpg"
    empty.write_bytes(b"")
    sound = tmp_path / "speech.wav"
    sf.write(sound, np.zeros(1600, np.float32), 16000)
    good = picture(tmp_path / "good.png")
    done = cli(str(classifier), str(empty), str(good), str(sound), str(tmp_path / "missing.png"), "--json", expect=1)
    assert [r["input"] for r in json_lines(done)] == [str(good)]  # the good one still predicted
    errors = done.stderr.strip().splitlines()
    assert len(errors) == 3 and all(line.startswith("foundation predict: error: ") for line in errors)
    for path, line in zip((empty, sound, tmp_path / "missing.png"), errors):
        assert str(path) in line
    assert "not an image" in errors[1]

    from foundation import load_predictor
    from foundation.engine.predict import InputError

    with pytest.raises(InputError, match="speech.wav: not an image"):
        load_predictor(classifier, device="cpu")(str(sound))


def test_a_library_warning_while_predicting_is_one_line(classifier, tmp_path, monkeypatch, capsys):
    """A warning raised by a library while inputs are read (PIL, torchaudio ...) printed its
    source line too; it is one line above the results."""
    import warnings

    from foundation.engine.predict import predict_main
    from foundation_tasks.classification.predict import ClassificationPredictor

    real = ClassificationPredictor.load

    def load(self, source, **options):
        warnings.warn("a library's note\nover two lines", RuntimeWarning)
        return real(self, source, **options)

    monkeypatch.setattr(ClassificationPredictor, "load", load)
    image = picture(tmp_path / "a.png")
    assert predict_main([str(classifier), str(image), "--device", "cpu"]) == 0
    out, err = capsys.readouterr()
    assert err == "foundation predict: warning: RuntimeWarning: a library's note; over two lines\n"
    assert out.startswith(f"{image}: ")


def forge(model_dir: Path, out: Path, config: dict | None = None, meta: dict | None = None,
          header: dict | None = None) -> Path:
    """A copy of a run's model file, its first task's config fields and its metadata's
    sections edited (a section given as a dict is merged into the saved one, a key set to
    None dropped; bytes as the file keeps them), and ``header`` entries replaced."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:
        saved, tensors = dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}
    cfg, extra = json.loads(saved[checkpoint.META_CONFIG]), json.loads(saved[checkpoint.META_EXTRA])
    cfg["tasks"][0].update(config or {})
    for section, value in (meta or {}).items():
        if isinstance(value, dict):
            value = {k: v for k, v in {**extra[section], **value}.items() if v is not None}
        extra[section] = value
    save_file(tensors, str(out), metadata={**saved, checkpoint.META_CONFIG: json.dumps(cfg),
                                           checkpoint.META_EXTRA: json.dumps(extra), **(header or {})})
    return out


@pytest.mark.parametrize("config, meta, needle", [
    ({}, {"img_size": 20000}, "metadata classification.img_size is 20000, but the model's config says 16"),
    ({}, {"img_size": [32, 3000000]}, "metadata classification.img_size is [32, 3000000], but the model's config"),
    ({"img_size": 20000}, {"img_size": 20000}, "heads.classification.pos_embed: the config builds (1, 25000001, 16)"),
    ({"crop_pct": 1e-4}, {"crop_pct": 1e-4}, "img_size / crop_pct is 160000.0; an image side in 1..4096 px"),
])
def test_forged_sizes_are_refused_before_any_input_is_read(classifier, tmp_path, config, meta, needle):
    """Metadata and config values are checked against each other, the weights' shapes and
    sane bounds when the model is loaded: img_size 20000 took 53 s and 12.8 GB, then a
    traceback, and [32, 3000000] got the process killed."""
    from foundation import load_predictor
    from foundation.checkpoint import CheckpointError

    forged = forge(classifier, tmp_path / "model.safetensors", config, {"classification": meta})
    with pytest.raises(CheckpointError) as err:
        load_predictor(forged, device="cpu")
    assert str(err.value).startswith(f"{forged}: ") and needle in str(err.value) and "\n" not in str(err.value)


def test_a_metadata_section_that_is_not_a_mapping_is_one_line(classifier, tmp_path):
    forged = forge(classifier, tmp_path / "model.safetensors", meta={"classification": "a string"})
    done = cli(str(forged), str(picture(tmp_path / "a.png")), expect=2)
    assert done.stdout == "" and done.stderr.count("\n") == 1
    assert f"{forged}: the prediction metadata of task 'classification' is a str, not a mapping" in done.stderr


GARBAGE = {"base64": base64.b64encode(b"not a sentencepiece model " * 8).decode()}  # bytes as a model file holds them


@pytest.mark.parametrize("run, config, meta, needle", [
    ("classifier", {}, {"classification": {"classes": None}}, "is not usable: no 'classes'"),
    ("recognizer", {}, {"asr": {"tokenizer": GARBAGE}}, "is not a sentencepiece model"),
    ("recognizer", {}, {"asr": {"sample_rate": 0}}, "asr.sample_rate is 0, but the model's config says 16000"),
    ("recognizer", {"sample_rate": 0}, {"asr": {"sample_rate": 0}}, "field 'sample_rate': must be >= 1 (got 0)"),
    ("nlvr2", {}, {"nlvr2": {"spm_model": GARBAGE}}, "is not a sentencepiece model"),
])
def test_forged_metadata_is_one_line(request, tmp_path, run, config, meta, needle):
    """What a model file's metadata holds (missing classes, a damaged sentencepiece model, a
    sample rate of 0) is refused in one line, exit 2: the sentencepiece model was a traceback."""
    model = request.getfixturevalue("vl_runs")[run] if run == "nlvr2" else request.getfixturevalue(run)
    forged = forge(model, tmp_path / "model.safetensors", config, meta)
    done = cli(str(forged), str(picture(tmp_path / "a.png")), expect=2)
    assert done.stderr.count("\n") == 1 and needle in done.stderr and str(forged) in done.stderr


def test_a_missing_module_named_in_a_model_file_is_never_imported(classifier, tmp_path):
    """`foundation.module` naming a module that does not exist: predict and export timm build
    the model from this project's own classes, as for any module the file names."""
    forged = forge(classifier, tmp_path / "model.safetensors", header={checkpoint.META_MODULE: "no_such_module.x"})
    assert cli(str(forged), str(picture(tmp_path / "a.png"))).stdout.startswith(str(tmp_path / "a.png"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "foundation.cli", "export", "timm", str(forged), "--out",
                           str(tmp_path / "timm.safetensors")], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and (tmp_path / "timm.safetensors").is_file(), done.stderr


def test_model_files_without_a_predictor_are_refused(tmp_path, capsys):
    from foundation.cli import main
    from foundation.engine.model import ModelConfig, MultiTaskModel
    from foundation.config import BackboneConfig

    backbone = BackboneConfig(dim=16, depth=1, heads=2, ffn_dim=32, arch="encoder_decoder")
    model = MultiTaskModel(ModelConfig(backbone=backbone, tasks=[{"name": "seq2seq", "problem": "reverse"}]))
    checkpoint.save(model, tmp_path / "s2s.safetensors")
    image = picture(tmp_path / "x.png")
    assert main(["predict", str(tmp_path / "s2s.safetensors"), str(image)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "seq2seq" in err and "has a predictor" in err
    checkpoint.save(model.backbone, tmp_path / "backbone.safetensors")
    assert main(["predict", str(tmp_path / "backbone.safetensors"), str(image)]) == 2
    assert "holds a Backbone" in capsys.readouterr().err
    assert main(["predict", str(tmp_path / "nothing"), str(image)]) == 2
    assert "nothing" in capsys.readouterr().err


# --------------------------------------------------------------------------- segmentation


@pytest.fixture(scope="module")
def segmenter(tmp_path_factory) -> Path:
    from foundation_tasks.segmentation import demo

    tmp = tmp_path_factory.mktemp("seg")
    data = tmp / "ade"
    demo.write(data, seed=0, n_train=4, n_val=1, height=24, width=32)
    return trained_copy(tmp, data, "segmentation/tiny.yaml", "train.batch_size=2",
                        f"tasks.segmentation.data_root={data}", "tasks.segmentation.img_size=16",
                        "tasks.segmentation.out_indices=[0,0,0,0]", "tasks.segmentation.channels=8",
                        "tasks.segmentation.aux_channels=4", "tasks.segmentation.test_stride=8")


def test_segmentation_writes_mask_and_overlay(segmenter, tmp_path):
    image = picture(tmp_path / "street.jpg", (37, 26))
    out = tmp_path / "out"
    [record] = json_lines(cli(str(segmenter), str(image), "--out", str(out), "--json"))
    assert record["mask"] == str(out / "street_mask.png") and record["overlay"] == str(out / "street_overlay.png")
    mask = Image.open(record["mask"])
    assert mask.mode == "P" and mask.size == (37, 26)
    values = np.asarray(mask)
    assert values.min() >= 1 and values.max() <= 8  # ADE20k ids of the 8 demo classes
    from foundation_tasks.segmentation.data import ADE_PALETTE

    assert mask.getpalette()[3:6] == list(ADE_PALETTE[0])  # id 1 (wall) in wall's colour
    assert np.asarray(Image.open(record["overlay"])).shape == (26, 37, 3)
    assert sum(a["fraction"] for a in record["areas"]) == pytest.approx(1.0, abs=1e-3)

    from foundation import load_predictor

    p = load_predictor(segmenter, device="cpu")
    again = p(str(image), out=tmp_path / "py")
    assert np.array_equal(np.asarray(Image.open(again["mask"])), values)  # sliding window, as trained
    for sub in ("a", "b"):  # same names from two folders: both kept
        (tmp_path / sub).mkdir()
        shutil.copy(image, tmp_path / sub / "x.jpg")
    both = p([str(tmp_path / "a/x.jpg"), str(tmp_path / "b/x.jpg")], out=tmp_path / "dup")
    assert [Path(r["mask"]).name for r in both] == ["x_mask.png", "x_2_mask.png"]


def test_segmentation_never_writes_onto_its_inputs(segmenter, tmp_path):
    """`predict SEG dir/ --out dir/` overwrote the user's own *_mask.png, then predicted them as
    inputs: an --out inside an input folder is refused, and no output takes an input's name."""
    folder = tmp_path / "photos"
    folder.mkdir()
    picture(folder / "x.png")
    mine = picture(folder / "x_mask.png", seed=3)
    kept = mine.read_bytes()
    done = cli(str(segmenter), str(folder), "--out", str(folder), expect=2)
    assert done.stderr.count("\n") == 1 and f"--out {folder} is inside the input folder {folder}" in done.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["x.png", "x_mask.png"] and mine.read_bytes() == kept

    from foundation import load_predictor
    from foundation.engine.predict import InputError

    p = load_predictor(segmenter, device="cpu")
    with pytest.raises(InputError, match="is inside the input folder"):
        p(str(folder), out=folder / "masks")
    records = p([str(folder / "x.png"), str(mine)], out=folder)  # the inputs named one by one
    assert [Path(r["mask"]).name for r in records] == ["x_2_mask.png", "x_mask_mask.png"]
    assert mine.read_bytes() == kept
    with pytest.raises(InputError, match="is a file; segmentation writes"):
        p(str(folder / "x.png"), out=mine)
    assert mine.read_bytes() == kept


def test_segmentation_of_a_huge_or_turned_photo(segmenter, tmp_path):
    """A 90-megapixel image (11 kB of PNG) is refused from its header in one line, without PIL's
    two-line bomb warning (13,000 x 13,000 px peaked at 16.5 GB); a phone photo stored 40x20 with
    EXIF orientation 6 gets the 20x40 mask of the picture as shown."""
    huge = tmp_path / "huge.png"
    Image.new("1", (10000, 9000)).save(huge)
    turned = tmp_path / "turned.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: turn 90 degrees clockwise to show
    picture(tmp_path / "stored.png", (40, 20))
    Image.open(tmp_path / "stored.png").save(turned, exif=exif)
    done = cli(str(segmenter), str(huge), str(turned), "--out", str(tmp_path / "out"), "--json", expect=1)
    assert done.stderr.count("\n") == 1 and "Warning" not in done.stderr
    assert f"{huge}: the image is 10000x9000 pixels (90 megapixels), more than the 64 megapixels" in done.stderr
    [record] = json_lines(done)
    assert Image.open(record["mask"]).size == Image.open(record["overlay"]).size == (20, 40)


def test_segmentation_logits_are_resized_a_band_at_a_time(monkeypatch):
    """The label map and overlay equal those of the logits resized to the whole image at once
    (F.interpolate, as evaluation does), computed in bands of a few rows."""
    from types import SimpleNamespace

    import torch.nn.functional as F

    from foundation_tasks.segmentation import predict

    monkeypatch.setattr(predict, "BAND", 5 * 37 * 4)  # 4 rows of 37 pixels, 5 classes
    rng = np.random.default_rng(0)
    logits = torch.from_numpy(rng.normal(size=(5, 7, 9)).astype(np.float32))
    image = rng.integers(0, 256, (26, 37, 3), dtype=np.uint8)
    colors = rng.integers(0, 256, (5, 3), dtype=np.uint8)
    mask, overlay = predict.SegmentationPredictor._paint(SimpleNamespace(offset=1, colors=colors), logits, image)
    labels = F.interpolate(logits[None], size=(26, 37), mode="bilinear", align_corners=False).argmax(1)[0].numpy()
    assert np.array_equal(mask, labels + 1)
    assert np.array_equal(overlay, (0.5 * image + 0.5 * colors[labels]).round().astype(np.uint8))


# --------------------------------------------------------------------------- speech recognition


@pytest.fixture(scope="module")
def recognizer(tmp_path_factory) -> Path:
    from foundation_tasks.asr.demo import VOICES, make_corpus

    tmp = tmp_path_factory.mktemp("asr")
    data = tmp / "speech"
    make_corpus(data, seed=3, utts_per_voice={"train": 2, "dev": 1, "test": 1}, n_dev_voices=1, n_test_voices=1,
                voices=VOICES[:3], sentences=["GO LEFT", "STOP NOW", "OPEN THE DOOR"])
    return trained_copy(tmp, data, "asr/tiny.yaml", f"tasks.asr.data_dir={data}", "tasks.asr.vocab_size=12",
                        "tasks.asr.eval_splits=[dev]", "tasks.asr.vgg_channels=[4,8]",
                        "tasks.asr.predictor_embed_dim=16", "tasks.asr.predictor_dim=16", "tasks.asr.joint_dim=16",
                        "tasks.asr.aux_layers=[0]", "tasks.asr.aux_mlp_dim=16", f"tasks.asr.hyp_dir={tmp / 'hyp'}")


def tone(rate: int, seconds: float = 1.3) -> np.ndarray:
    """A band-limited signal (a 220 Hz tone, smoothly pulsing), the same at any sample rate."""
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 220 * t) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)


def test_speech_from_a_44k_stereo_file(recognizer, tmp_path):
    x = tone(44100)
    wav = tmp_path / "user.wav"
    sf.write(wav, np.stack([1.5 * x, 0.5 * x], axis=1), 44100)  # stereo; mixed down: x
    flac = tmp_path / "user.flac"
    sf.write(flac, tone(22050), 22050, format="FLAC")
    records = json_lines(cli(str(recognizer), str(wav), str(flac), "--json"))
    assert [r["input"] for r in records] == [str(wav), str(flac)]
    assert all(isinstance(r["text"], str) for r in records)
    assert records[0]["seconds"] == pytest.approx(1.3, abs=1e-3)

    from foundation import load_predictor
    from foundation.engine.predict import InputError

    p = load_predictor(recognizer, device="cpu")
    one = p(str(wav))
    assert one["text"] == records[0]["text"]
    assert isinstance(p(str(wav), beam=2)["text"], str)
    with pytest.raises(InputError, match="--beam must be at most 64"):  # 100000 ran for minutes
        p(str(wav), beam=100000)
    # what the model hears: the 44.1 kHz stereo file mixed down and resampled gives the
    # filterbanks of the same signal recorded at 16 kHz mono
    sf.write(tmp_path / "mono16k.wav", tone(16000), 16000)
    ours, direct = (next(p.features(p.load(str(f)))) for f in (wav, tmp_path / "mono16k.wav"))
    assert ours.shape == direct.shape
    assert ((ours.exp() - direct.exp()).abs().sum() / direct.exp().sum()) < 0.02
    # long audio in pieces: 1.3 s cut into pieces of at most 0.5 s
    assert len(list(p.features(p.load(str(wav), chunk_seconds=0.5)))) == 3
    assert p(str(wav), chunk_seconds=0.5)["seconds"] == pytest.approx(1.3, abs=1e-3)

    image = picture(tmp_path / "photo.png")
    with pytest.raises(InputError, match="photo.png: not an audio file"):
        p(str(image))
    done = cli(str(recognizer), str(image), expect=1)
    assert done.stdout == "" and str(image) in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_long_audio_is_read_in_bounded_pieces(tmp_path):
    from foundation_tasks.asr.predict import audio_pieces

    rate = 8000
    audio = np.random.default_rng(0).normal(0, 0.1, 5 * rate).astype(np.float32)
    audio[int(1.9 * rate):int(1.95 * rate)] = 0.0  # a pause near the end of the first 2 s window
    sf.write(tmp_path / "long.wav", np.stack([audio, audio], axis=1), rate)
    with sf.SoundFile(tmp_path / "long.wav") as f:
        pieces = list(audio_pieces(f, 16000, chunk_seconds=2.0))
    assert len(pieces) == 3 and all(seconds <= 2.0 for _, seconds in pieces)
    assert 1.9 <= pieces[0][1] <= 1.95  # cut in the pause
    assert sum(seconds for _, seconds in pieces) == pytest.approx(5.0)
    assert sum(len(wav) for wav, _ in pieces) == pytest.approx(5 * 16000, abs=3)  # resampled to 16 kHz


def test_long_audio_keeps_a_batch_of_pieces_in_memory(recognizer, tmp_path, monkeypatch):
    """Memory does not grow with the audio's length: pieces are read as the encoder takes them
    (load kept every piece's features: 0.87 GB for 1.6 s, 1.72 GB for 120 min)."""
    import weakref

    from foundation import load_predictor
    from foundation_tasks.asr import predict

    sf.write(tmp_path / "long.wav", np.tile(tone(8000, 1.0), 60), 8000)  # a minute, read in 1 s pieces
    live, peak = set(), [0]

    def tracked(*args):
        feats = predict_fbank(*args)
        live.add(id(feats))
        weakref.finalize(feats, live.discard, id(feats))
        peak[0] = max(peak[0], len(live))
        return feats

    predict_fbank = predict.fbank
    monkeypatch.setattr(predict, "fbank", tracked)
    p = load_predictor(recognizer, device="cpu")
    record = p(str(tmp_path / "long.wav"), chunk_seconds=1.0)
    assert record["seconds"] == pytest.approx(60.0) and "warning" not in record
    assert peak[0] <= 2 * p.default_batch_size  # the batch in the encoder, the next one being read


@pytest.mark.parametrize("fmt", ["WAV", "OGG"])
def test_a_truncated_audio_file_is_transcribed_with_a_warning(recognizer, tmp_path, fmt):
    """A WAV or Ogg cut short (an interrupted copy) was transcribed as its readable part without a
    word: its record says so, and the command line prints one warning line."""
    whole = tmp_path / f"whole.{fmt.lower()}"
    noisy = tone(16000, 6.0) + np.random.default_rng(0).normal(0, 0.1, 96000).astype(np.float32)  # Vorbis pages fill
    sf.write(whole, noisy, 16000, format=fmt)
    cut = tmp_path / f"cut.{fmt.lower()}"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])

    from foundation import load_predictor

    p = load_predictor(recognizer, device="cpu")
    assert "warning" not in p(str(whole))
    record = p(str(cut))
    assert "truncated" in record["warning"] and 0.5 < record["seconds"] < 5.5
    done = cli(str(recognizer), str(cut))
    assert done.stderr.count("\n") == 1 and f"foundation predict: warning: {cut}: the file is truncated" in done.stderr
    assert done.stdout.startswith(f"{cut}: ")


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_a_chunk_length_that_is_not_a_finite_number_is_one_line(recognizer, tmp_path, value):
    wav = tmp_path / "a.wav"
    sf.write(wav, tone(16000), 16000)
    done = cli(str(recognizer), str(wav), "--chunk-seconds", value, expect=2)
    assert done.stderr.count("\n") == 1 and f"--chunk-seconds must be a finite number > 0, got {float(value)}" in done.stderr


def test_quietest_cut_lands_in_the_pause():
    from foundation_tasks.asr.predict import quietest_cut

    rate = 1000
    audio = np.ones(1000, np.float32)
    audio[880:900] = 0.0
    assert 880 <= quietest_cut(audio, rate) < 900


# --------------------------------------------------------------------------- VQA and NLVR2


@pytest.fixture(scope="module")
def vl_runs(tmp_path_factory) -> dict[str, Path]:
    from foundation_tasks.vl_common.demo import write_dataset

    tmp = tmp_path_factory.mktemp("vl")
    data = tmp / "vl"
    write_dataset(data, seed=1, image_size=32, vqa_train=6, vqa_val=3, questions_per_image=2, nlvr2_train=4,
                  nlvr2_dev=2, text_lines=20)
    front = ["img_size=32", "patch_size=8", "max_text_len=16", "text_positions=16"]
    # TINY has one block: the recipe's object labels after block 2 move to block 1
    vqa = trained_copy(tmp, data / "vqa", "vl/tiny_vqa.yaml", "train.batch_size=4", "tasks.vqa.object_loss_block=1",
                       f"tasks.vqa.data_dir={data / 'vqa'}", *(f"tasks.vqa.{f}" for f in front))
    # NLVR2 with a sentencepiece tokenizer (BEiT-3's kind) that lives in the data folder: the
    # model file must carry it
    spm_model, pieces = sentencepiece_model(data / "nlvr2")
    nlvr2 = trained_copy(tmp, data / "nlvr2", "vl/tiny_nlvr2.yaml", "train.batch_size=4",
                         f"tasks.nlvr2.data_dir={data / 'nlvr2'}", *(f"tasks.nlvr2.{f}" for f in front),
                         "tasks.nlvr2.tokenizer=sentencepiece", f"tasks.nlvr2.spm_model={spm_model}",
                         f"tasks.nlvr2.vocab_size={pieces + 2}")
    return {"vqa": vqa, "nlvr2": nlvr2}


def sentencepiece_model(nlvr2: Path) -> tuple[Path, int]:
    import io

    import sentencepiece as spm

    sentences = [json.loads(line)["sentence"] for line in (nlvr2 / "data/train.json").read_text().splitlines()]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences * 4), model_writer=buf, vocab_size=40,
                                   model_type="char", hard_vocab_limit=False, minloglevel=2, num_threads=1)
    path = nlvr2 / "text.spm"
    path.write_bytes(buf.getvalue())
    return path, spm.SentencePieceProcessor(model_proto=buf.getvalue()).get_piece_size()


def test_vqa_answers_a_question(vl_runs, tmp_path):
    image = picture(tmp_path / "scene.png", (32, 32))
    [record] = json_lines(cli(str(vl_runs["vqa"]), str(image), "--question", "what color is the cube?", "--json",
                              "--top-k", "3"))
    answers = checkpoint.read_meta(vl_runs["vqa"] / "model.safetensors")["vqa"]["answers"]
    assert record["input"] == str(image) and len(record["answers"]) == min(3, len(answers))
    assert {a["answer"] for a in record["answers"]} <= set(answers)
    assert all(0 <= a["score"] <= 1 for a in record["answers"])

    from foundation import load_predictor

    p = load_predictor(vl_runs["vqa"], device="cpu")
    assert p(str(image), question="what color is the cube?", top_k=3)["answers"] == record["answers"]
    from foundation.engine.predict import InputError

    with pytest.raises(InputError, match="'question'"):
        p(str(image))
    done = cli(str(vl_runs["vqa"]), str(image), expect=2)
    assert "--question" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_nlvr2_judges_a_pair(vl_runs, tmp_path):
    left, right = picture(tmp_path / "l.png", (32, 32)), picture(tmp_path / "r.png", (32, 32), seed=2)
    [record] = json_lines(cli(str(vl_runs["nlvr2"]), str(left), str(right), "--sentence", "there is a red cube",
                              "--json"))
    assert record["input"] == [str(left), str(right)]
    assert isinstance(record["label"], bool) and 0.5 <= record["score"] <= 1

    spm = checkpoint.read_meta(vl_runs["nlvr2"] / "model.safetensors")["nlvr2"]["spm_model"]
    assert isinstance(spm, bytes) and len(spm) > 100  # the sentencepiece model, its file deleted with the data

    from foundation import load_predictor

    p = load_predictor(vl_runs["nlvr2"], device="cpu")
    again = p((str(left), str(right)), sentence="there is a red cube")
    assert again["label"] == record["label"] and again["score"] == pytest.approx(record["score"], abs=1e-5)
    from foundation.engine.predict import InputError

    with pytest.raises(InputError, match="pairs"):
        p([str(left), str(right), str(left)], sentence="x")
    done = cli(str(vl_runs["nlvr2"]), str(left), str(right), expect=2)
    assert "--sentence" in done.stderr


# --------------------------------------------------------------------------- checkpoints


def test_checkpoint_load_needs_no_import(classifier):
    """`checkpoint.load` of a run's file in a fresh interpreter that imported nothing else."""
    code = ("from foundation import checkpoint; m = checkpoint.load(r'%s'); "
            "from foundation_tasks.classification.model import to_vit; v = to_vit(m); print(type(m).__name__, type(v).__name__)"
            % (classifier / "model.safetensors"))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["MultiTaskModel", "VisionTransformer"]


def test_a_loaded_model_saves_its_metadata_again(classifier, tmp_path):
    model = checkpoint.load(classifier / "model.safetensors")
    checkpoint.save(model, tmp_path / "again.safetensors")
    again = checkpoint.read_meta(tmp_path / "again.safetensors")
    assert again == checkpoint.read_meta(classifier / "model.safetensors")
    torch.testing.assert_close(checkpoint.load(tmp_path / "again.safetensors").state_dict(), model.state_dict())


def test_vl_breakdown_scores_every_item_once(vl_runs, tmp_path):
    """benchmarks/vl_breakdown.py: every evaluation item lands in one family / kind and one
    naming group, and the VQA groups average to the official accuracy of predict_split."""
    from foundation_tasks.vl_common.demo import QUESTION_TEMPLATES, STATEMENTS, write_dataset
    from foundation_tasks.vqa.predict import predict_split

    breakdown = load_benchmark("vl_breakdown")
    data = tmp_path / "vl"
    write_dataset(data, seed=2, image_size=32, vqa_train=2, vqa_val=6, questions_per_image=3, nlvr2_train=2,
                  nlvr2_dev=5, text_lines=10)

    vqa = breakdown.vqa_breakdown(str(vl_runs["vqa"]), str(data / "vqa"))
    assert set(vqa["family"]) <= set(QUESTION_TEMPLATES)
    assert set(vqa["names objects by"]) <= {"colour + shape", "shape", "colour"}
    scores = [x for v in vqa["family"].values() for x in v]
    assert len(scores) == 18 == sum(len(v) for v in vqa["names objects by"].values())
    _, official = predict_split(str(vl_runs["vqa"]), "val2014", data_dir=str(data / "vqa"),
                                annotation_dir=str(data / "vqa"))
    assert 100 * sum(scores) / len(scores) == pytest.approx(official["overall"], abs=0.01)

    # --scenes: the val scenes redrawn from the generator's seed are the stored ones (each colour
    # question's majority answer is the colour of an object in its scene), and split every question once
    from foundation_tasks.vqa.data import read_split
    from foundation_tasks.vl_common.demo import SceneSpec
    scenes = breakdown.redraw_scenes(str(data / "vqa"), 2, SceneSpec())
    assert len(scenes) == 6
    for q in read_split(data / "vqa", data / "vqa", "val2014"):
        if breakdown.kind_of(q.question) == "color":
            assert max(set(q.answers), key=q.answers.count) in {o.color for o in scenes[q.image_id]}
    by_scene = breakdown.vqa_breakdown(str(vl_runs["vqa"]), str(data / "vqa"), scenes)["family x scene"]
    assert sum(len(v) for v in by_scene.values()) == 18
    assert all(" object" in k and " colour" in k for k in by_scene)
    assert breakdown.main(["vqa", str(vl_runs["vqa"]), str(data / "vqa"), "--scenes", "--seed", "3"]) == 2

    nlvr2 = breakdown.nlvr2_breakdown(str(vl_runs["nlvr2"]), str(data / "nlvr2"))
    assert set(nlvr2["kind"]) <= set(STATEMENTS)
    right = [x for v in nlvr2["kind"].values() for x in v]
    assert len(right) == 10 and set(right) <= {0.0, 1.0}
    assert "| all |" in breakdown.table(nlvr2)
    assert breakdown.main(["nlvr2", str(vl_runs["nlvr2"]), str(tmp_path / "missing")]) == 2
    assert breakdown.main(["vqa", str(tmp_path / "no-run"), str(data / "vqa")]) == 2


def test_vl_shape_probe_labels_and_table(vl_runs, classifier, capsys):
    """benchmarks/vl_shape_probe.py: each scene's labels are what was drawn (the colour of the
    object's pixels; triangles cover less area), a probe on features that hold the label reads
    it and one on noise does not, the table has the untrained reference above every run, and
    what it cannot probe is refused in one line."""
    from foundation_tasks.mim.linear_probe import probe
    from foundation_tasks.vl_common.demo import COLORS, SHAPES

    shape_probe = load_benchmark("vl_shape_probe")
    images, shapes, colours = shape_probe.one_object_scenes(60, 0, 48, 0.16)
    assert len(images) == 60 and set(shapes.tolist()) == set(range(len(SHAPES)))
    palette = np.array(list(COLORS.values()), dtype=float)
    for image, colour in zip(images, colours):  # the object's pixels: those furthest from the background
        px = np.asarray(image, dtype=float).reshape(-1, 3)
        far = px[np.argsort(-np.abs(px - np.median(px, 0)).sum(1))[:20]].mean(0)
        assert np.abs(palette - far).sum(1).argmin() == colour
    area = torch.tensor([float((np.abs(np.asarray(im, dtype=float) - np.median(np.asarray(im, dtype=float).reshape(-1, 3), 0))
                                .sum(-1) > 60).sum()) for im in images])
    mean_area = {s: area[shapes == SHAPES.index(s)].mean() for s in SHAPES}
    assert mean_area["triangle"] < 0.75 * min(mean_area["circle"], mean_area["square"])  # shape labels: as drawn

    onehot = torch.nn.functional.one_hot(shapes, 3).float() + 0.1 * torch.randn(60, 3)
    assert probe((onehot[:40], shapes[:40]), (onehot[40:], shapes[40:]), 3) == 1.0
    noise = torch.randn(60, 8)
    assert probe((noise[:40], shapes[:40]), (noise[40:], shapes[40:]), 3) < 0.8

    assert shape_probe.main([str(vl_runs["vqa"]), str(vl_runs["nlvr2"]), "--train", "30", "--test", "12"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")][1:]  # past the header
    assert [r.split(" | ")[0] for r in rows] == ["| same architecture, untrained", f"| {vl_runs['vqa']}",
                                                  f"| {vl_runs['nlvr2']}"]
    assert all(0 <= float(x) <= 100 for r in rows for x in r.strip("| ").split(" | ")[1:])
    assert shape_probe.main([str(vl_runs["vqa"] / "missing")]) == 2
    assert shape_probe.main([str(classifier)]) == 2  # not a VL model: one line, no traceback
    assert "not a VL run with images" in capsys.readouterr().err


def test_optimizer_step_benchmark_rows(vl_runs, classifier, capsys):
    """benchmarks/optimizer_step.py: one row per model with both timings, the ratio and the
    largest difference between the two optimizers' parameters (float rounding); what is not a
    run's model is refused in one line."""
    bench = load_benchmark("optimizer_step")
    assert bench.main([str(vl_runs["vqa"]), str(classifier), "--steps", "2"]) == 0
    rows = [line.strip("| ").split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| ")][1:]
    assert [r[0] for r in rows] == [str(vl_runs["vqa"]), str(classifier)]
    for _, params, default_ms, fused_ms, ratio, diff in rows:
        assert int(params.replace(",", "")) > 0 and float(default_ms) > 0 and float(fused_ms) > 0
        # the row's ms are rounded to 0.01 and its ratio to 0.01: allow what that rounding moves
        f, d = float(fused_ms), float(default_ms)
        slack = f / d * (0.005 / f + 0.005 / d) + 0.005
        assert float(ratio) == pytest.approx(f / d, abs=slack)
        assert float(diff) < 1e-5
    assert bench.main([str(vl_runs["vqa"] / "missing")]) == 2
    assert "optimizer_step: error:" in capsys.readouterr().err
