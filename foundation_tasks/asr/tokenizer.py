"""Sentencepiece units for the transducer: id 0 is blank, sentencepiece id i is unit i + 1.

The model is trained on the training transcripts (unigram, as ESPnet's LibriSpeech
recipes: 5000 units) and written once next to the data; a checksum of the model file is
kept in the checkpoint so that decoding with another tokenizer fails loudly, and the model
itself travels in every model file of the run (for ``foundation predict``).
"""
from __future__ import annotations

import io
import os
import tempfile
import zlib
from pathlib import Path
from typing import Iterable

import sentencepiece as spm

from foundation_tasks.asr.transducer import BLANK


class TranscriptError(ValueError):
    """A transcript cannot be turned into units; the message names the utterance."""


def train_tokenizer(texts: Iterable[str], path: Path, vocab_size: int, model_type: str = "unigram") -> Path:
    """Train sentencepiece on ``texts`` and write the model to ``path`` (atomically)."""
    buf = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(list(texts)), model_writer=buf, vocab_size=vocab_size, model_type=model_type,
            character_coverage=1.0, unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1, num_threads=1,
            input_sentence_size=2_000_000, shuffle_input_sentence=False, minloglevel=2,
        )
    except RuntimeError as e:
        msg = str(e)
        hint = " (too many units for this little text: lower vocab_size)" if "Vocabulary size" in msg else ""
        raise ValueError(f"sentencepiece training for {path} failed: {msg.strip()}{hint}") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "wb") as f:
        f.write(buf.getvalue())
    os.replace(tmp, path)
    return path


class Tokenizer:
    """``encode(text, utt)`` -> unit ids (1..V), ``decode(ids)`` -> text; ``size`` counts
    the blank too (the model's output size)."""

    def __init__(self, path: str | Path, data: bytes | None = None):
        """From the model file at ``path``, or from its bytes (``path`` then only names it)."""
        self.path = Path(path)
        data = self.path.read_bytes() if data is None else data
        self.data = data
        self.crc = zlib.crc32(data)
        try:
            self.sp = spm.SentencePieceProcessor(model_proto=data)
        except RuntimeError:  # sentencepiece's C++ parse error, a multi-line message naming its own source
            raise ValueError(f"{self.path} is not a sentencepiece model (damaged or another kind of file)") from None
        self.size = self.sp.get_piece_size() + 1
        pieces = [self.sp.id_to_piece(i) for i in range(self.sp.get_piece_size()) if not self.sp.is_unknown(i)]
        self.chars = set("".join(pieces).replace("\u2581", "")) | {" "}

    def units(self) -> list[str]:
        """ESPnet's token list: ``<blank>`` then the sentencepiece pieces."""
        return ["<blank>"] + [self.sp.id_to_piece(i) for i in range(self.sp.get_piece_size())]

    def encode(self, text: str, utt: str = "?") -> list[int]:
        unknown = sorted(set(text) - self.chars)
        if unknown:
            raise TranscriptError(f"utterance {utt}: transcript {text!r} has characters outside the tokenizer's "
                                  f"vocabulary ({self.path}): {''.join(unknown)!r}")
        return [i + 1 for i in self.sp.encode(text)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.sp.decode([int(i) - 1 for i in ids if int(i) != BLANK])
