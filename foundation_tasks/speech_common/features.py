"""Audio and features: reading with soundfile (header checks naming the utterance),
80-dim log-mel filterbanks, Kaldi-compatible (``torchaudio.compliance.kaldi.fbank``:
25 ms windows every 10 ms), and ESPnet's global CMVN statistics.

Every problem with an utterance's audio (missing or empty file, a wrong sample rate, too
short for one window) raises ``SpeechDataError`` naming it.
"""
from __future__ import annotations

import functools
import os
import re
import tempfile
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import soundfile as sf
import torch

from foundation_tasks.speech_common.corpus import SpeechDataError, Utterance

WINDOW, SHIFT = 0.025, 0.010  # seconds (Kaldi defaults)


def num_frames(samples: int, sample_rate: int) -> int:
    """Filterbank frames of ``samples`` samples (Kaldi's snip_edges)."""
    window, shift = int(WINDOW * sample_rate), int(SHIFT * sample_rate)
    return 0 if samples < window else 1 + (samples - window) // shift


@functools.lru_cache(maxsize=None)
def audio_frames(utt: Utterance, sample_rate: int) -> int:
    """Filterbank frames of an utterance from its header alone, checking the header
    (remembered: a task checks every utterance up front, then builds its datasets)."""
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


# libsndfile's log of a file whose chunk sizes promise more than the file holds (WAV, AIFF:
# "data : 96000 (should be 47978)"), or of an Ogg stream that stops before its last page
_CUT_SHORT = re.compile(r": (\d+) \(should be (\d+)\)|lacks an end-of-stream")


def cut_short(f: sf.SoundFile, frames_read: int) -> bool:
    """Whether the open file ``f`` held less audio than its header says (``frames_read`` of
    it could be read): libsndfile reads a truncated WAV or Ogg to where it ends without an
    error; its log says so, or (MP3) the header's frame count exceeds what was read."""
    for m in _CUT_SHORT.finditer(f.extra_info):
        # a size one byte over is a missing pad byte; 0xFFFFFFFF the "unknown" size of a streamed WAV
        if m.group(1) is None or int(m.group(2)) + 1 < int(m.group(1)) < 0xFFFFFFFF:
            return True
    return frames_read < f.frames - max(1, f.frames // 100)  # an MP3's count is an estimate


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


class FeatureCache:
    """``features(utt[, speed])``, kept per utterance id (and speed) when ``enabled`` (each worker
    process keeps its own copy: features of a small corpus are computed once, not every epoch)."""

    def __init__(self, features: Callable[..., torch.Tensor], enabled: bool):
        self.features = features
        self.cache: dict[tuple[str, float], torch.Tensor] | None = {} if enabled else None

    def __call__(self, utt: Utterance, speed: float = 1.0) -> torch.Tensor:
        args = (utt,) if speed == 1.0 else (utt, speed)
        if self.cache is None:
            return self.features(*args)
        key = (utt.id, speed)
        if key not in self.cache:
            self.cache[key] = self.features(*args)
        return self.cache[key]
