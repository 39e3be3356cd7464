"""Speech corpora in their real on-disk layouts, as ``Utterance`` records.

* LibriSpeech: ``<split>/<speaker>/<chapter>/<utt>.flac`` + ``<speaker>-<chapter>.trans.txt``
* Kaldi / ESPnet data dir: ``wav.scp`` (``utt path``), ``text`` (``utt transcript``),
  optional ``utt2spk``; read with ESPnet's ``read_2columns_text``

Without transcripts (self-supervised pretraining) a LibriSpeech split is every
``<speaker>/<chapter>/*.flac`` (a ``trans.txt`` beside them is allowed, not needed:
Libri-Light-style folders) and a Kaldi dir needs no ``text``. Every problem with a corpus
or an utterance raises ``SpeechDataError`` naming it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from foundation.config import ConfigError

LAYOUTS = ("librispeech", "kaldi")
AUDIO_SUFFIXES = (".flac", ".wav")


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


def read_audio_librispeech(split_dir: str | Path) -> list[Utterance]:
    """Every audio file of a LibriSpeech-layout split, with empty transcripts."""
    root = Path(split_dir)
    if not root.is_dir():
        raise SpeechDataError(f"LibriSpeech split not found: {root}")
    files = sorted(p for p in root.glob("*/*/*") if p.suffix.lower() in AUDIO_SUFFIXES)
    if not files:
        raise SpeechDataError(f"{root}: no <speaker>/<chapter>/*.flac files (is this a LibriSpeech split?)")
    return [Utterance(p.stem, str(p), "", p.parent.parent.name) for p in files]


def read_audio_kaldi(data_dir: str | Path) -> list[Utterance]:
    """Every ``wav.scp`` entry of a Kaldi data dir, with empty transcripts."""
    from espnet2.fileio.read_text import read_2columns_text

    root = Path(data_dir)
    if not (root / "wav.scp").is_file():
        raise SpeechDataError(f"Kaldi data dir {root}: wav.scp not found")
    wavs = read_2columns_text(root / "wav.scp")
    spk = read_2columns_text(root / "utt2spk") if (root / "utt2spk").is_file() else {}
    out = [Utterance(utt, wav_path(root, utt, path), "", spk.get(utt, "")) for utt, path in wavs.items()]
    if not out:
        raise SpeechDataError(f"{root}/wav.scp is empty")
    return out


def read_split(root: str | Path, split: str, layout: str, *, transcripts: bool = True) -> list[Utterance]:
    """The utterances of ``<root>/<split>`` in ``layout``; with ``transcripts=False`` the
    audio alone (every file, no transcript needed)."""
    if layout not in LAYOUTS:
        raise SpeechDataError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if transcripts:
        reader = read_librispeech if layout == "librispeech" else read_kaldi_dir
    else:
        reader = read_audio_librispeech if layout == "librispeech" else read_audio_kaldi
    return reader(Path(root) / split)
