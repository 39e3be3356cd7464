"""Speech recognition with a Transformer-Transducer whose encoder is the shared backbone."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import torch

from foundation.config import ConfigError
from foundation.engine.data import labelled_fraction
from foundation.engine.task import register_task
from foundation_tasks.asr.data import BucketDataset, collate, length_buckets
from foundation_tasks.asr.decode import SEARCH_TYPES, beam_search, greedy_search
from foundation_tasks.asr.metrics import asr_metrics, split_sums
from foundation_tasks.asr.model import TransducerHead
from foundation_tasks.asr.tokenizer import Tokenizer, TranscriptError, train_tokenizer
from foundation_tasks.speech_common.corpus import SpeechDataError, Utterance
from foundation_tasks.speech_common.features import audio_frames
from foundation_tasks.speech_common.task import SpeechFields, SpeechTask, check_speech_fields

DECODINGS = ("greedy", "beam")


@dataclass
class ASRConfig(SpeechFields):
    # data: <data_dir>/<split> in the LibriSpeech layout, or Kaldi data dirs (layout: kaldi)
    data_dir: str = "data/LibriSpeech"
    layout: str = "librispeech"  # librispeech | kaldi
    train_splits: List[str] = field(default_factory=lambda: ["train-clean-100", "train-clean-360", "train-other-500"])
    eval_splits: List[str] = field(default_factory=lambda: ["dev-clean", "dev-other", "test-clean", "test-other"])
    sample_rate: int = 16000
    num_mel_bins: int = 80
    prep_dir: Optional[str] = None  # tokenizer + CMVN statistics; default <data_dir>/prep/<train splits>
    vocab_size: int = 5000  # sentencepiece unigram units (the model adds the blank)
    max_frames: int = 40000  # length buckets: batch size x longest utterance (10 ms frames), ESPnet's batch_bins
    cmvn_max_utterances: int = 10000  # CMVN statistics from up to this many training utterances (evenly spread)
    cache_features: bool = False  # keep filterbanks in memory (small corpora)
    # a label budget: train on this fraction of the transcribed training utterances (evaluation
    # splits are never subset), drawn by subset_seed and nested across fractions
    # (foundation.engine.data.labelled_fraction); the tokenizer learns from those transcripts only
    train_fraction: Optional[float] = None
    subset_seed: int = 0
    # model (sizes of the 18L / 36L T-T: 80M / 140M parameters with a 512-dim backbone)
    vgg_channels: List[int] = field(default_factory=lambda: [64, 128])
    predictor_embed_dim: int = 512
    predictor_dim: int = 1024
    predictor_layers: int = 2
    predictor_dropout: float = 0.1
    joint_dim: int = 512
    joint_sub_batch: int = 4  # utterances per joint + loss sub-batch (memory bound); 0 = whole batch
    # auxiliary losses (Boyer et al. 2021)
    ctc_weight: float = 0.3
    rnnt_start: int = 0  # CTC alone for this many training steps, then CTC + transducer
    aux_transducer_weight: float = 0.2
    aux_layers: List[int] = field(default_factory=list)  # 0-based backbone blocks, e.g. [5, 11] of 18
    aux_mlp_dim: int = 256
    # speed perturbation (Kaldi's / ESPnet's speed_perturb_factors, e.g. [0.9, 1.0, 1.1]): each
    # training utterance, each epoch, resampled to one of these speeds, drawn per item
    # (torchaudio.functional.speed: tempo and pitch move together, as in sox's speed). Empty: off
    speed_perturb: List[float] = field(default_factory=list)
    # after the global CMVN, take each utterance's own mean off its features (ESPnet's utterance_mvn,
    # means only): voices whose spectrum is tilted unlike the training voices' (docs/speech.md)
    utterance_mean: bool = False
    # SpecAugment (Magneto Table 15)
    freq_masks: int = 2
    freq_mask_width: int = 27
    time_masks: int = 10
    time_mask_ratio: float = 0.04
    # decoding for evaluation
    decoding: str = "greedy"  # greedy | beam
    beam_size: int = 4
    beam_search: str = "default"  # ESPnet's BeamSearchTransducer: default | maes | tsd | alsd
    max_symbols_per_frame: int = 5  # greedy
    hyp_dir: Optional[str] = None  # write <hyp_dir>/<split>/{hyp,ref}.txt (Kaldi text format) at each evaluation

    def __post_init__(self) -> None:
        bad = check_speech_fields(self)
        if len(set(self.eval_splits)) != len(self.eval_splits):
            raise bad("eval_splits", "splits must be distinct")
        for name in ("vocab_size", "max_frames", "predictor_embed_dim", "predictor_dim", "predictor_layers",
                     "joint_dim", "aux_mlp_dim", "beam_size", "max_symbols_per_frame"):
            if getattr(self, name) < 1:
                raise bad(name, "must be >= 1")
        if self.train_fraction is not None and not 0 < self.train_fraction <= 1:
            raise bad("train_fraction", "must be in (0, 1] or null (every utterance)")
        if self.rnnt_start > 0 and self.ctc_weight <= 0:
            raise bad("rnnt_start", "CTC alone comes first: it needs ctc_weight > 0")
        for name in ("ctc_weight", "rnnt_start", "aux_transducer_weight", "joint_sub_batch", "freq_masks",
                     "freq_mask_width", "time_masks"):
            if getattr(self, name) < 0:
                raise bad(name, "must be >= 0")
        for name in ("predictor_dropout", "time_mask_ratio"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise bad(name, "must be in [0, 1)")
        if any(not 0.5 <= f <= 2.0 for f in self.speed_perturb):
            raise bad("speed_perturb", f"speeds must be in [0.5, 2] (got {list(self.speed_perturb)})")
        if self.decoding not in DECODINGS:
            raise bad("decoding", f"must be one of {', '.join(DECODINGS)}")
        if self.beam_search not in SEARCH_TYPES:
            raise bad("beam_search", f"must be one of {', '.join(SEARCH_TYPES)}")

    @property
    def tokenizer_path(self) -> Path:
        budget = "" if self.train_fraction is None else f"-frac{self.train_fraction:g}-s{self.subset_seed}"
        return self.prep_path / f"unigram{self.vocab_size}{budget}.model"


@register_task("asr")
class ASR(SpeechTask):
    """Transformer-Transducer ASR; WER per evaluation split. Dataset items are whole
    length buckets (``max_frames``), so this task's ``batch_size`` must be 1."""

    Config = ASRConfig
    primary_metric = "wer"
    higher_is_better = False

    def __init__(self, cfg: ASRConfig, backbone):
        super().__init__(cfg, backbone)
        self._tokenizer: Tokenizer | None = None
        self._hyps: list[tuple[str, str, str, str]] = []

    # ------------------------------------------------------------------ data preparation

    def check(self) -> None:
        c = self.cfg
        self.check_data_dir()
        for i in c.aux_layers:
            if not 0 <= i < self.backbone_cfg.depth:
                raise ConfigError(f"field 'aux_layers': layer {i} does not exist in a {self.backbone_cfg.depth}-layer "
                                  "backbone (0-based)")
        self.check_encoder()
        for split in c.train_splits + c.eval_splits:
            self.utterances(split)
        self.prepare()
        # every utterance now, not at the first evaluation: audio headers and transcripts
        self.train_dataset()
        self.eval_dataset()

    def prepare(self) -> None:
        """Train the tokenizer and compute the CMVN statistics once (ESPnet's stages 4-5)."""
        c = self.cfg
        if not c.tokenizer_path.is_file():
            texts = [u.text for u in self.labelled_utterances()]
            self.say(f"training a sentencepiece unigram tokenizer ({c.vocab_size} units) on {len(texts)} "
                     f"transcripts -> {c.tokenizer_path}")
            try:
                train_tokenizer(texts, c.tokenizer_path, c.vocab_size)
            except ValueError as e:
                raise ConfigError(f"field 'vocab_size': {e}") from None
        self.prepare_cmvn()

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            path = self.cfg.tokenizer_path
            if not path.is_file():
                raise ConfigError(f"field 'prep_dir': no tokenizer at {path}; `foundation train` makes it")
            self._tokenizer = Tokenizer(path)
            if self._tokenizer.size != self.cfg.vocab_size + 1:
                raise ConfigError(f"field 'vocab_size': {path} has {self._tokenizer.size - 1} units, "
                                  f"the config says {self.cfg.vocab_size}")
        return self._tokenizer

    def labelled_utterances(self) -> list[Utterance]:
        """The training utterances whose transcripts are used: all, or the label budget's."""
        utts = self.train_utterances()
        return [utts[i] for i in labelled_fraction(len(utts), self.cfg.train_fraction, self.cfg.subset_seed,
                                                   "utterances")]

    def _dataset(self, splits: list[str], keep: Optional[set[str]] = None, train: bool = False) -> BucketDataset:
        """Every utterance checked (audio header, transcript) before any training; ``keep``: only
        these utterance ids."""
        c = self.cfg
        utts, buckets = {}, []
        for k, split in enumerate(splits):
            lengths = {}
            for u in self.utterances(split):
                if keep is not None and u.id not in keep:
                    continue
                if u.id in utts:
                    raise ConfigError(f"utterance {u.id}: appears twice (splits {splits[utts[u.id][2]]} and {split})")
                try:
                    lengths[u.id] = audio_frames(u, c.sample_rate)
                    utts[u.id] = (u, self.tokenizer.encode(u.text, u.id), k)
                except (SpeechDataError, TranscriptError) as e:
                    raise SpeechDataError(f"{split}: {e}") from None
            buckets += length_buckets(lengths, c.max_frames)
        return BucketDataset(utts, buckets, self.features, cache=c.cache_features,
                             speeds=c.speed_perturb if train else ())

    def train_dataset(self) -> BucketDataset:
        keep = None if self.cfg.train_fraction is None else {u.id for u in self.labelled_utterances()}
        return self._dataset(self.cfg.train_splits, keep, train=True)

    def eval_dataset(self) -> BucketDataset:
        return self._dataset(self.cfg.eval_splits)

    def collate(self, samples: list) -> dict:
        if len(samples) != 1:
            raise ConfigError(f"task 'asr': batch_size is {len(samples)}, but this task's dataset items are whole "
                              "length buckets: set batch_size: 1 in its tasks entry and size batches with max_frames")
        return collate(samples)

    # ------------------------------------------------------------------ model

    def build_head(self, shared=None) -> TransducerHead:
        c = self.cfg
        specaug = dict(freq_masks=c.freq_masks, freq_mask_width=c.freq_mask_width, time_masks=c.time_masks,
                       time_mask_ratio=c.time_mask_ratio)
        head = TransducerHead(
            dim=self.backbone_cfg.dim, vocab_size=c.vocab_size + 1, num_mel_bins=c.num_mel_bins,
            vgg_channels=c.vgg_channels, predictor_embed_dim=c.predictor_embed_dim, predictor_dim=c.predictor_dim,
            predictor_layers=c.predictor_layers, predictor_dropout=c.predictor_dropout, joint_dim=c.joint_dim,
            joint_sub_batch=c.joint_sub_batch, ctc_weight=c.ctc_weight, aux_transducer_weight=c.aux_transducer_weight,
            aux_layers=c.aux_layers, aux_mlp_dim=c.aux_mlp_dim,
            specaug=specaug if c.freq_masks or c.time_masks else None, rnnt_start=c.rnnt_start,
            utterance_mean=c.utterance_mean,
        )
        self.load_cmvn(head.cmvn)
        if c.tokenizer_path.is_file():
            head.tokenizer_crc.fill_(self.tokenizer.crc)
        return head

    def adapt_init(self, name, tensor, target):
        """init_from (a BEST-RQ, ASR or cross-modal run) gives the VGG front end and whatever
        else fits; the CMVN statistics and the tokenizer's checksum stay this task's own."""
        if name.startswith("cmvn.") or name == "tokenizer_crc":
            return "this task's own data statistics / tokenizer"
        if name == "updates":
            return "this run's own count of training steps"
        return super().adapt_init(name, tensor, target)

    # ------------------------------------------------------------------ evaluation

    def transcribe(self, head: TransducerHead, enc: torch.Tensor, enc_lens: torch.Tensor) -> list[str]:
        c = self.cfg
        if c.decoding == "beam":
            ids = beam_search(head.predictor, head.joint, enc, enc_lens, c.beam_size, c.beam_search)
        else:
            ids = greedy_search(head.predictor, head.joint, enc, enc_lens, c.max_symbols_per_frame)
        return [self.tokenizer.decode(x) for x in ids]

    def eval_step(self, head: TransducerHead, backbone, batch) -> dict[str, torch.Tensor]:
        crc = int(head.tokenizer_crc)
        if crc and crc != self.tokenizer.crc:
            raise ConfigError(f"field 'prep_dir': the tokenizer {self.tokenizer.path} is not the one this model was "
                              "trained with (checksums differ)")
        enc, enc_lens, _ = head.encode(backbone, batch["feats"], batch["feat_lens"])
        loss = head.losses_from(enc, enc_lens, {}, batch)["rnnt"] * enc.shape[0]
        hyps = self.transcribe(head, enc.float(), enc_lens)
        splits = batch["split"].tolist()
        names = [self.cfg.eval_splits[s] for s in splits]
        self._hyps += list(zip(names, batch["ids"], batch["texts"], hyps))
        return split_sums(self.cfg.eval_splits, splits, batch["texts"], hyps, loss)

    def export_meta(self) -> dict:
        """The sentencepiece model itself and the feature and decoding settings (the CMVN
        statistics are buffers of the head, so they travel with the weights)."""
        c = self.cfg
        return dict(tokenizer=self.tokenizer.data, sample_rate=c.sample_rate, num_mel_bins=c.num_mel_bins,
                    beam_search=c.beam_search, max_symbols_per_frame=c.max_symbols_per_frame)

    def predictor(self, head, backbone, meta, device):
        from foundation_tasks.asr.predict import ASRPredictor

        return ASRPredictor(self, head, backbone, meta, device)

    def metrics(self, totals) -> dict[str, float]:
        if self.cfg.hyp_dir:
            self._write_hyps(Path(self.cfg.hyp_dir))
            self.say(f"{self.cfg.decoding} hypotheses and references: {self.cfg.hyp_dir}/"
                 f"{{{','.join(self.cfg.eval_splits)}}}/{{hyp,ref}}.txt")
        self._hyps = []
        return asr_metrics(self.cfg.eval_splits, totals)

    def _write_hyps(self, root: Path) -> None:
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        suffix = f".rank{rank}" if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1 else ""
        for split in self.cfg.eval_splits:
            rows = sorted((u, r, h) for s, u, r, h in self._hyps if s == split)
            folder = root / split
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"hyp{suffix}.txt").write_text("".join(f"{u} {h}\n" for u, _, h in rows))
            (folder / f"ref{suffix}.txt").write_text("".join(f"{u} {r}\n" for u, r, _ in rows))
