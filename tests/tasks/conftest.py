"""Fixtures the task tests share: small eSpeak NG corpora in the LibriSpeech layout
(``tasks.asr.demo``), each made once per session (tests that break a corpus copy it)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tasks.asr.demo import VOICES, make_corpus

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
