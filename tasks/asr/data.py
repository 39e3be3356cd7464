"""Speech data in its real on-disk layouts, features, CMVN statistics and bucketing.

Readers (each returns ``Utterance`` records, checked before any training):

* LibriSpeech: ``<split>/<speaker>/<chapter>/<utt>.flac`` + ``<speaker>-<chapter>.trans.txt``
* Kaldi / ESPnet data dir: ``wav.scp`` (``utt path``), ``text`` (``utt transcript``),
  optional ``utt2spk``; read with ESPnet's ``read_2columns_text``

Audio is read with soundfile; features are 80-dim log-mel filterbanks, Kaldi-compatible
(``torchaudio.compliance.kaldi.fbank``: 25 ms windows every 10 ms). Batches are length
buckets from ESPnet's ``LengthBatchSampler``: utterances sorted by length and cut so that
each batch holds at most ``max_frames`` padded frames. Every problem with an utterance
(missing or empty audio, a wrong sample rate, characters outside the vocabulary) raises
``SpeechDataError`` naming it.
"""
from __future__ import annotations

import functools
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import soundfile as sf
import torch
from torch.utils.data import Dataset

from foundation.config import ConfigError

LAYOUTS = ("librispeech", "kaldi")
WINDOW, SHIFT = 0.025, 0.010  # seconds (Kaldi defaults)


class SpeechDataError(ConfigError):
    """A corpus or one of its utterances cannot be used; the message names it. (A
    ``ConfigError``: the command line reports it as a problem with the data the config
    points at, without a traceback.)"""


@dataclass(frozen=True)
class Utterance:
    id: str
    audio: str  # path
    text: str
    speaker: str = ""


# --------------------------------------------------------------------------- readers

def read_librispeech(split_dir: str | Path) -> list[Utterance]:
    """Every ``<speaker>/<chapter>/<speaker>-<chapter>.trans.txt`` under ``split_dir``."""
    root = Path(split_dir)
    if not root.is_dir():
        raise SpeechDataError(f"LibriSpeech split not found: {root}")
    out = []
    for trans in sorted(root.glob("*/*/*.trans.txt")):
        for n, line in enumerate(trans.read_text().splitlines(), 1):
            if not line.strip():
                continue
            utt, _, text = line.strip().partition(" ")
            if not text.strip():  # it would train towards an empty target
                raise SpeechDataError(f"{trans}, line {n}: utterance {utt} has no transcript (expected "
                                      f"'{utt} WORDS ...')")
            out.append(Utterance(utt, str(trans.parent / f"{utt}.flac"), text.strip(), trans.parent.parent.name))
    if not out:
        raise SpeechDataError(f"{root}: no <speaker>/<chapter>/*.trans.txt files (is this a LibriSpeech split?)")
    return out


def read_kaldi_dir(data_dir: str | Path) -> list[Utterance]:
    """A Kaldi / ESPnet data directory: ``wav.scp``, ``text`` and optionally ``utt2spk``."""
    from espnet2.fileio.read_text import read_2columns_text

    root = Path(data_dir)
    for name in ("wav.scp", "text"):
        if not (root / name).is_file():
            raise SpeechDataError(f"Kaldi data dir {root}: {name} not found")
    wavs = read_2columns_text(root / "wav.scp")
    texts = read_2columns_text(root / "text")
    spk = read_2columns_text(root / "utt2spk") if (root / "utt2spk").is_file() else {}
    no_audio = [u for u in texts if u not in wavs]
    if no_audio:
        raise SpeechDataError(f"{root}: utterance {no_audio[0]} has a transcript in text but no entry in wav.scp"
                              + (f" ({len(no_audio) - 1} more)" if len(no_audio) > 1 else ""))
    empty = [u for u, text in texts.items() if not text.strip()]
    if empty:  # an id alone on its line would train towards an empty target
        raise SpeechDataError(f"{root}/text: utterance {empty[0]} has no transcript (expected '{empty[0]} WORDS ...')"
                              + (f" ({len(empty) - 1} more)" if len(empty) > 1 else ""))
    out = [Utterance(utt, wav_path(root, utt, wavs[utt]), text.strip(), spk.get(utt, "")) for utt, text in texts.items()]
    if not out:
        raise SpeechDataError(f"{root}/text is empty")
    return out


def wav_path(root: Path, utt: str, entry: str) -> str:
    """A wav.scp entry as a file path: relative to the data dir when it exists there; piped
    commands (Kaldi's ``... |``) are refused."""
    path = entry.strip()
    if path.endswith("|"):
        raise SpeechDataError(f"{root}/wav.scp: utterance {utt}: piped commands are not supported "
                              f"({path!r}); write the audio to files first")
    if not os.path.isabs(path) and (root / path).exists():
        path = str(root / path)
    return path


def read_split(root: str | Path, split: str, layout: str) -> list[Utterance]:
    if layout not in LAYOUTS:
        raise SpeechDataError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    reader = read_librispeech if layout == "librispeech" else read_kaldi_dir
    return reader(Path(root) / split)


# --------------------------------------------------------------------------- audio and features

def num_frames(samples: int, sample_rate: int) -> int:
    """Filterbank frames of ``samples`` samples (Kaldi's snip_edges)."""
    window, shift = int(WINDOW * sample_rate), int(SHIFT * sample_rate)
    return 0 if samples < window else 1 + (samples - window) // shift


@functools.lru_cache(maxsize=None)
def audio_frames(utt: Utterance, sample_rate: int) -> int:
    """Filterbank frames of an utterance from its header alone, checking the header
    (remembered: the task checks every utterance up front, then builds its datasets)."""
    _check_file(utt)
    try:
        info = sf.info(utt.audio)
    except FileNotFoundError:
        raise SpeechDataError(f"utterance {utt.id}: audio file not found: {utt.audio}") from None
    except (RuntimeError, sf.LibsndfileError) as e:
        if not os.path.exists(utt.audio):
            raise SpeechDataError(f"utterance {utt.id}: audio file not found: {utt.audio}") from None
        raise SpeechDataError(f"utterance {utt.id}: cannot read {utt.audio}: {e}") from None
    return _checked_frames(utt, info.frames, info.samplerate, sample_rate)


def _check_file(utt: Utterance) -> None:
    if not os.path.exists(utt.audio):
        raise SpeechDataError(f"utterance {utt.id}: audio file not found: {utt.audio}")
    if os.path.getsize(utt.audio) == 0:
        raise SpeechDataError(f"utterance {utt.id}: {utt.audio} is empty (0 bytes)")


def _checked_frames(utt: Utterance, samples: int, rate: int, sample_rate: int) -> int:
    if rate != sample_rate:
        raise SpeechDataError(f"utterance {utt.id}: {utt.audio} is sampled at {rate} Hz, expected {sample_rate} Hz "
                              "(resample the corpus, or set sample_rate)")
    if samples == 0:
        raise SpeechDataError(f"utterance {utt.id}: {utt.audio} is empty (0 samples)")
    frames = num_frames(samples, rate)
    if frames == 0:
        raise SpeechDataError(f"utterance {utt.id}: {utt.audio} is shorter than one {WINDOW * 1000:.0f} ms window "
                              f"({samples} samples)")
    return frames


def load_audio(utt: Utterance, sample_rate: int) -> torch.Tensor:
    """Mono float waveform in [-1, 1]."""
    _check_file(utt)
    try:
        wav, rate = sf.read(utt.audio, dtype="float32", always_2d=True)
    except (RuntimeError, sf.LibsndfileError) as e:
        raise SpeechDataError(f"utterance {utt.id}: cannot read {utt.audio}: {e}") from None
    _checked_frames(utt, wav.shape[0], rate, sample_rate)
    return torch.from_numpy(wav.mean(axis=1))


def fbank(wav: torch.Tensor, sample_rate: int, num_mel_bins: int = 80) -> torch.Tensor:
    """(frames, num_mel_bins) Kaldi log-mel filterbank of a [-1, 1] waveform."""
    import torchaudio.compliance.kaldi as kaldi

    return kaldi.fbank(wav[None] * 32768.0, num_mel_bins=num_mel_bins, sample_frequency=sample_rate,
                       frame_length=WINDOW * 1000, frame_shift=SHIFT * 1000, dither=0.0, energy_floor=0.0)


def cmvn_stats(feats: Sequence[torch.Tensor] | Callable[[], Sequence[torch.Tensor]]) -> dict[str, np.ndarray]:
    """ESPnet's global statistics: frame ``count``, per-dimension ``sum`` and ``sum_square``."""
    count, total, square = 0, 0.0, 0.0
    for f in feats:
        f = f.double()
        count += f.shape[0]
        total = total + f.sum(0).numpy()
        square = square + (f * f).sum(0).numpy()
    return {"count": np.array(count), "sum": np.asarray(total), "sum_square": np.asarray(square)}


def save_stats(stats: dict[str, np.ndarray], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".npz", dir=path.parent)
    os.close(fd)
    np.savez(tmp, **stats)
    os.replace(tmp, path)


# --------------------------------------------------------------------------- batching

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


class FeatureCache:
    """``features(utt)``, kept per utterance id when ``enabled`` (each worker process keeps
    its own copy: features of a small corpus are computed once, not every epoch)."""

    def __init__(self, features: Callable[[Utterance], torch.Tensor], enabled: bool):
        self.features = features
        self.cache: dict[str, torch.Tensor] | None = {} if enabled else None

    def __call__(self, utt: Utterance) -> torch.Tensor:
        if self.cache is None:
            return self.features(utt)
        if utt.id not in self.cache:
            self.cache[utt.id] = self.features(utt)
        return self.cache[utt.id]


class BucketDataset(Dataset):
    """Item i is the whole bucket i: a list of (utterance, features, unit ids, split index).

    The engine samples items, so giving it buckets keeps the length bucketing under the
    engine's own seeded, resumable, sharded sampler (``batch_size`` 1 = one bucket)."""

    def __init__(self, utts: dict[str, tuple[Utterance, list[int], int]], buckets: list[tuple[str, ...]],
                 features: Callable[[Utterance], torch.Tensor], cache: bool = False):
        self.utts, self.buckets, self.feats = utts, buckets, FeatureCache(features, cache)

    def __len__(self) -> int:
        return len(self.buckets)

    def __getitem__(self, i: int) -> list:
        out = []
        for uid in self.buckets[i]:
            utt, ids, split = self.utts[uid]
            out.append((utt, self.feats(utt), ids, split))
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
