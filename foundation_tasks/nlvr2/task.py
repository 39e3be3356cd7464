"""NLVR2 fine-tuning of BEiT-3 (Magneto Sec. 7; BEiT-3's NLVR2 recipe): is a statement
true of a pair of images?"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from foundation.engine.task import SharedModules, register_task
from foundation_tasks.nlvr2.data import NLVR2Dataset, collate, read_split
from foundation_tasks.nlvr2.metrics import nlvr2_metrics, nlvr2_sums
from foundation_tasks.nlvr2.model import NLVR2Head
from foundation_tasks.vl_common.beit3 import check_pool
from foundation_tasks.vl_common.task import VLConfig, VLTask


@dataclass
class NLVR2Config(VLConfig):
    data_dir: Optional[str] = None  # holds data/{train,dev,test1}.json (the nlvr2/ folder of lil-lab/nlvr)
    image_dir: Optional[str] = None  # holds images/train/<directory>/, dev/, test1/ (default: data_dir)
    train_split: str = "train"
    eval_split: str = "dev"
    head_init_scale: float = 0.001  # the head's Linear weights times this after init (BEiT-3: 0.001)
    pretrained_head: bool = False  # init_from also loads the head (a converted BEiT-3 NLVR2 model)
    # what the head reads of each image: "cls", its class token (BEiT-3), or "max", the element-wise
    # max over its patch tokens; the VQA start's own pool (a VQA run with pool=max leaves the class
    # token untrained)
    pool: str = "cls"
    max_train_statements: Optional[int] = None  # the first N (quick runs)
    max_eval_statements: Optional[int] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_pool(self.pool)

    @property
    def images(self) -> Optional[str]:
        return self.image_dir or self.data_dir


@register_task("nlvr2")
class NLVR2(VLTask):
    Config = NLVR2Config
    primary_metric = "accuracy"

    def check(self) -> None:
        super().check()
        c = self.cfg
        self.check_finetune_data("NLVR2", "nlvr2", [("data_dir", Path(c.data_dir or ".") / "data" / f"{split}.json")
                                                    for split in (c.train_split, c.eval_split)])

    head_prefixes = ("head.",)

    def build_head(self, shared=None) -> NLVR2Head:
        embed = self.embedding(shared if shared is not None else SharedModules())
        return NLVR2Head(embed, self.backbone_cfg.dim, self.backbone_cfg.layernorm_eps, self.cfg.head_init_std,
                         self.cfg.head_init_scale, pool=self.cfg.pool)

    def _dataset(self, split: str, train: bool, limit: Optional[int]) -> NLVR2Dataset:
        c = self.cfg
        statements = read_split(c.data_dir, c.images, split)[:limit]
        transform = self.image_transform(train)
        return NLVR2Dataset(statements, self.tokenizer, c.max_text_len, transform, train and self.augments,
                            cache_images=c.cache_images)

    def train_dataset(self) -> NLVR2Dataset:
        return self._dataset(self.cfg.train_split, True, self.cfg.max_train_statements)

    def eval_dataset(self) -> NLVR2Dataset:
        return self._dataset(self.cfg.eval_split, False, self.cfg.max_eval_statements)

    def collate(self, samples):
        return collate(samples, self.tokenizer.pad_id)

    def eval_step(self, head: NLVR2Head, backbone, batch) -> dict[str, torch.Tensor]:
        return nlvr2_sums(head.logits(backbone, batch), batch["labels"])

    def metrics(self, totals) -> dict[str, float]:
        return nlvr2_metrics(totals)

    def predictor(self, head, backbone, meta, device):
        from foundation_tasks.nlvr2.predict import NLVR2Predictor

        return NLVR2Predictor(self, head, backbone, meta, device)
