"""``foundation data make speech --out DIR``: a small spoken-command corpus synthesised
with eSpeak NG, in the LibriSpeech layout, deterministic from ``--seed``.

    DIR/{train,dev,test}/<speaker>/<chapter>/<speaker>-<chapter>-<utt>.flac   16 kHz FLAC
    DIR/{train,dev,test}/<speaker>/<chapter>/<speaker>-<chapter>.trans.txt    "UTT-ID TRANSCRIPT"
    DIR/SPEAKERS.TXT                                                          speaker -> voice, subset

A speaker is an eSpeak NG voice (an English accent with a voice variant); every
utterance draws its own speaking rate and pitch. Training: 6 accents x 24 variants. The dev
and test speakers are voices never heard in training, as LibriSpeech's dev/test speakers
are, and more: their accents (New York, West Midlands) and their variants are absent from
training too. Sentences come from a small vocabulary of digits, colours, shapes, sizes,
directions and commands.

eSpeak NG comes from the ``espeakng-loader`` package (library + voice data, installed from
PyPI with this suite), else from the system's ``libespeak-ng`` or ``espeak-ng`` program.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import io
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np
import soundfile as sf

from foundation.engine.demo_cli import demo_parser, free_out, item_count, timed

DEMO_DATA = {"name": "speech", "folder": "speech-demo"}  # foundation data make speech (engine/demo_cli.py)

SAMPLE_RATE = 16000
# The demo's speakers: training voices are every training accent with every training variant;
# the dev and test voices pair an accent with a variant that are both absent from training
# (eSpeak NG's other English accents, its other variants), so the held-out WER is that of
# unheard accents and voices, not of unheard combinations of heard ones.
ACCENTS = ("en-us", "en-gb-x-rp", "en-029", "en-gb-scotland", "en", "en-gb-x-gbclan")
# 24 variants, 10 utterances each: with the 10 m / f variants alone (24 utterances each, the same 1,440
# utterances) test WER on the unheard voices was 13-23 % over seeds 0-2 (docs/speech.md)
VARIANTS = ("m1", "m2", "m3", "m4", "m5", "m6", "f1", "f2", "f3", "f4", "adam", "Andy", "Annie", "aunty", "benjamin",
            "caleb", "david", "edward", "grandma", "grandpa", "john", "max", "steph", "travis")
HELD_OUT_ACCENTS = ("en-us-nyc", "en-gb-x-gbcwmd")
HELD_OUT_VARIANTS = {"dev": ("m7", "f5"), "test": ("m8", "linda")}
VOICES = tuple(f"{a}+{v}" for a in ACCENTS for v in VARIANTS)
FEMALE = ("f1", "f2", "f3", "f4", "f5", "linda", "Annie", "aunty", "grandma", "steph")


def demo_voices() -> dict[str, list[str]]:
    """The voices of each split of ``foundation data make speech``."""
    return {"train": list(VOICES),
            **{split: [f"{a}+{v}" for a in HELD_OUT_ACCENTS for v in variants]
               for split, variants in HELD_OUT_VARIANTS.items()}}

DIGITS = "ZERO ONE TWO THREE FOUR FIVE SIX SEVEN EIGHT NINE".split()
COLOURS = "RED GREEN BLUE YELLOW BLACK WHITE ORANGE PURPLE".split()
SHAPES = "CIRCLE SQUARE TRIANGLE STAR CUBE BALL BOX".split()
SIZES = "BIG SMALL".split()
DIRECTIONS = "LEFT RIGHT UP DOWN".split()
TEMPLATES = (
    "MOVE THE {colour} {shape} {direction}",
    "PICK UP THE {size} {colour} {shape}",
    "PUT THE {colour} {shape} ON THE {colour} {shape}",
    "TURN {direction} AND GO {digit} STEPS",
    "OPEN THE {colour} DOOR",
    "CLOSE THE {size} {colour} BOX",
    "CALL {digit} {digit} {digit} {digit}",
    "SET THE TIMER TO {digit} {digit} MINUTES",
    "SHOW ME THE {size} {shape}",
    "STOP",
    "GO {direction}",
    "{digit} {digit} {digit}",
)


def sentence(rng: np.random.Generator) -> str:
    """One transcript: a template with its slots filled at random."""
    text = TEMPLATES[int(rng.integers(len(TEMPLATES)))]
    pools = {"colour": COLOURS, "shape": SHAPES, "size": SIZES, "direction": DIRECTIONS, "digit": DIGITS}
    while "{" in text:
        slot = text[text.index("{") + 1: text.index("}")]
        pool = pools[slot]
        text = text.replace("{" + slot + "}", pool[int(rng.integers(len(pool)))], 1)
    return text


# --------------------------------------------------------------------------- eSpeak NG

class EspeakUnavailable(RuntimeError):
    pass


INSTALL_HINT = ("eSpeak NG was not found. Install it from PyPI with `pip install espeakng-loader` (it ships the "
                "library and the voices), or from your system: `apt-get install espeak-ng` (Debian/Ubuntu), "
                "`brew install espeak-ng` (macOS)")


_LIBC = ctypes.CDLL(None)


class LibEspeak:
    """libespeak-ng driven through ctypes, synchronous synthesis into a buffer.

    The library keeps waveform state (pitch phase, echo) from one call to the next, so
    the same text comes out slightly differently depending on what was said before. A
    fresh copy of the library file, loaded under its own name, has fresh state:
    ``fresh()`` gives one, and each voice of the corpus gets its own, so every
    utterance depends on (voice, text, rate, pitch) alone."""

    _CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)
    AUDIO_OUTPUT_SYNCHRONOUS, RATE, PITCH, ENDPAUSE = 2, 1, 3, 0x1000

    def __init__(self, library: str, data_path: str | None):
        self.library, self.data_path = library, data_path
        self.lib = ctypes.CDLL(library)
        self.lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        self.lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        self.lib.espeak_Synth.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int,
                                          ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
        rate = self.lib.espeak_Initialize(self.AUDIO_OUTPUT_SYNCHRONOUS, 0,
                                          data_path.encode() if data_path else None, 0)
        if rate <= 0:
            raise EspeakUnavailable(f"libespeak-ng ({library}) failed to initialise with data {data_path}")
        self.sample_rate = rate
        self._chunks: list[np.ndarray] = []

        def collect(wav, n, events):
            if wav and n > 0:
                self._chunks.append(np.ctypeslib.as_array(wav, shape=(n,)).copy())
            return 0

        self._callback = self._CALLBACK(collect)  # kept alive as long as self
        self.lib.espeak_SetSynthCallback(self._callback)

    def fresh(self, scratch: Path) -> "LibEspeak":
        if not os.path.isfile(self.library):  # a bare soname: no file to copy
            return self
        copy = scratch / f"libespeak-ng.{len(list(scratch.iterdir()))}.so"
        shutil.copyfile(self.library, copy)
        return LibEspeak(str(copy), self.data_path)

    def synth(self, text: str, voice: str, rate: int, pitch: int, seed: int = 0) -> np.ndarray:
        # the female variants add noise from rand(): seed it, and eSpeak's own generator
        if hasattr(self.lib, "espeak_ng_SetRandSeed"):
            self.lib.espeak_ng_SetRandSeed(ctypes.c_long(seed))
        _LIBC.srand(ctypes.c_uint(seed))
        if self.lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise EspeakUnavailable(f"eSpeak NG has no voice {voice!r}")
        self.lib.espeak_SetParameter(self.RATE, rate, 0)
        self.lib.espeak_SetParameter(self.PITCH, pitch, 0)
        self._chunks = []
        data = text.encode() + b"\0"
        if self.lib.espeak_Synth(data, len(data), 0, 0, 0, self.ENDPAUSE, None, None) != 0:
            raise RuntimeError(f"eSpeak NG failed on {text!r} ({voice})")
        self.lib.espeak_Synchronize()
        wav = np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.int16)
        return wav.astype(np.float32) / 32768.0


class CliEspeak:
    """The ``espeak-ng`` program (WAV on stdout)."""

    def __init__(self, program: str):
        self.program = program
        self.sample_rate = 22050

    def fresh(self, scratch: Path) -> "CliEspeak":
        return self  # a new process per utterance already

    def synth(self, text: str, voice: str, rate: int, pitch: int, seed: int = 0) -> np.ndarray:
        out = subprocess.run([self.program, "-v", voice, "-s", str(rate), "-p", str(pitch), "--stdout", text],
                             capture_output=True, check=True).stdout
        wav, self.sample_rate = sf.read(io.BytesIO(out), dtype="float32")
        return wav


def find_espeak():
    """espeakng-loader's library, else the system library, else the system program."""
    try:
        import espeakng_loader

        return LibEspeak(espeakng_loader.get_library_path(), espeakng_loader.get_data_path())
    except ImportError:
        pass
    library = ctypes.util.find_library("espeak-ng")
    if library:
        return LibEspeak(library, None)
    program = shutil.which("espeak-ng")
    if program:
        return CliEspeak(program)
    raise EspeakUnavailable(INSTALL_HINT)


# --------------------------------------------------------------------------- corpus

def split_voices(seed: int, n_dev: int, n_test: int, voices: Sequence[str] = VOICES) -> dict[str, list[str]]:
    """Held-out voices for dev and test, the rest for training."""
    order = np.random.default_rng(seed).permutation(len(voices)).tolist()
    return {"dev": [voices[i] for i in order[:n_dev]], "test": [voices[i] for i in order[n_dev:n_dev + n_test]],
            "train": [voices[i] for i in sorted(order[n_dev + n_test:])]}


def plan_corpus(seed: int, by_split: dict[str, list[str]], speakers: dict[str, int], utts_per_voice: dict[str, int],
                sentences: Sequence[str] | None = None) -> list[tuple[str, str, int, list[tuple[str, str, int, int]]]]:
    """[(split, voice, speaker, [(utt id, transcript, rate, pitch)])]: each voice's draws
    come from its own generator, so a voice's utterances do not depend on the others.
    ``sentences``, if given, are read in turn instead of drawn from the grammar."""
    jobs = []
    for k, split in enumerate(("train", "dev", "test")):
        for voice in by_split[split]:
            spk, chapter = speakers[voice], 1
            rng = np.random.default_rng([seed, k, spk])
            utts = [(f"{spk}-{chapter}-{i:04d}", sentences[i % len(sentences)] if sentences else sentence(rng),
                     int(rng.integers(130, 211)), int(rng.integers(30, 71)))
                    for i in range(utts_per_voice[split])]
            jobs.append((split, voice, spk, utts))
    return jobs


def make_corpus(out: Path, *, seed: int = 0, utts_per_voice: dict[str, int], n_dev_voices: int = 4,
                n_test_voices: int = 4, voices: Sequence[str] | None = None,
                sentences: Sequence[str] | None = None) -> dict[str, int]:
    """Write the corpus; returns utterances per split. Without ``voices``, the demo's
    (``demo_voices``: accents and variants of dev and test unheard in training); with them,
    ``n_dev_voices`` and ``n_test_voices`` of them drawn by ``seed`` are held out (small
    corpora for tests). ``sentences`` (upper case) replace the random sentences of the
    grammar, each voice reading them in turn."""
    import torch
    from torchaudio.transforms import Resample

    engine = find_espeak()  # fails here, with the install hint, if there is no eSpeak NG
    resample = Resample(engine.sample_rate, SAMPLE_RATE)  # the filter is built once
    by_split = demo_voices() if voices is None else split_voices(seed, n_dev_voices, n_test_voices, voices)
    every = voices if voices is not None else by_split["train"] + by_split["dev"] + by_split["test"]
    speakers = {v: 100 + i for i, v in enumerate(every)}
    counts = {"train": 0, "dev": 0, "test": 0}
    lines = [";ID  |SEX| SUBSET | VOICE"]
    with tempfile.TemporaryDirectory(prefix="espeak-ng.") as scratch:
        for split, voice, spk, utts in plan_corpus(seed, by_split, speakers, utts_per_voice, sentences):
            voice_engine = engine.fresh(Path(scratch))
            folder = out / split / str(spk) / "1"
            folder.mkdir(parents=True, exist_ok=True)
            noise = np.random.default_rng([seed, spk, 7])
            for k, (utt, text, rate, pitch) in enumerate(utts):
                wav = torch.from_numpy(voice_engine.synth(text.lower(), voice, rate, pitch, seed=spk * 100_000 + k))
                if voice_engine.sample_rate != SAMPLE_RATE:
                    wav = resample(wav)
                wav = wav + 1e-3 * torch.from_numpy(noise.standard_normal(wav.shape[0]).astype(np.float32))
                sf.write(folder / f"{utt}.flac", wav.clamp(-1, 1).numpy(), SAMPLE_RATE, subtype="PCM_16")
            (folder / f"{spk}-1.trans.txt").write_text("".join(f"{u} {text}\n" for u, text, _, _ in utts))
            lines.append(f"{spk:<5}| {'F' if voice.split('+')[1] in FEMALE else 'M'} | {split:<6} | {voice}")
            counts[split] += len(utts)
    (out / "SPEAKERS.TXT").write_text("\n".join(lines) + "\n")
    return counts


def main(argv: list[str] | None = None) -> int:
    p = demo_parser("speech", "Synthesise a small spoken-command corpus with eSpeak NG, in the LibriSpeech layout "
                              "(dev/test speakers are held-out voices).")
    p.add_argument("--train-per-voice", type=item_count, default=10, help="utterances per training voice")
    p.add_argument("--eval-per-voice", type=item_count, default=25, help="utterances per dev / test voice")
    a = p.parse_args(argv)
    if not free_out("speech", a.out, a.force):
        return 2
    done = timed("speech", lambda: make_corpus(a.out, seed=a.seed,
                                               utts_per_voice={"train": a.train_per_voice, "dev": a.eval_per_voice,
                                                               "test": a.eval_per_voice}), (EspeakUnavailable,))
    if done is None:
        return 2
    counts, seconds = done
    voices = demo_voices()
    print(f"wrote {a.out} in {seconds:.1f} s (LibriSpeech layout, {SAMPLE_RATE} Hz FLAC):")
    for split, n in counts.items():
        print(f"  {split:<5} {n:5d} utterances, {len(voices[split])} voices: {', '.join(voices[split][:4])}"
              + (" ..." if len(voices[split]) > 4 else ""))
    print(f"train on it: foundation train configs/asr/tiny.yaml tasks.asr.data_dir={a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
