"""Sequence reversal / sorting with an encoder-decoder backbone: the engine's test task
and the workload of the DeepNet depth-stability comparison."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

from foundation.config import ConfigError
from foundation.engine.task import Task, register_task
from foundation_tasks.seq2seq.data import PAD, PROBLEMS, SPECIALS, SPLITS, PairDataset, collate, generate, read_split
from foundation_tasks.seq2seq.metrics import decode_sums, seq2seq_metrics
from foundation_tasks.seq2seq.model import Seq2SeqHead


@dataclass
class Seq2SeqConfig:
    problem: str = "reverse"  # reverse | sort
    vocab_size: int = 16  # symbols (token ids add PAD, BOS, EOS)
    min_len: int = 4
    max_len: int = 12
    train_size: int = 5000
    eval_size: int = 500
    data_seed: int = 1234  # train set from data_seed, eval set from data_seed + 1
    data_dir: Optional[str] = None  # {train,valid}.{src,tgt} (foundation_tasks/seq2seq/data.py); null = generate in memory
    label_smoothing: float = 0.0

    def __post_init__(self) -> None:
        def bad(name: str, msg: str) -> ConfigError:
            return ConfigError(f"field {name!r}: {msg} (got {getattr(self, name)!r})")

        if self.problem not in PROBLEMS:
            raise bad("problem", f"must be one of {', '.join(PROBLEMS)}")
        for name in ("vocab_size", "min_len", "train_size", "eval_size"):
            if getattr(self, name) < 1:
                raise bad(name, "must be >= 1")
        if self.max_len < self.min_len:
            raise bad("max_len", f"must be >= min_len={self.min_len}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise bad("label_smoothing", "must be in [0, 1)")


@register_task("seq2seq")
class Seq2Seq(Task):
    Config = Seq2SeqConfig
    primary_metric = "exact_match"
    higher_is_better = True
    embedding_params = ("embed",)

    def check(self) -> None:
        if self.backbone_cfg.arch != "encoder_decoder":
            raise ConfigError(f"field 'backbone.arch': seq2seq needs 'encoder_decoder' (got {self.backbone_cfg.arch!r})")
        if self.cfg.data_dir is None:
            return
        root = Path(self.cfg.data_dir)
        if not root.is_dir():
            raise ConfigError(f"field 'data_dir': directory not found: {root} "
                              f"(write one with: python -m foundation_tasks.seq2seq.data {root})")
        missing = [f"{s}.{side}" for s in SPLITS for side in ("src", "tgt") if not (root / f"{s}.{side}").is_file()]
        if missing:
            raise ConfigError(f"field 'data_dir': {root} lacks {', '.join(missing)}")

    def build_head(self, shared=None) -> Seq2SeqHead:
        # positions: the longest source, and BOS + the longest target
        return Seq2SeqHead(self.cfg.vocab_size + SPECIALS, self.backbone_cfg.dim, self.cfg.max_len + 1,
                           self.cfg.label_smoothing)

    def _pairs(self, split: str):
        c = self.cfg
        if c.data_dir is not None:
            return read_split(Path(c.data_dir), split, c.vocab_size)
        n, seed = (c.train_size, c.data_seed) if split == "train" else (c.eval_size, c.data_seed + 1)
        return generate(c.problem, n, c.vocab_size, c.min_len, c.max_len, seed)

    def train_dataset(self) -> PairDataset:
        return PairDataset(self._pairs("train"))

    def eval_dataset(self) -> PairDataset:
        return PairDataset(self._pairs("valid"))

    def collate(self, samples):
        return collate(samples)

    def eval_step(self, head: Seq2SeqHead, backbone, batch) -> dict[str, torch.Tensor]:
        labels = batch["labels"]
        logits = head.logits(backbone, batch)
        loss_sum = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=PAD, reduction="sum")
        pred = head.greedy(backbone, batch["src"], batch["src_pad"], max_len=labels.shape[1])
        return {**decode_sums(pred, labels), "loss_sum": loss_sum.double()}

    def metrics(self, totals) -> dict[str, float]:
        return seq2seq_metrics(totals)
