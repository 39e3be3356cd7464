"""``foundation predict`` for speech recognition: audio files -> transcripts.

Any file soundfile (libsndfile) reads, at any sample rate and channel count: channels are
averaged, the audio resampled to the model's rate with torchaudio, then the filterbanks,
CMVN (the head's buffers), encoder and greedy or ESPnet beam search of evaluation, with
the sentencepiece model saved in the model file.

Long files are read and recognised in pieces of at most ``chunk_seconds`` (30 s), each
cut at the quietest 10 ms inside the last quarter of its window so that a cut rarely
falls inside a word; the pieces' transcripts are joined with spaces. So neither the
audio read at once nor the encoder's attention grows with the file's length.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np
import soundfile as sf
import torch

from foundation.engine.predict import AUDIO_EXTENSIONS, InputError, NoPredictor, Predictor
from foundation_tasks.asr.decode import beam_search, greedy_search
from foundation_tasks.asr.tokenizer import Tokenizer
from foundation_tasks.speech_common.features import SHIFT, WINDOW, fbank

CHUNK_SECONDS = 30.0


def quietest_cut(audio: np.ndarray, rate: int) -> int:
    """A sample index in the last quarter of ``audio``: the middle of its quietest 10 ms."""
    hop = max(1, int(SHIFT * rate))
    start = (3 * len(audio) // 4) // hop * hop
    frames = audio[start: start + (len(audio) - start) // hop * hop].reshape(-1, hop)
    if not len(frames):
        return len(audio)
    return start + int(np.argmin((frames ** 2).mean(1))) * hop + hop // 2


def audio_pieces(path: Path, rate: int, chunk_seconds: float) -> Iterator[tuple[torch.Tensor, float]]:
    """(mono waveform at ``rate``, seconds) for consecutive pieces of the file."""
    import torchaudio.functional as AF

    with sf.SoundFile(str(path)) as f:
        source_rate = f.samplerate
        window = max(int(chunk_seconds * source_rate), int(2 * WINDOW * source_rate))
        carry = np.zeros(0, np.float32)
        while True:
            block = f.read(window - len(carry), dtype="float32", always_2d=True)
            audio = np.concatenate([carry, block.mean(axis=1)])  # channels mixed down
            last = len(audio) < window
            cut = len(audio) if last else quietest_cut(audio, source_rate)
            piece, carry = audio[:cut], audio[cut:]
            if len(piece):
                wav = torch.from_numpy(np.ascontiguousarray(piece))
                if source_rate != rate:
                    wav = AF.resample(wav, source_rate, rate)
                yield wav, len(piece) / source_rate
            if last:
                return


class ASRPredictor(Predictor):
    input_kind = "audio"
    extensions = AUDIO_EXTENSIONS
    default_batch_size = 8  # pieces of audio per forward pass

    def __init__(self, *args):
        super().__init__(*args)
        m = self.meta
        self.rate, self.mel = int(m["sample_rate"]), int(m["num_mel_bins"])
        self.tokenizer = Tokenizer("<model file's sentencepiece model>", m["tokenizer"])
        if int(self.head.cmvn.frames) == 0:
            raise NoPredictor("this ASR model has no CMVN statistics (it was never trained)")

    def load(self, source, chunk_seconds: float = CHUNK_SECONDS, **_) -> dict:
        path = Path(source)
        if not path.is_file():
            raise InputError(f"{path}: no such file")
        if path.stat().st_size == 0:
            raise InputError(f"{path}: empty file (0 bytes)")
        try:
            pieces = list(audio_pieces(path, self.rate, chunk_seconds))
        except (sf.LibsndfileError, RuntimeError, TypeError) as e:
            raise InputError(f"{path}: not an audio file soundfile can read ({e}); a speech model takes audio "
                             "(wav, flac, ogg, mp3, ...)") from None
        seconds = sum(s for _, s in pieces)
        # a remainder shorter than one window has no frame; a file that short has nothing
        feats = [fbank(wav, self.rate, self.mel) for wav, _ in pieces if len(wav) >= int(WINDOW * self.rate)]
        if not feats:
            raise InputError(f"{path}: {seconds * 1000:.0f} ms of audio, shorter than one {WINDOW * 1000:.0f} ms "
                             "analysis window")
        return {"feats": feats, "seconds": seconds}

    def predict(self, items, beam: int | None = None, **_) -> list[dict]:
        feats = [(k, f) for k, item in enumerate(items) for f in item["feats"]]
        texts: list[list[str]] = [[] for _ in items]
        for start in range(0, len(feats), self.default_batch_size):
            chunk = feats[start:start + self.default_batch_size]
            lens = torch.tensor([f.shape[0] for _, f in chunk])
            x = torch.zeros(len(chunk), int(lens.max()), self.mel)
            for b, (_, f) in enumerate(chunk):
                x[b, : f.shape[0]] = f
            enc, enc_lens, _ = self.head.encode(self.backbone, x.to(self.device), lens.to(self.device))
            enc = enc.float()
            if beam:
                ids = beam_search(self.head.predictor, self.head.joint, enc, enc_lens, beam, self.meta["beam_search"])
            else:
                ids = greedy_search(self.head.predictor, self.head.joint, enc, enc_lens,
                                    self.meta["max_symbols_per_frame"])
            for (k, _), hyp in zip(chunk, ids):
                texts[k].append(self.tokenizer.decode(hyp))
        return [{"text": " ".join(t for t in parts if t), "seconds": round(item["seconds"], 3)}
                for parts, item in zip(texts, items)]

    def describe(self, record) -> str:
        return record["text"]
