"""Speech corpora and features shared by the speech tasks: LibriSpeech / Kaldi readers
(with and without transcripts), filterbanks and their lengths, CMVN statistics that
ESPnet's GlobalMVN reads, on a handful of synthesised utterances."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from foundation.config import ConfigError
from foundation_tasks.speech_common.corpus import SpeechDataError, read_audio_kaldi, read_kaldi_dir, read_librispeech
from foundation_tasks.speech_common.features import audio_frames, cmvn_stats, fbank, load_audio, num_frames
from foundation_tasks.speech_common.cmvn import GlobalCMVN


def test_librispeech_and_kaldi_readers_agree(speech_corpus, tmp_path):
    libri = read_librispeech(speech_corpus / "train")
    assert len(libri) == 32 and all(Path(u.audio).is_file() and u.text and u.speaker for u in libri)
    kaldi = tmp_path / "kaldi"
    kaldi.mkdir()
    (kaldi / "wav.scp").write_text("".join(f"{u.id} {u.audio}\n" for u in libri))
    (kaldi / "text").write_text("".join(f"{u.id} {u.text}\n" for u in libri))
    (kaldi / "utt2spk").write_text("".join(f"{u.id} {u.speaker}\n" for u in libri))
    assert sorted(read_kaldi_dir(kaldi), key=lambda u: u.id) == sorted(libri, key=lambda u: u.id)


def test_features_lengths_cmvn_and_espnet_global_mvn(speech_corpus, tmp_path):
    from espnet2.layers.global_mvn import GlobalMVN

    utts = read_librispeech(speech_corpus / "train")[:4]
    feats = [fbank(load_audio(u, 16000), 16000) for u in utts]
    for u, f in zip(utts, feats):
        assert f.shape == (audio_frames(u, 16000), 80)
        assert f.shape[0] == num_frames(sf.info(u.audio).frames, 16000)
    stats = cmvn_stats(feats)
    cat = torch.cat(feats).double()
    assert int(stats["count"]) == cat.shape[0]
    cmvn = GlobalCMVN(80)
    cmvn.set_stats(float(stats["count"]), stats["sum"], stats["sum_square"])
    normed = cmvn(cat[None].float(), torch.tensor([cat.shape[0]]))[0]
    assert normed.mean(0).abs().max() < 1e-3 and (normed.std(0) - 1).abs().max() < 1e-2
    np.savez(tmp_path / "feats_stats.npz", **stats)  # ESPnet's own GlobalMVN reads our statistics
    theirs, _ = GlobalMVN(tmp_path / "feats_stats.npz")(cat[None].float(), torch.tensor([cat.shape[0]]))
    assert torch.allclose(theirs[0], normed, atol=1e-3)


def test_utterance_mean_matches_espnet_and_removes_a_constant_tilt():
    """utterance_mean: each utterance's own mean off after the global statistics, as ESPnet's
    UtteranceMVN (means only) on the real frames; padding stays 0; a constant per-bin offset of
    one utterance (a tilted spectrum) no longer changes what the encoder sees."""
    from espnet2.layers.utterance_mvn import UtteranceMVN

    torch.manual_seed(0)
    feats, lens = torch.randn(2, 7, 80) * 3 + 1, torch.tensor([7, 4])
    cmvn = GlobalCMVN(80, utterance_mean=True)
    cmvn.set_stats(10.0, np.full(80, 5.0), np.full(80, 12.5))  # mean 0.5, std 1
    out = cmvn(feats, lens)
    padding = torch.arange(7)[None, :, None] >= lens[:, None, None]
    theirs, _ = UtteranceMVN(norm_means=True, norm_vars=False)((feats - 0.5).masked_fill(padding, 0.0), lens)
    assert torch.allclose(out[0], theirs[0], atol=1e-5) and torch.allclose(out[1, :4], theirs[1, :4], atol=1e-5)
    assert out[1, 4:].abs().max() == 0  # padding
    tilt = torch.linspace(-4, 4, 80)
    assert torch.allclose(cmvn(feats + tilt, lens)[:, :4], out[:, :4], atol=1e-4)
    assert not torch.allclose(GlobalCMVN(80)(feats + tilt, lens), GlobalCMVN(80)(feats, lens))


def test_missing_kaldi_entries_are_named(tmp_path):
    (tmp_path / "wav.scp").write_text("a /nowhere/a.wav\n")
    (tmp_path / "text").write_text("a HELLO\nb WORLD\n")
    with pytest.raises(ConfigError, match="utterance b has a transcript in text but no entry in wav.scp"):
        read_kaldi_dir(tmp_path)


def test_kaldi_wav_paths_relative_to_the_data_dir_and_no_pipes(tmp_path):
    (tmp_path / "wav").mkdir()
    (tmp_path / "wav" / "a.wav").write_bytes(b"")
    (tmp_path / "wav.scp").write_text("a wav/a.wav\nb /abs/b.wav\n")
    (tmp_path / "text").write_text("a HELLO\nb WORLD\n")
    for read in (read_kaldi_dir, read_audio_kaldi):  # ASR and BEST-RQ (no transcripts) read wav.scp alike
        assert [u.audio for u in read(tmp_path)] == [str(tmp_path / "wav" / "a.wav"), "/abs/b.wav"]
    (tmp_path / "wav.scp").write_text("a wav/a.wav\nb sox b.flac -t wav - |\n")
    for read in (read_kaldi_dir, read_audio_kaldi):
        with pytest.raises(SpeechDataError, match=r"wav.scp: utterance b: piped commands are not supported"):
            read(tmp_path)
