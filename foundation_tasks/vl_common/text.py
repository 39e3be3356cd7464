"""Text tokenizers of the vision-language tasks: text -> ``[bos] pieces [eos]`` ids.

* ``open_clip`` (default): open_clip's bundled CLIP BPE (49,408 ids, ``<start_of_text>`` /
  ``<end_of_text>`` as bos / eos), which ships inside the package and works offline. CLIP
  has no mask token, so ``[MASK]`` is one id appended after its vocabulary (49,408).
* ``sentencepiece``: a sentencepiece model, numbered as BEiT-3 numbers ``beit3.spm``
  (XLM-R / fairseq convention: ``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3, piece p at
  ``p + 1``, ``<mask>`` after the last piece); BEiT-3's released embedding has 64,010 rows
  for its 64,000 pieces, so set ``vocab_size: 64010`` to load it.
"""
from __future__ import annotations

import abc
import functools
from pathlib import Path

import torch

from foundation.config import ConfigError

TOKENIZERS = ("open_clip", "sentencepiece")


class Tokenizer(abc.ABC):
    """``encode(text, max_len)`` -> ids with bos/eos, truncated to ``max_len``; special ids
    and ``size`` (the smallest embedding that holds every id, ``[MASK]`` included)."""

    bos_id: int
    eos_id: int
    pad_id: int
    mask_id: int
    size: int
    first_piece: int  # ids >= this (and < mask_id) are ordinary pieces (random replacement in MLM)

    @abc.abstractmethod
    def pieces(self, text: str) -> list[int]:
        """The text's piece ids, without bos / eos."""

    def encode(self, text: str, max_len: int) -> list[int]:
        if max_len < 3:
            raise ValueError(f"max_len {max_len}: need room for bos, one piece and eos")
        ids = self.pieces(text)
        if not ids:
            raise ValueError(f"text {text!r} has no tokens")
        return [self.bos_id] + ids[: max_len - 2] + [self.eos_id]

    @abc.abstractmethod
    def decode(self, ids) -> str:
        """Ids back to text."""


class EncodedTexts:
    """``tokenizer.encode(text, max_len)`` remembered per text: the VQA / NLVR2 data sets read
    each question or statement every epoch, and many repeat word for word (BPE is ~4 % of a
    tiny CPU step). Bounded, since a data set's distinct texts can run to millions."""

    LIMIT = 1 << 17

    def __init__(self, tokenizer: Tokenizer, max_len: int):
        self.tokenizer, self.max_len, self.ids = tokenizer, max_len, {}

    def __call__(self, text: str) -> list[int]:
        ids = self.ids.get(text)
        if ids is None:
            ids = self.tokenizer.encode(text, self.max_len)
            if len(self.ids) < self.LIMIT:
                self.ids[text] = ids
        return list(ids)  # the caller's own list


class OpenCLIPTokenizer(Tokenizer):
    def __init__(self):
        from open_clip.tokenizer import SimpleTokenizer

        self.bpe = SimpleTokenizer()
        n = len(self.bpe.encoder)
        self.bos_id, self.eos_id = self.bpe.sot_token_id, self.bpe.eot_token_id
        self.pad_id = 0  # what open_clip pads with; padded positions are masked out anyway
        self.mask_id, self.size, self.first_piece = n, n + 1, 0

    def pieces(self, text: str) -> list[int]:
        return self.bpe.encode(text)

    def decode(self, ids) -> str:
        ids = [int(i) for i in ids if int(i) < self.mask_id and int(i) not in (self.bos_id, self.eos_id)]
        return self.bpe.decode(ids).strip()


class SentencePieceTokenizer(Tokenizer):
    OFFSET = 1  # fairseq's dictionary puts <s>, <pad>, </s>, <unk> first

    def __init__(self, model_file: str | Path | None = None, model_proto: bytes | None = None):
        """From the model file, or from its bytes (as a model file of a run carries them)."""
        import sentencepiece as spm

        try:
            if model_proto is not None:
                self.sp = spm.SentencePieceProcessor(model_proto=model_proto)
            else:
                self.sp = spm.SentencePieceProcessor(model_file=str(model_file))
        except RuntimeError:  # sentencepiece's C++ parse error, a multi-line message naming its own source
            raise ValueError(f"{'the sentencepiece model' if model_proto is not None else model_file} is not a "
                             "sentencepiece model (damaged or another kind of file)") from None
        self.bos_id, self.pad_id, self.eos_id, self.unk_id = 0, 1, 2, 3
        n = self.sp.get_piece_size()
        self.mask_id, self.size, self.first_piece = n + self.OFFSET, n + self.OFFSET + 1, 4

    def _id(self, piece: int) -> int:
        return self.unk_id if piece == self.sp.unk_id() else piece + self.OFFSET

    def pieces(self, text: str) -> list[int]:
        return [self._id(p) for p in self.sp.encode(text)]

    def decode(self, ids) -> str:
        return self.sp.decode([int(i) - self.OFFSET for i in ids if 4 <= int(i) < self.mask_id])


@functools.lru_cache(maxsize=8)
def get_tokenizer(name: str = "open_clip", spm_model: str | None = None) -> Tokenizer:
    if name == "open_clip":
        return OpenCLIPTokenizer()
    if name == "sentencepiece":
        if not spm_model:
            raise ConfigError("field 'spm_model': tokenizer=sentencepiece needs the model file (e.g. BEiT-3's beit3.spm)")
        if not Path(spm_model).is_file():
            raise ConfigError(f"field 'spm_model': file not found: {spm_model}")
        return SentencePieceTokenizer(spm_model)
    raise ConfigError(f"field 'tokenizer': must be one of {', '.join(TOKENIZERS)} (got {name!r})")


def pad_texts(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``(ids, padding_mask)`` (True = padding) to the longest in the batch."""
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad_id, dtype=torch.long)
    pad = torch.ones(len(seqs), L, dtype=torch.bool)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
        pad[i, : len(s)] = False
    return ids, pad
