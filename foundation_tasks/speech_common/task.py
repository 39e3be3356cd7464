"""What every speech task (ASR, BEST-RQ) has: the data and front-end config fields and
their checks, reading the splits once, the global CMVN statistics computed once per set of
training splits (one file, ``<prep_dir>/feats_stats_fbank<bins>.npz``, that both tasks
read) and loaded into the head's ``cmvn``.

The config fields themselves stay in each task's dataclass (in the order its YAML
documents them); ``SpeechFields`` adds only the derived paths, so it declares no field.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable, ClassVar

import numpy as np
import torch

from foundation.config import ConfigError
from foundation.engine.task import Task
from foundation_tasks.speech_common.corpus import LAYOUTS, SpeechDataError, Utterance, read_split
from foundation_tasks.speech_common.features import cmvn_stats, fbank, load_audio, save_stats
from foundation_tasks.speech_common.cmvn import GlobalCMVN


def check_speech_fields(cfg) -> Callable[[str, str], ConfigError]:
    """The fields every speech task config has (ASR, BEST-RQ): data layout and splits, audio
    features, CMVN, VGG front end. Returns the config's error maker for its own checks."""
    def bad(name: str, msg: str) -> ConfigError:
        return ConfigError(f"field {name!r}: {msg} (got {getattr(cfg, name)!r})")

    if cfg.layout not in LAYOUTS:
        raise bad("layout", f"must be one of {', '.join(LAYOUTS)}")
    for name in ("train_splits", "eval_splits"):
        if not getattr(cfg, name):
            raise bad(name, "list at least one split")
    for name in ("sample_rate", "num_mel_bins", "cmvn_max_utterances"):
        if getattr(cfg, name) < 1:
            raise bad(name, "must be >= 1")
    if len(cfg.vgg_channels) != 2 or min(cfg.vgg_channels) < 1:
        raise bad("vgg_channels", "two positive channel counts")
    return bad


class SpeechFields:
    """Paths derived from a speech config's ``data_dir``, ``prep_dir``, ``train_splits`` and
    ``num_mel_bins`` (a mixin of the config dataclasses)."""

    @property
    def prep_path(self) -> Path:
        return Path(self.prep_dir) if self.prep_dir else Path(self.data_dir) / "prep" / "+".join(self.train_splits)

    @property
    def stats_path(self) -> Path:
        return self.prep_path / f"feats_stats_fbank{self.num_mel_bins}.npz"  # ESPnet's GlobalMVN format


class SpeechTask(Task):
    """Base of the speech tasks: splits read once (``transcripts`` says whether they need
    them), filterbank features, the CMVN statistics."""

    modality = "speech"
    embedding_params = ("frontend", "cmvn")
    transcripts: ClassVar[bool] = True

    def __init__(self, cfg, backbone):
        super().__init__(cfg, backbone)
        self._splits: dict[str, list[Utterance]] = {}

    def say(self, message: str) -> None:
        if int(os.environ.get("RANK", 0)) == 0:
            print(f"[{self.name}] {message}", file=sys.stderr, flush=True)

    def utterances(self, split: str) -> list[Utterance]:
        if split not in self._splits:
            try:
                self._splits[split] = read_split(self.cfg.data_dir, split, self.cfg.layout,
                                                 transcripts=self.transcripts)
            except SpeechDataError as e:
                field_name = "train_splits" if split in self.cfg.train_splits else "eval_splits"
                raise ConfigError(f"field {field_name!r}: {e}") from None
        return self._splits[split]

    def train_utterances(self) -> list[Utterance]:
        return [u for s in self.cfg.train_splits for u in self.utterances(s)]

    def check_data_dir(self) -> None:
        if not Path(self.cfg.data_dir).is_dir():
            raise ConfigError(f"field 'data_dir': directory not found: {self.cfg.data_dir} "
                              f"(a demo corpus: foundation data make speech --out {self.cfg.data_dir})")

    def check_encoder(self) -> None:
        if self.backbone_cfg.arch != "encoder":
            raise ConfigError(f"field 'backbone.arch': {self.name} needs an 'encoder' backbone "
                              f"(got {self.backbone_cfg.arch!r})")

    def features(self, utt: Utterance, speed: float = 1.0) -> torch.Tensor:
        wav = load_audio(utt, self.cfg.sample_rate)
        if speed != 1.0:
            from torchaudio.functional import speed as change_speed

            wav = change_speed(wav, self.cfg.sample_rate, speed)[0]
        return fbank(wav, self.cfg.sample_rate, self.cfg.num_mel_bins)

    def prepare_cmvn(self) -> None:
        """The global CMVN statistics of the training splits, once (ESPnet's stage 5)."""
        c = self.cfg
        if c.stats_path.is_file():
            return
        utts = self.train_utterances()
        step = max(1, len(utts) // c.cmvn_max_utterances)
        chosen = utts[::step][: c.cmvn_max_utterances]
        self.say(f"computing global CMVN statistics over {len(chosen)} training utterances -> {c.stats_path}")
        save_stats(cmvn_stats(self.features(u) for u in chosen), c.stats_path)

    def load_cmvn(self, cmvn: GlobalCMVN) -> None:
        """The statistics ``prepare_cmvn`` wrote, when they are there (a checkpoint loaded
        later brings its own values)."""
        if self.cfg.stats_path.is_file():
            stats = np.load(self.cfg.stats_path)
            cmvn.set_stats(float(stats["count"]), stats["sum"], stats["sum_square"])
