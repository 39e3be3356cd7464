"""ASR data: the eSpeak NG demo corpus, clear errors naming the utterance, sentencepiece,
the task's CMVN statistics and length buckets, on a handful of synthesised utterances
(the readers and features themselves: tests/foundation_tasks/speech_common)."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from foundation.config import ConfigError
from foundation_tasks.asr.data import length_buckets
from foundation_tasks.asr.demo import VOICES, make_corpus
from foundation_tasks.asr.task import ASR, ASRConfig
from foundation_tasks.asr.tokenizer import Tokenizer, TranscriptError, train_tokenizer
from foundation_tasks.speech_common.corpus import read_librispeech


def speakers_of(root: Path, split: str) -> set[str]:
    return {p.name for p in (root / split).iterdir()}


def test_demo_corpus_is_deterministic(tmp_path):
    """Every utterance depends on (seed, voice, sentence) alone: two runs in one process
    (eSpeak NG keeps state between calls; each voice gets a fresh copy of the library)."""
    runs = []
    for name in ("a", "b"):
        make_corpus(tmp_path / name, seed=5, utts_per_voice={"train": 1, "dev": 1, "test": 1}, n_dev_voices=1,
                    n_test_voices=1, voices=VOICES[4:8])
        runs.append(sorted((tmp_path / name).rglob("*.flac")))
    assert len(runs[0]) == 4
    for a in runs[0]:
        assert np.array_equal(sf.read(a)[0], sf.read(tmp_path / "b" / a.relative_to(tmp_path / "a"))[0])
    texts = [sorted(p.read_text() for p in (tmp_path / n).rglob("*.trans.txt")) for n in ("a", "b")]
    assert texts[0] == texts[1]


def test_demo_corpus_layout_and_held_out_voices(speech_corpus):
    for split in ("train", "dev", "test"):
        for trans in (speech_corpus / split).glob("*/*/*.trans.txt"):
            spk, chapter = trans.parent.parent.name, trans.parent.name
            assert trans.name == f"{spk}-{chapter}.trans.txt"
            for line in trans.read_text().splitlines():
                utt, text = line.split(" ", 1)
                assert utt.startswith(f"{spk}-{chapter}-") and text == text.upper()
                info = sf.info(trans.parent / f"{utt}.flac")
                assert info.samplerate == 16000 and 0.3 < info.duration < 6
    train, dev, test = (speakers_of(speech_corpus, s) for s in ("train", "dev", "test"))
    assert len(train) == 4 and not (train & dev) and not (train & test) and not (dev & test)
    listing = (speech_corpus / "SPEAKERS.TXT").read_text()
    assert all(f"| {s:<6} |" in listing for s in ("train", "dev", "test"))


def test_the_demo_holds_out_accents_and_variants_not_only_voices():
    """`foundation data make speech`'s dev and test voices: neither their accent nor their
    variant occurs in training, and dev and test share no voice."""
    from foundation_tasks.asr.demo import demo_voices

    splits = {k: [v.split("+") for v in voices] for k, voices in demo_voices().items()}
    train_accents, train_variants = {a for a, _ in splits["train"]}, {v for _, v in splits["train"]}
    assert len(splits["train"]) == 144 and len(train_accents) == 6 and len(train_variants) == 24
    for split in ("dev", "test"):
        assert splits[split] and all(a not in train_accents and v not in train_variants for a, v in splits[split])
    assert not set(map(tuple, splits["dev"])) & set(map(tuple, splits["test"]))


def test_speed_perturbation_is_per_item_seeded_and_training_only(speech_corpus, prep):
    """`speed_perturb`: each training utterance at one of the speeds, drawn from the item's seed
    (the same draw for the same seed, cached per speed), lengths moving as 1 / speed; evaluation
    never perturbed."""
    import torch

    task = make_task(speech_corpus, prep, max_frames=800, cache_features=True, speed_perturb=[0.8, 1.25])
    plain = make_task(speech_corpus, prep, max_frames=800, cache_features=True).train_dataset()
    train = task.train_dataset()

    def lengths(ds, seed):
        torch.manual_seed(seed)
        return [f.shape[0] for _, f, _, _ in ds[0]]

    base = lengths(plain, 0)
    a, b = lengths(train, 0), lengths(train, 0)
    assert a == b and a != base  # a function of the seed; perturbed
    for n, m in zip(base, a):
        assert min(abs(m - n / 0.8), abs(m - n / 1.25)) <= 2  # every utterance at one of the two speeds
    assert any(lengths(train, s) != a for s in range(1, 6))  # new draws per item seed (epoch)
    assert [f.shape[0] for _, f, _, _ in task.eval_dataset()[0]] == \
        [f.shape[0] for _, f, _, _ in make_task(speech_corpus, prep, max_frames=800).eval_dataset()[0]]
    with pytest.raises(ConfigError, match=r"speed_perturb.*\[0\.5, 2\]"):
        make_task(speech_corpus, prep, speed_perturb=[0.9, 3.0])


def test_tokenizer_round_trip_and_unknown_characters(speech_corpus, tmp_path):
    texts = [u.text for u in read_librispeech(speech_corpus / "train")]
    path = train_tokenizer(texts, tmp_path / "sp.model", vocab_size=30)
    tok = Tokenizer(path)
    assert tok.size == 31 and tok.units()[0] == "<blank>"
    for t in texts:
        ids = tok.encode(t, "u")
        assert min(ids) >= 1 and max(ids) < tok.size and tok.decode(ids) == t
    with pytest.raises(TranscriptError, match=r"utterance 7-7-0007: .* vocabulary .*: 'é'"):
        tok.encode(texts[0] + "é", "7-7-0007")


def test_length_buckets_cover_every_utterance_once():
    lengths = {f"u{i}": n for i, n in enumerate([120, 80, 300, 95, 210, 60, 150, 400, 33])}
    buckets = length_buckets(lengths, max_frames=600)
    flat = [u for b in buckets for u in b]
    assert sorted(flat) == sorted(lengths)
    for b in buckets:
        sizes = [lengths[u] for u in b]
        assert sizes == sorted(sizes, reverse=True)  # longest first
        # ESPnet's batch_bins rule: the batch closes with the utterance that takes it past max_frames
        assert len(b) == 1 or (len(b) - 1) * sizes[1] <= 600
    with pytest.raises(ConfigError, match="utterance u7: 400 frames"):
        length_buckets(lengths, max_frames=300)


@pytest.fixture(scope="module")
def prep(speech_corpus, tmp_path_factory) -> Path:
    """Tokenizer + CMVN statistics of the speech_corpus's training split, shared by the error tests
    (they break dev utterances only)."""
    path = tmp_path_factory.mktemp("prep")
    make_task(speech_corpus, path).prepare()
    return path


def make_task(root: Path, prep: Path, **kw) -> ASR:
    from foundation.config import BackboneConfig

    cfg = ASRConfig(data_dir=str(root), train_splits=["train"], eval_splits=["dev", "test"], vocab_size=30,
                    prep_dir=str(prep), **kw)
    return ASR(cfg, BackboneConfig(dim=32, depth=2, heads=4, rel_pos="1d"))


def test_task_prepares_tokenizer_and_stats_and_batches(speech_corpus, tmp_path):
    task = make_task(speech_corpus, tmp_path / "prep", max_frames=800)
    task.check()
    assert (tmp_path / "prep" / "unigram30.model").is_file()
    assert (tmp_path / "prep" / "feats_stats_fbank80.npz").is_file()
    head = task.build_head()
    assert int(head.cmvn.frames) > 0 and int(head.tokenizer_crc) == task.tokenizer.crc
    train = task.train_dataset()
    assert sum(len(b) for b in train.buckets) == 32
    batch = task.collate([train[0]])
    B = len(batch["ids"])
    assert batch["feats"].shape[0] == B and batch["feats"].shape[2] == 80
    assert batch["feat_lens"].max() == batch["feats"].shape[1]
    assert batch["targets"].shape[0] == B and (batch["targets"] != 0).sum(1).tolist() == batch["target_lens"].tolist()
    evalset = task.eval_dataset()
    assert sorted(set(s for b in range(len(evalset)) for _, _, _, s in evalset[b])) == [0, 1]
    with pytest.raises(ConfigError, match="batch_size: 1"):
        task.collate([train[0], train[0]])


def broken_copy(speech_corpus: Path, tmp_path: Path) -> tuple[Path, str, Path]:
    root = tmp_path / "broken"
    shutil.copytree(speech_corpus, root, ignore=shutil.ignore_patterns("prep"))
    trans = sorted((root / "dev").glob("*/*/*.trans.txt"))[0]
    utt = trans.read_text().split()[0]
    return root, utt, trans.parent / f"{utt}.flac"


def expect_error(root: Path, prep: Path, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        make_task(root, prep).check()


def test_missing_audio_is_named(speech_corpus, prep, tmp_path):
    root, utt, flac = broken_copy(speech_corpus, tmp_path)
    flac.unlink()
    expect_error(root, prep, rf"dev: utterance {utt}: audio file not found: .*{utt}\.flac")


@pytest.mark.parametrize("how", ["0 bytes", "0 samples"])
def test_empty_audio_is_named(speech_corpus, prep, tmp_path, how):
    root, utt, flac = broken_copy(speech_corpus, tmp_path)
    if how == "0 bytes":  # e.g. an interrupted copy
        flac.write_bytes(b"")
    else:  # a valid file without samples (libsndfile cannot write an empty FLAC; WAV content)
        sf.write(flac, np.zeros(0, np.float32), 16000, format="WAV")
    expect_error(root, prep, rf"dev: utterance {utt}: .* is empty \({how}\)")


def test_wrong_sample_rate_is_named(speech_corpus, prep, tmp_path):
    root, utt, flac = broken_copy(speech_corpus, tmp_path)
    sf.write(flac, np.zeros(8000, np.float32), 8000, format="FLAC")
    expect_error(root, prep, rf"dev: utterance {utt}: .* sampled at 8000 Hz, expected 16000 Hz")


def test_transcript_outside_vocabulary_is_named(speech_corpus, prep, tmp_path):
    root, utt, _ = broken_copy(speech_corpus, tmp_path)
    trans = next(p for p in (root / "dev").glob("*/*/*.trans.txt") if utt in p.read_text())
    trans.write_text(trans.read_text().replace(f"{utt} ", f"{utt} ÜBER ", 1))
    expect_error(root, prep, rf"dev: utterance {utt}: transcript 'ÜBER .*' has characters outside .*'Ü'")


def test_missing_espeak_says_how_to_install(monkeypatch, tmp_path, capsys):
    import builtins

    from foundation_tasks.asr import demo

    real_import = builtins.__import__

    def no_loader(name, *args, **kwargs):
        if name == "espeakng_loader":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_loader)
    monkeypatch.setattr(demo.ctypes.util, "find_library", lambda name: None)
    monkeypatch.setattr(demo.shutil, "which", lambda name: None)
    assert demo.main(["--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "pip install espeakng-loader" in err and "apt-get install espeak-ng" in err
