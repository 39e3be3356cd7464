"""BEST-RQ: self-supervised speech pretraining with a random-projection quantizer
(Chiu et al. 2022), on the ASR task's data layouts without transcripts.

    tasks:
      - name: best_rq
        data_dir: data/speech-demo        # LibriSpeech layout (or layout: kaldi, a wav.scp)
        train_splits: [train]
        eval_splits: [dev]
        codebook_size: 8192               # the paper's: 8192 codes of dimension 16
        codebook_dim: 16
        mask_prob: 0.01                   # per 10 ms frame: the start of a masked span
        mask_span: 40                     # 400 ms; masked frames become N(0, 0.1^2) noise

The features are 80-dim filterbanks normalised with global CMVN statistics of the
training data (``foundation_tasks.speech_common``: the file the ASR task reads too,
``<prep_dir>/feats_stats_fbank80.npz``, computed if missing); targets come from 4 stacked frames, one per encoder frame of the VGG front end.
Evaluation reports the accuracy of the predicted codes on the masked encoder frames of
the evaluation splits (fixed masks and noise), their cross-entropy and the fraction of
input frames masked. Fine-tune ASR from a run with ``init_from`` (the backbone and the
VGG front end).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import torch
from torch import nn

from foundation.config import ConfigError
from foundation.engine.task import register_task
from foundation_tasks.best_rq.data import SpeechDataset, collate
from foundation_tasks.best_rq.metrics import best_rq_metrics, best_rq_sums
from foundation_tasks.best_rq.model import EXPERT, BestRQHead
from foundation_tasks.speech_common.features import audio_frames
from foundation_tasks.speech_common.task import SpeechFields, SpeechTask, check_speech_fields


@dataclass
class BestRQConfig(SpeechFields):
    # data: <data_dir>/<split> in the LibriSpeech layout, or Kaldi data dirs (layout: kaldi); no transcripts needed
    data_dir: str = "data/LibriSpeech"
    layout: str = "librispeech"  # librispeech | kaldi
    train_splits: List[str] = field(default_factory=lambda: ["train-clean-100", "train-clean-360", "train-other-500"])
    eval_splits: List[str] = field(default_factory=lambda: ["dev-clean", "dev-other"])
    sample_rate: int = 16000
    num_mel_bins: int = 80
    prep_dir: Optional[str] = None  # CMVN statistics; default <data_dir>/prep/<train splits> (shared with asr)
    cmvn_max_utterances: int = 10000
    cache_features: bool = False  # keep filterbanks in memory (small corpora)
    utterance_mean: bool = False  # each utterance's own mean off after the global CMVN (as the asr task's)
    crop_frames: Optional[int] = None  # training: random crops of at most this many 10 ms frames
    max_eval_utterances: Optional[int] = None  # evaluate on this many (evenly spread); null = all
    # model
    vgg_channels: List[int] = field(default_factory=lambda: [64, 128])
    # quantizer (frozen, from quantizer_seed) and masking (BEST-RQ Sec. 2-3)
    codebook_size: int = 8192
    codebook_dim: int = 16
    num_codebooks: int = 1
    quantizer_seed: int = 0
    mask_prob: float = 0.01  # per input frame: the probability that a masked span starts there
    mask_span: int = 40  # input frames (10 ms) per span: 400 ms
    mask_noise_std: float = 0.1

    def __post_init__(self) -> None:
        bad = check_speech_fields(self)
        for name in ("codebook_dim", "num_codebooks", "mask_span"):
            if getattr(self, name) < 1:
                raise bad(name, "must be >= 1")
        if self.codebook_size < 2:
            raise bad("codebook_size", "must be >= 2")
        for name in ("crop_frames", "max_eval_utterances"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise bad(name, "must be >= 1 or null")
        if not 0.0 < self.mask_prob < 1.0:
            raise bad("mask_prob", "must be in (0, 1)")
        if self.mask_noise_std < 0:
            raise bad("mask_noise_std", "must be >= 0")


@register_task("best_rq")
class BestRQ(SpeechTask):
    """BEST-RQ pretraining of the backbone's speech expert; reads the audio alone."""

    Config = BestRQConfig
    primary_metric = "accuracy"
    higher_is_better = True
    modality = EXPERT
    transcripts = False

    def check(self) -> None:
        c, b = self.cfg, self.backbone_cfg
        self.check_data_dir()
        self.check_encoder()
        if b.experts and EXPERT not in b.experts:
            raise ConfigError(f"field 'backbone.experts': the speech frames take the {EXPERT!r} expert, which "
                              f"{list(b.experts)} lacks")
        for split in c.train_splits + c.eval_splits:
            for u in self.utterances(split):  # every audio header, before any training
                audio_frames(u, c.sample_rate)
        self.prepare_cmvn()

    def build_head(self, shared=None) -> BestRQHead:
        c = self.cfg
        head = BestRQHead(dim=self.backbone_cfg.dim, num_mel_bins=c.num_mel_bins, vgg_channels=c.vgg_channels,
                          codebook_size=c.codebook_size, codebook_dim=c.codebook_dim, num_codebooks=c.num_codebooks,
                          quantizer_seed=c.quantizer_seed, mask_noise_std=c.mask_noise_std,
                          utterance_mean=c.utterance_mean)
        self.load_cmvn(head.cmvn)
        return head

    def _dataset(self, train: bool) -> SpeechDataset:
        c = self.cfg
        splits = c.train_splits if train else c.eval_splits
        utts = [(u, k) for k, s in enumerate(splits) for u in self.utterances(s)]
        if not train and c.max_eval_utterances is not None and len(utts) > c.max_eval_utterances:
            step = len(utts) / c.max_eval_utterances
            utts = [utts[int(i * step)] for i in range(c.max_eval_utterances)]
        return SpeechDataset(utts, self.features, train=train, mask_prob=c.mask_prob, mask_span=c.mask_span,
                             crop_frames=c.crop_frames, cache=c.cache_features)

    def train_dataset(self) -> SpeechDataset:
        return self._dataset(True)

    def eval_dataset(self) -> SpeechDataset:
        return self._dataset(False)

    def collate(self, samples: list) -> dict:
        return collate(samples)

    def eval_step(self, head: BestRQHead, backbone: nn.Module, batch) -> dict[str, torch.Tensor]:
        logits, targets, _ = head.predict(backbone, batch)
        return best_rq_sums(logits, targets, batch["mask"].sum(), batch["feat_lens"].sum())

    def metrics(self, totals) -> dict[str, float]:
        return best_rq_metrics(totals)
