"""Untranscribed speech for BEST-RQ, and span masking of the input frames.

The utterances come from ``foundation_tasks.speech_common.corpus`` without transcripts (``Utterance``
records with empty text; audio headers are checked up front):

* LibriSpeech layout: every ``<split>/<speaker>/<chapter>/*.flac`` (a ``trans.txt`` beside
  them is allowed, not needed: LibriSpeech, Libri-Light-style folders);
* Kaldi / ESPnet data dir: ``wav.scp`` (``utt path``), optionally ``utt2spk``; no ``text``.

Items are single utterances (the engine's ``batch_size`` counts utterances), optionally
cropped to ``crop_frames`` at random in training, with their mask drawn from a generator
seeded per item (new masks every epoch in training, the same ones at every evaluation).
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import torch
from torch.utils.data import Dataset

from foundation.engine.data import item_seed
from foundation_tasks.speech_common.corpus import Utterance
from foundation_tasks.speech_common.features import FeatureCache


def span_mask(frames: int, prob: float, span: int, rng: np.random.Generator) -> np.ndarray:
    """(frames,) bool: every frame starts a masked span of ``span`` frames with probability
    ``prob`` (spans may overlap; the last ones are cut at the end). Masked fraction, away
    from the edges: 1 - (1 - prob) ** span (BEST-RQ: 0.01 and 40 frames of 10 ms -> ~33%)."""
    starts = np.flatnonzero(rng.random(frames) < prob)
    mask = np.zeros(frames + span, dtype=bool)
    for s in starts:
        mask[s: s + span] = True
    return mask[:frames]


class SpeechDataset(Dataset):
    """Item i: ``(features (L, F) float, mask (L,) bool, split index)`` of utterance i."""

    def __init__(self, utts: list[tuple[Utterance, int]], features: Callable[[Utterance], torch.Tensor], *,
                 train: bool, mask_prob: float, mask_span: int, crop_frames: Optional[int] = None,
                 cache: bool = False):
        self.utts, self.feats, self.train = utts, FeatureCache(features, cache), train
        self.mask_prob, self.mask_span, self.crop_frames = mask_prob, mask_span, crop_frames

    def __len__(self) -> int:
        return len(self.utts)

    def __getitem__(self, i: int):
        utt, split = self.utts[i]
        rng = np.random.default_rng(item_seed(i, self.train))
        feats = self.feats(utt)
        if self.train and self.crop_frames is not None and feats.shape[0] > self.crop_frames:
            start = int(rng.integers(0, feats.shape[0] - self.crop_frames + 1))
            feats = feats[start: start + self.crop_frames]
        mask = torch.from_numpy(span_mask(feats.shape[0], self.mask_prob, self.mask_span, rng))
        return feats, mask, split


def collate(samples: list) -> dict[str, torch.Tensor]:
    """Padded batch: ``feats`` (B, L, F), ``feat_lens`` (B,), ``mask`` (B, L) bool (False on
    padding), ``split`` (B,)."""
    B, L = len(samples), max(f.shape[0] for f, _, _ in samples)
    feats = torch.zeros(B, L, samples[0][0].shape[1])
    mask = torch.zeros(B, L, dtype=torch.bool)
    for b, (f, m, _) in enumerate(samples):
        feats[b, : f.shape[0]] = f
        mask[b, : m.shape[0]] = m
    return {"feats": feats, "feat_lens": torch.tensor([f.shape[0] for f, _, _ in samples]), "mask": mask,
            "split": torch.tensor([s for _, _, s in samples])}
