"""Fixtures shared by the task tests: tiny demo data sets in their real layouts (images, the
vision-language demo, small eSpeak NG corpora in the LibriSpeech layout from ``foundation_tasks.asr.demo``,
each made once per session; tests that break one copy it), and running the engine on a config
dict as ``foundation train`` does."""
from __future__ import annotations

from pathlib import Path

import pytest

from support import read_records as _records, run_config as _run, write_vision_demo
from foundation_tasks.asr.demo import VOICES, make_corpus

VISION_BACKBONE = {"dim": 32, "depth": 2, "heads": 2, "ffn_dim": 64}
VISION_IMAGE = {"img_size": 16, "patch_size": 4}


def _vision_config(out: Path, name: str, task: dict, norm: str = "magneto", **sections) -> dict:
    cfg = {"run_name": name, "output_dir": str(out), "seed": 0, "backbone": {**VISION_BACKBONE, "norm": norm},
           "tasks": [task], "optim": {"lr": 2e-3}, "schedule": {"warmup_steps": 1},
           "train": {"steps": 3, "batch_size": 8}, "eval": {"batch_size": 12}, "save": {"keep": 1},
           "log": {"progress": False, "writers": ["jsonl"]}}
    cfg.update(sections)
    return cfg


@pytest.fixture(scope="session")
def run_config():
    """``run(cfg_dict, *key=value overrides)`` -> the engine's train result."""
    return _run


@pytest.fixture(scope="session")
def run_records():
    """``records(run_dir)``: the run's metrics.jsonl, one dict a line."""
    return _records


@pytest.fixture(scope="session")
def vision_config():
    """``config(out, run_name, task_dict, norm="magneto", **sections)``: a tiny vision run."""
    return _vision_config


@pytest.fixture(scope="session")
def vision_data(tmp_path_factory) -> Path:
    """A tiny ImageNet-layout folder: 3 classes of 16 px images."""
    return write_vision_demo(tmp_path_factory.mktemp("vision"))


@pytest.fixture(scope="session")
def vision_tokenizer(vision_data, tmp_path_factory) -> Path:
    """A VQ-KD tokenizer trained for a few steps (pixel teacher) on ``vision_data``: its checkpoint."""
    out = tmp_path_factory.mktemp("runs")
    task = {"name": "vq_tokenizer", "data_dir": str(vision_data), **VISION_IMAGE, "num_codes": 64, "code_dim": 8,
            "decoder_depth": 1, "teacher": "pixels"}
    result = _run(_vision_config(out, "tok", task, train={"steps": 4, "batch_size": 12}))
    assert result.status == "finished"
    return result.run_dir / "best" / "model.safetensors"


@pytest.fixture(scope="session")
def mim_task(vision_data, vision_tokenizer) -> dict:
    """A MIM task section over ``vision_data`` with ``vision_tokenizer``'s targets."""
    return {"name": "mim", "data_dir": str(vision_data), "tokenizer": str(vision_tokenizer), **VISION_IMAGE,
            "num_masking_patches": 6, "min_num_patches": 2, "scale": [0.5, 1.0]}


@pytest.fixture(scope="session")
def write_vl_demo(tmp_path_factory):
    """``write(**sizes)``: the vision-language demo (VQA v2, NLVR2, COCO captions, text) in a new folder."""
    from foundation_tasks.vl_common.demo import write_dataset

    def write(**kwargs) -> Path:
        out = tmp_path_factory.mktemp("vl")
        write_dataset(out, image_size=32, **kwargs)
        return out

    return write


# the demo the VQA, NLVR2 and caption reader tests share (their counts follow from these sizes)
VL_DEMO = dict(seed=3, vqa_train=12, vqa_val=8, questions_per_image=3, nlvr2_train=8, nlvr2_dev=6, text_lines=40)


@pytest.fixture(scope="session")
def vl_demo_sizes() -> dict:
    return dict(VL_DEMO)


@pytest.fixture(scope="session")
def vl_demo(write_vl_demo) -> Path:
    return write_vl_demo(**VL_DEMO)


@pytest.fixture
def vl_demo_copy(vl_demo, tmp_path) -> Path:
    """A copy of ``vl_demo`` that a test may break."""
    import shutil

    out = tmp_path / "data"
    shutil.copytree(vl_demo, out)
    return out


@pytest.fixture(scope="session")
def write_ade_tree(tmp_path_factory):
    """``write(**sizes)``: an ADEChallengeData2016 demo tree (seed 0) in a new folder."""
    from foundation_tasks.segmentation import demo

    def write(**sizes) -> Path:
        root = tmp_path_factory.mktemp("ade")
        demo.write(root, seed=0, **sizes)
        return root

    return write


SENTENCES = ["GO LEFT", "STOP", "OPEN THE RED DOOR", "CALL NINE ONE"]


def _corpus(out: Path, seed: int, utts_per_voice: dict[str, int], voices, sentences=None) -> Path:
    counts = make_corpus(out, seed=seed, utts_per_voice=utts_per_voice, n_dev_voices=1, n_test_voices=1,
                         voices=voices, sentences=sentences)
    n_train = len(voices) - 2
    assert counts == {"train": n_train * utts_per_voice["train"], "dev": utts_per_voice["dev"],
                      "test": utts_per_voice["test"]}
    return out


@pytest.fixture(scope="session")
def speech_corpus(tmp_path_factory) -> Path:
    """Six voices (four for training, 8 random sentences each: 32; 2 dev, 2 test)."""
    return _corpus(tmp_path_factory.mktemp("speech-corpus"), 3, {"train": 8, "dev": 2, "test": 2},
                   VOICES[:3] + VOICES[8:11])


@pytest.fixture(scope="session")
def sentences() -> list[str]:
    """What the voices of ``speech`` and ``overfit_corpus`` read, in turn."""
    return list(SENTENCES)


@pytest.fixture(scope="session")
def speech(tmp_path_factory) -> Path:
    """Four voices reading ``sentences``: two train (4 each), dev (2), test (1)."""
    return _corpus(tmp_path_factory.mktemp("speech"), 3, {"train": 4, "dev": 2, "test": 1}, VOICES[:4], SENTENCES)


@pytest.fixture(scope="session")
def overfit_corpus(tmp_path_factory) -> Path:
    """Three voices reading ``sentences``: one train voice (4, each sentence once), dev (1), test (1)."""
    return _corpus(tmp_path_factory.mktemp("overfit-data"), 11, {"train": 4, "dev": 1, "test": 1}, VOICES[:3],
                   SENTENCES)


@pytest.fixture(scope="session")
def best_rq_spec(speech):
    """``spec(**extra)``: a tiny BEST-RQ task entry (id ``speech``) on the ``speech`` corpus."""
    def spec(**extra) -> dict:
        return {"name": "best_rq", "id": "speech", "data_dir": str(speech), "train_splits": ["train"],
                "eval_splits": ["dev"], "vgg_channels": [4, 8], "codebook_size": 64, "codebook_dim": 8,
                "cache_features": True, "mask_prob": 0.05, "mask_span": 10, **extra}

    return spec
