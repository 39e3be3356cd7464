"""ASR batches: transcribed utterances (``foundation_tasks.speech_common``: layouts, audio, features)
in length buckets from ESPnet's ``LengthBatchSampler``: utterances sorted by length and cut
so that each batch holds at most ``max_frames`` padded frames; a dataset item is a whole
bucket, and ``collate`` pads features and unit ids.
"""
from __future__ import annotations

import os
import tempfile
from typing import Callable, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from foundation.engine.data import item_seed
from foundation_tasks.speech_common.corpus import SpeechDataError, Utterance
from foundation_tasks.speech_common.features import FeatureCache


def length_buckets(lengths: dict[str, int], max_frames: int) -> list[tuple[str, ...]]:
    """ESPnet's ``LengthBatchSampler`` (padding=True, ``batch_bins=max_frames``): utterance
    ids sorted by length and cut into batches, longest first within a batch; a batch is
    closed with the first utterance that takes batch size x longest length past
    ``max_frames`` (ESPnet's rule): without that last, longest utterance it fits, and
    since lengths are sorted it overshoots by about one utterance."""
    from espnet2.samplers.length_batch_sampler import LengthBatchSampler

    longest = max(lengths.values())
    if longest > max_frames:
        utt = max(lengths, key=lengths.get)
        raise SpeechDataError(f"utterance {utt}: {longest} frames, more than max_frames={max_frames} "
                              "(raise max_frames or drop the utterance)")
    fd, shape_file = tempfile.mkstemp(prefix="speech_shape.", suffix=".txt")
    try:
        with os.fdopen(fd, "w") as f:  # ESPnet's shape file: "utt_id length"
            f.writelines(f"{u} {n}\n" for u, n in lengths.items())
        sampler = LengthBatchSampler(batch_bins=max_frames, shape_files=[shape_file])
        return list(sampler)
    finally:
        os.unlink(shape_file)


class BucketDataset(Dataset):
    """Item i is the whole bucket i: a list of (utterance, features, unit ids, split index).

    The engine samples items, so giving it buckets keeps the length bucketing under the
    engine's own seeded, resumable, sharded sampler (``batch_size`` 1 = one bucket)."""

    def __init__(self, utts: dict[str, tuple[Utterance, list[int], int]], buckets: list[tuple[str, ...]],
                 features: Callable[..., torch.Tensor], cache: bool = False, speeds: Sequence[float] = ()):
        self.utts, self.buckets, self.feats = utts, buckets, FeatureCache(features, cache)
        self.speeds = list(speeds)  # speed perturbation: each utterance at one of these, drawn per item

    def __len__(self) -> int:
        return len(self.buckets)

    def __getitem__(self, i: int) -> list:
        # the speeds are a function of the item's seed (foundation.engine.data.item_seed): the
        # same on resume and with any number of workers; a bucket keeps its utterances (their
        # lengths move by the speed, at most max_frames / min(speeds) padded frames a batch)
        speeds = [1.0] * len(self.buckets[i])
        if self.speeds:
            rng = np.random.default_rng(item_seed(i))
            speeds = [self.speeds[k] for k in rng.integers(len(self.speeds), size=len(speeds))]
        out = []
        for uid, speed in zip(self.buckets[i], speeds):
            utt, ids, split = self.utts[uid]
            out.append((utt, self.feats(utt, speed), ids, split))
        return out


def collate(buckets: list[list]) -> dict:
    """One or more buckets -> padded batch: ``feats`` (B, L, F), ``feat_lens``, ``targets``
    (B, U) (0-padded), ``target_lens``, ``split`` (B,) and ``ids`` / ``texts`` lists."""
    items = [x for bucket in buckets for x in bucket]
    B = len(items)
    L = max(f.shape[0] for _, f, _, _ in items)
    U = max(len(ids) for _, _, ids, _ in items)
    feats = torch.zeros(B, L, items[0][1].shape[1])
    targets = torch.zeros(B, max(U, 1), dtype=torch.long)
    for b, (_, f, ids, _) in enumerate(items):
        feats[b, : f.shape[0]] = f
        targets[b, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return {
        "feats": feats,
        "feat_lens": torch.tensor([f.shape[0] for _, f, _, _ in items]),
        "targets": targets,
        "target_lens": torch.tensor([len(ids) for _, _, ids, _ in items]),
        "split": torch.tensor([s for _, _, _, s in items]),
        "ids": [u.id for u, _, _, _ in items],
        "texts": [u.text for u, _, _, _ in items],
    }
