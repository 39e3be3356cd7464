"""VQA v2 fine-tuning of BEiT-3 (Magneto Sec. 7; BEiT-3's VQA recipe): official json layout
in, the official VQA accuracy out."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import torch

from foundation.config import ConfigError
from foundation.engine.data import labelled_fraction
from foundation.engine.task import SharedModules, register_task
from foundation_tasks.vl_common.beit3 import check_pool
from foundation_tasks.vl_common.objects import Objects, read_objects
from foundation_tasks.vl_common.task import VLConfig, VLTask
from foundation_tasks.vqa.data import (ANNOTATIONS, IMAGES, QUESTIONS, ObjectLabels, Questions, VQADataset, answer_counts,
                                       collate, read_answer_list, read_split, vocabulary_of)
from foundation_tasks.vqa.metrics import type_sums, vqa_accuracy, vqa_metrics
from foundation_tasks.vqa.model import VQAHead

OUT_OF_VOCAB = ("error", "skip")


@dataclass
class VQAConfig(VLConfig):
    data_dir: Optional[str] = None  # images: DATA_DIR/{split}/COCO_{split}_{image_id:012d}.jpg
    annotation_dir: Optional[str] = None  # the official jsons (default: data_dir)
    train_split: str = "train2014"
    eval_split: str = "val2014"
    image_pattern: str = IMAGES  # relative to data_dir; {split} and {image_id}
    min_answer_count: int = 9  # majority answers seen this often form the vocabulary
    vocab_splits: List[str] = field(default_factory=list)  # counted in; default [train_split] (BEiT-3: train + val)
    answer_vocab: Optional[str] = None  # or a fixed list: BEiT-3's answer2label.txt / one answer per line
    # the vocabulary itself: filled from answer_vocab or the train annotations when empty, and
    # saved with the run, so that a checkpoint carries the meaning of its outputs
    answers: List[str] = field(default_factory=list)
    out_of_vocab: str = "error"  # a training question with no answer in the vocabulary: error | skip (BEiT-3)
    pretrained_head: bool = False  # init_from also loads pooler + head (a converted BEiT-3 VQA model)
    # what the pooler reads: "cls", the image's class token (BEiT-3), or "max", the element-wise max
    # over the image's patch tokens (as a CNN's global max pool). Without per-patch object labels
    # "max" learns faster on small scenes (docs/vision-language.md, off its home data)
    pool: str = "cls"
    # Per-patch object labels beside the answer loss (null: off): COCO instances over the
    # training images, "{split}" = train_split, relative to data_dir (the demo's:
    # ../coco/annotations/instances_{split}.json). Each patch token after block
    # object_loss_block (1-based) names the category over it or background (cross-entropy,
    # weighted object_loss_weight): the image side learns what the objects are, locally,
    # where the question's words can find them (docs/findings.md, Vision-language, NLVR2).
    object_annotations: Optional[str] = None
    object_categories: List[str] = field(default_factory=list)  # filled from the file; saved with the run
    object_loss_weight: float = 1.0
    object_loss_block: int = 2
    # a training question's weight in the answer loss by its annotation's answer_type (VQA v2:
    # yes/no, number, other; unlisted types 1), the batch loss the weighted mean. The tiny
    # recipe's yes/no: 6, so that verification is learnt beside the object labels (docs)
    answer_type_weights: Dict[str, float] = field(default_factory=dict)
    max_train_questions: Optional[int] = None  # the first N (quick runs)
    max_eval_questions: Optional[int] = None
    # a label budget: train on this fraction of the training questions (the evaluation split is
    # never subset), drawn by subset_seed and nested across fractions (foundation.engine.data.
    # labelled_fraction); the answer vocabulary and the object labels come from those questions
    # and their images only
    train_fraction: Optional[float] = None
    subset_seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_pool(self.pool)
        if self.out_of_vocab not in OUT_OF_VOCAB:
            raise ConfigError(f"field 'out_of_vocab': must be error or skip (got {self.out_of_vocab!r})")
        if self.min_answer_count < 1:
            raise ConfigError(f"field 'min_answer_count': must be >= 1 (got {self.min_answer_count})")
        if self.train_fraction is not None and not 0 < self.train_fraction <= 1:
            raise ConfigError(f"field 'train_fraction': must be in (0, 1] or null (got {self.train_fraction!r})")
        if not self.answers:
            self.answers = self._answers()
        if self.object_annotations is not None and not self.object_categories:
            self.object_categories = self.objects().categories
        if any(w <= 0 for w in self.answer_type_weights.values()):
            raise ConfigError(f"field 'answer_type_weights': weights must be > 0 (got {dict(self.answer_type_weights)})")
        if self.object_loss_weight <= 0 or self.object_loss_block < 1:
            raise ConfigError("fields 'object_loss_weight' / 'object_loss_block': must be > 0 / >= 1 "
                              f"(got {self.object_loss_weight} / {self.object_loss_block})")
        if len(set(self.answers)) != len(self.answers):
            raise ConfigError("field 'answers': an answer appears twice")

    @property
    def annotations(self) -> str:
        return self.annotation_dir or self.data_dir

    def objects(self) -> Objects:
        """The training split's object annotations (``object_annotations``)."""
        path = Path(self.data_dir or ".") / self.object_annotations.format(split=self.train_split)
        if not path.is_file():
            raise ConfigError(f"field 'object_annotations': {path} not found (COCO's instances_{{split}}.json over "
                              "the VQA images; `foundation data make vl` writes them to DIR/coco/annotations)")
        objects = read_objects(path)
        if self.object_categories and objects.categories != list(self.object_categories):
            raise ConfigError(f"field 'object_categories': {path} has other categories than the run's "
                              f"({len(objects.categories)} vs {len(self.object_categories)})")
        return objects

    def labelled(self, questions):
        """The training questions of the label budget (all of them without one): a ``Questions``
        of a ``Questions``, a list of a list."""
        questions = questions[:self.max_train_questions]
        rows = labelled_fraction(len(questions), self.train_fraction, self.subset_seed, "questions")
        if isinstance(questions, Questions):
            return questions.take(rows)
        return [questions[i] for i in rows]

    def _answers(self) -> List[str]:
        if self.answer_vocab is not None:
            return read_answer_list(self.answer_vocab)
        if self.data_dir is None:
            raise ConfigError("field 'data_dir': set it to the VQA v2 root (`foundation data make vl --out DIR` "
                              "writes a demo one to DIR/vqa); the answer vocabulary is built from its train split")
        splits = self.vocab_splits or [self.train_split]
        counts = sum((answer_counts(self._vocab_questions(split)) for split in splits), Counter())
        answers = vocabulary_of(counts, self.min_answer_count)
        if not answers:
            raise ConfigError(f"field 'min_answer_count': no answer of {', '.join(splits)} is seen "
                              f"{self.min_answer_count} times")
        return answers

    def _vocab_questions(self, split: str) -> Questions:
        # read once: the training set reuses what read_split keeps (a split is read and checked once)
        questions = read_split(self.annotations, self.data_dir, split, self.image_pattern)
        # a label budget's answers are the only training labels there are
        return self.labelled(questions) if split == self.train_split and self.train_fraction is not None else questions


@register_task("vqa")
class VQA(VLTask):
    Config = VQAConfig
    primary_metric = "vqa_accuracy"

    def check(self) -> None:
        super().check()
        c = self.cfg
        self.check_finetune_data("VQA v2", "vqa", [("annotation_dir", Path(c.annotations) / pattern.format(split=split))
                                                   for split in (c.train_split, c.eval_split)
                                                   for pattern in (QUESTIONS, ANNOTATIONS)])
        if c.object_annotations is not None:
            if c.object_loss_block > self.backbone_cfg.depth:
                raise ConfigError(f"field 'object_loss_block': {c.object_loss_block} is past the backbone's "
                                  f"{self.backbone_cfg.depth} blocks")
            if self.augments:
                raise ConfigError("field 'object_annotations': per-patch object labels need the images as the "
                                  "evaluation transform gives them (train_crop_scale [1.0, 1.0], no colour "
                                  "jitter); a random crop would move the objects off their labels")

    head_prefixes = ("pooler.", "head.")

    def build_head(self, shared=None) -> VQAHead:
        embed = self.embedding(shared if shared is not None else SharedModules())
        c = self.cfg
        objects = dict(num_objects=len(c.object_categories), object_block=c.object_loss_block - 1,
                       object_weight=c.object_loss_weight) if c.object_annotations is not None else {}
        return VQAHead(embed, self.backbone_cfg.dim, len(c.answers), self.backbone_cfg.layernorm_eps,
                       c.head_init_std, pool=c.pool, **objects)

    def _dataset(self, split: str, train: bool, limit: Optional[int]) -> VQADataset:
        c = self.cfg
        questions = read_split(c.annotations, c.data_dir, split, c.image_pattern)
        questions = c.labelled(questions) if train else questions[:limit]
        transform = self.image_transform(train)
        objects = None
        if train and c.object_annotations is not None:
            objects = ObjectLabels(c.objects(), c.img_size, c.patch_size)
        dataset = VQADataset(questions, c.answers, self.tokenizer, c.max_text_len, transform, train, c.out_of_vocab,
                             random_transform=train and self.augments, objects=objects,
                             answer_type_weights=c.answer_type_weights if train else None, cache_images=c.cache_images)
        if dataset.skipped:
            print(f"vqa: {split}: skipped {dataset.skipped} of {len(questions)} questions with no answer in the "
                  f"{len(c.answers)}-answer vocabulary (out_of_vocab: skip)")
        return dataset

    def train_dataset(self) -> VQADataset:
        return self._dataset(self.cfg.train_split, True, self.cfg.max_train_questions)

    def eval_dataset(self) -> VQADataset:
        return self._dataset(self.cfg.eval_split, False, self.cfg.max_eval_questions)

    def collate(self, samples):
        return collate(samples, self.tokenizer.pad_id, len(self.cfg.answers))

    def predict(self, head: VQAHead, backbone, batch) -> tuple[torch.Tensor, list[str]]:
        logits = head.logits(backbone, batch)
        return logits, [self.cfg.answers[i] for i in logits.argmax(1).tolist()]

    def eval_step(self, head: VQAHead, backbone, batch) -> dict[str, torch.Tensor]:
        logits, predicted = self.predict(head, backbone, batch)
        top = logits.argmax(1, keepdim=True)
        accuracies = [vqa_accuracy(p, a) for p, a in zip(predicted, batch["answers"])]
        by_type = type_sums(accuracies, batch["answer_type"])
        return {
            "questions": torch.tensor(float(len(predicted))),
            "accuracy": torch.tensor(sum(accuracies)),
            "score": batch["targets"].gather(1, top).sum().double(),
            "loss_sum": head.loss(logits, batch["targets"], reduction="sum").double(),
            **{k: torch.tensor(v, dtype=torch.float64) for k, v in by_type.items()},
        }

    def metrics(self, totals) -> dict[str, float]:
        return vqa_metrics(totals)

    def export_meta(self) -> dict:
        return {**super().export_meta(), "answers": list(self.cfg.answers)}

    def predictor(self, head, backbone, meta, device):
        from foundation_tasks.vqa.predict import VQAPredictor

        return VQAPredictor(self, head, backbone, meta, device)
