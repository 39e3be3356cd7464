"""``foundation predict`` for speech recognition: audio files -> transcripts.

Any file soundfile (libsndfile) reads, at any sample rate and channel count: channels are
averaged, the audio resampled to the model's rate with torchaudio, then the filterbanks,
CMVN (the head's buffers), encoder and greedy or ESPnet beam search of evaluation, with
the sentencepiece model saved in the model file.

Long files are read and recognised in pieces of at most ``chunk_seconds`` (30 s), each
cut at the quietest 10 ms inside the last quarter of its window so that a cut rarely
falls inside a word; the pieces' transcripts are joined with spaces. Pieces are read as
the encoder takes them (a batch of pieces at a time, across files), so neither memory nor
the encoder's attention grows with the file's length. A file that holds less audio than
its header says (a truncated WAV, Ogg or MP3) is transcribed as far as it goes, with a
``warning`` in its record (a line on stderr from the command line).
"""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Iterator

import numpy as np
import soundfile as sf
import torch

from foundation.engine.predict import AUDIO_EXTENSIONS, InputError, NoPredictor, Predictor
from foundation_tasks.asr.decode import beam_search, greedy_search
from foundation_tasks.asr.tokenizer import Tokenizer
from foundation_tasks.speech_common.features import SHIFT, WINDOW, cut_short, fbank

CHUNK_SECONDS = 30.0


def quietest_cut(audio: np.ndarray, rate: int) -> int:
    """A sample index in the last quarter of ``audio``: the middle of its quietest 10 ms."""
    hop = max(1, int(SHIFT * rate))
    start = (3 * len(audio) // 4) // hop * hop
    frames = audio[start: start + (len(audio) - start) // hop * hop].reshape(-1, hop)
    if not len(frames):
        return len(audio)
    return start + int(np.argmin((frames ** 2).mean(1))) * hop + hop // 2


def audio_pieces(f: sf.SoundFile, rate: int, chunk_seconds: float) -> Iterator[tuple[torch.Tensor, float]]:
    """(mono waveform at ``rate``, seconds) for consecutive pieces of the open file ``f``."""
    import torchaudio.functional as AF

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
        """The file checked to open as audio; it is read in ``predict``, piece by piece."""
        path = Path(source)
        if not path.is_file():
            raise InputError(f"{path}: no such file")
        if path.stat().st_size == 0:
            raise InputError(f"{path}: empty file (0 bytes)")
        try:
            sf.info(str(path))
        except (sf.LibsndfileError, RuntimeError, TypeError) as e:
            raise InputError(f"{path}: not an audio file soundfile can read ({e}); a speech model takes audio "
                             "(wav, flac, ogg, mp3, ...)") from None
        return {"path": path, "chunk_seconds": chunk_seconds, "seconds": 0.0}

    def features(self, item: dict) -> Iterator[torch.Tensor]:
        """The filterbanks of the item's pieces as they are read (``item["seconds"]`` counts
        the audio read; ``item["warning"]`` says when the file held less than its header said)."""
        with sf.SoundFile(str(item["path"])) as f:
            for wav, seconds in audio_pieces(f, self.rate, item["chunk_seconds"]):
                item["seconds"] += seconds
                if len(wav) >= int(WINDOW * self.rate):  # a remainder shorter than one window has no frame
                    yield fbank(wav, self.rate, self.mel)
            if cut_short(f, round(item["seconds"] * f.samplerate)):
                item["warning"] = (f"the file is truncated (its header promises more audio than it holds); "
                                   f"transcribed the {item['seconds']:.1f} s it holds")

    def predict(self, items, beam: int | None = None, **_) -> list[dict]:
        texts: list[list[str]] = [[] for _ in items]

        def pieces() -> Iterator[tuple[int, torch.Tensor]]:
            for k, item in enumerate(items):
                try:
                    yield from ((k, feats) for feats in self.features(item))
                except (sf.LibsndfileError, RuntimeError) as e:  # a damaged file, met part-way (FLAC loses sync)
                    item["error"] = f"{item['path']}: cannot read the audio after {item['seconds']:.1f} s ({e})"

        stream = pieces()
        while chunk := list(itertools.islice(stream, self.default_batch_size)):
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
        return [self._record(item, parts) for parts, item in zip(texts, items)]

    @staticmethod
    def _record(item: dict, parts: list[str]) -> dict:
        if "error" in item:
            return {"error": item["error"]}
        if not parts:  # a file that short has no frame
            return {"error": f"{item['path']}: {item['seconds'] * 1000:.0f} ms of audio, shorter than one "
                             f"{WINDOW * 1000:.0f} ms analysis window"}
        return {"text": " ".join(t for t in parts if t), "seconds": round(item["seconds"], 3),
                **({"warning": item["warning"]} if "warning" in item else {})}

    def describe(self, record) -> str:
        return record["text"]
