"""BEiT-3's masked data modeling (Magneto Sec. 7): one task entry per kind of batch, mixed
by the engine (``train.mix``, each entry's ``weight`` and ``batch_size``)::

    tasks:
      - {name: vl_pretrain, id: text,  kind: text,  train_data: text/train.txt, ...}             # MLM, 15%
      - {name: vl_pretrain, id: image, kind: image, train_data: coco/train2014, ...}             # MIM, 40% blocks
      - {name: vl_pretrain, id: pair,  kind: pair,  train_data: captions_train2014.json, ...}    # 50% text + 40% image
      - {name: vl_pretrain, id: match, kind: match, train_data: captions_train2014.json, ...}    # image-text matching
    train: {mix: sum}   # every step one batch of each kind (BEiT-3: 4096 + 4096 + 4096), or sample / round_robin

The entries share one BEiT-3 embedding and the MLM / MIM output layers (``VLTask.shared``).
Evaluation: masked-token accuracy on held-out data with fixed masks.

``match`` is not BEiT-3's: image-text matching (ITM, as VLMo and ALBEF add to masked language
modeling), unmasked pairs of which half carry another image's caption, a binary head on the
pooled first token. Masked modeling alone barely grounds words in the image at the demo's size
(docs/findings.md, pretraining where labels are scarce); a caption cannot be matched to its image without it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from foundation.config import ConfigError
from foundation.engine.task import SharedModules, register_task
from foundation_tasks.vl_common.beit3 import Pooler
from foundation_tasks.vl_common.task import VLConfig, VLTask
from foundation_tasks.vl_pretrain.data import KINDS, MaskedDataset, collate, find_images, read_captions, read_lines
from foundation_tasks.vl_pretrain.masking import block_masking
from foundation_tasks.vl_pretrain.metrics import mdm_metrics, mdm_sums
from foundation_tasks.vl_pretrain.model import MatchOutput, MDMHead, MIMOutput, MLMOutput
from foundation_tasks.vl_pretrain.visual_tokenizer import VISUAL_TOKENIZERS, build_visual_tokenizer

DEFAULT_TEXT_RATIO = {"text": 0.15, "pair": 0.5}  # BEiT-3: 15% of monomodal texts, 50% of paired texts


@dataclass
class VLPretrainConfig(VLConfig):
    kind: str = "pair"  # text (MLM) | image (MIM) | pair (both) | match (image-text matching)
    train_data: Optional[str] = None  # text: a .txt file; image: a folder; pair / match: a COCO captions json
    eval_data: Optional[str] = None
    train_images: Optional[str] = None  # pair: the folder the captions' file_name is relative to
    eval_images: Optional[str] = None
    text_mask_ratio: Optional[float] = None  # default 0.15 for text, 0.5 for pair
    text_mask_words: Optional[list[str]] = None  # words masked first (content-word masking, Bitton et al. 2021);
    #   default: BERT's uniform choice
    image_mask_ratio: float = 0.4  # block-wise (BEiT)
    class_token_word: bool = False  # pair: the pooled class token also names the first masked word (MDMHead's word)
    min_mask_block: Optional[int] = None  # patches; default min(16, masked patches // 4) (BEiT: 16 on 14 x 14)
    visual_tokenizer: str = "random_projection"  # | vq_tokenizer (a foundation_tasks/vq_tokenizer run, BEiT v2's VQ-KD)
    #   | pixels (no ids: the masked patches' normalised pixels, MAE / SimMIM)
    visual_tokenizer_path: Optional[str] = None  # vq_tokenizer: its model.safetensors
    visual_vocab_size: int = 8192  # random_projection: ids, code size and seed
    visual_code_dim: int = 32
    visual_seed: int = 0
    max_train_items: Optional[int] = None
    max_eval_items: Optional[int] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kind not in KINDS:
            raise ConfigError(f"field 'kind': must be one of {', '.join(KINDS)} (got {self.kind!r})")
        if self.text_mask_ratio is None and self.kind in DEFAULT_TEXT_RATIO:
            self.text_mask_ratio = DEFAULT_TEXT_RATIO[self.kind]
        for name in ("text_mask_ratio", "image_mask_ratio"):
            value = getattr(self, name)
            if value is not None and not 0.0 < value < 1.0:
                raise ConfigError(f"field {name!r}: must be in (0, 1) (got {value!r})")
        if self.text_mask_words is not None and (
                not self.text_mask_words or not all(isinstance(w, str) and w.strip() for w in self.text_mask_words)):
            raise ConfigError(f"field 'text_mask_words': expected a non-empty list of words (got {self.text_mask_words!r})")
        if self.text_mask_words is not None and self.kind not in DEFAULT_TEXT_RATIO:
            raise ConfigError(f"field 'text_mask_words': kind {self.kind} masks no text (only kinds "
                              f"{', '.join(DEFAULT_TEXT_RATIO)} do)")
        if self.class_token_word and self.kind != "pair":
            raise ConfigError(f"field 'class_token_word': only kind pair has a masked word with an image "
                              f"(got kind {self.kind})")
        if self.visual_tokenizer not in VISUAL_TOKENIZERS:
            raise ConfigError(f"field 'visual_tokenizer': must be one of {', '.join(VISUAL_TOKENIZERS)} "
                              f"(got {self.visual_tokenizer!r})")
        if self.visual_tokenizer == "vq_tokenizer" and self.kind in ("image", "pair") and not self.visual_tokenizer_path:
            raise ConfigError("field 'visual_tokenizer_path': visual_tokenizer=vq_tokenizer needs the tokenizer run's "
                              "model.safetensors")
        if self.visual_vocab_size < 2 or self.visual_code_dim < 1:
            raise ConfigError("fields 'visual_vocab_size' / 'visual_code_dim': must be >= 2 / >= 1")


@register_task("vl_pretrain")
class VLPretrain(VLTask):
    Config = VLPretrainConfig
    primary_metric = "accuracy"

    @classmethod
    def primary(cls, config: VLPretrainConfig) -> tuple[str, bool]:
        if config.kind == "image" and config.visual_tokenizer == "pixels":
            return "mim_pix_loss", False
        return cls.primary_metric, True

    def check(self) -> None:
        super().check()
        c = self.cfg
        fields = ["train_data", "eval_data"] + (["train_images", "eval_images"] if c.kind in ("pair", "match") else [])
        if c.kind in ("image", "pair") and c.visual_tokenizer == "vq_tokenizer":
            fields.append("visual_tokenizer_path")
        for name in fields:
            value = getattr(c, name)
            want_dir = name.endswith("images") or (c.kind == "image" and name.endswith("data"))
            if value is None or not (Path(value).is_dir() if want_dir else Path(value).is_file()):
                what = "folder" if want_dir else "file"
                raise ConfigError(f"field {name!r}: {what} not found: {value} (kind {c.kind}; "
                                  "`foundation data make vl --out DIR` writes demo data)")

    @property
    def grid(self) -> tuple[int, int]:
        n = self.cfg.img_size // self.cfg.patch_size
        return n, n

    def build_head(self, shared=None) -> MDMHead:
        c, dim = self.cfg, self.backbone_cfg.dim
        shared = shared if shared is not None else SharedModules()
        embed = self.embedding(shared, {"text": ("text",), "image": ("vision", "mask"), "pair": ("text", "vision", "mask"),
                                        "match": ("text", "vision")}[c.kind])
        if c.kind == "match":
            return MDMHead(embed, None, None, MatchOutput(dim, c.head_init_std))
        mlm = mim = None
        if c.kind != "image":
            mlm = self.shared(shared, "MLM output", {"vocab_size": embed.text_embed.num_embeddings},
                              lambda: MLMOutput(embed.text_embed.num_embeddings))
        if c.kind != "text":
            settings = {k: getattr(c, k) for k in ("visual_tokenizer", "visual_tokenizer_path", "visual_vocab_size",
                                                   "visual_code_dim", "visual_seed")}
            mim = self.shared(shared, "MIM output", settings, lambda: MIMOutput(dim, build_visual_tokenizer(c)))
        return MDMHead(embed, mlm, mim, word=Pooler(dim) if c.class_token_word else None)

    def _dataset(self, train: bool) -> MaskedDataset:
        c = self.cfg
        data, images = (c.train_data, c.train_images) if train else (c.eval_data, c.eval_images)
        records = {"text": lambda: read_lines(data), "image": lambda: find_images(data),
                   "pair": lambda: read_captions(data, images), "match": lambda: read_captions(data, images)}[c.kind]()
        records = records[: c.max_train_items if train else c.max_eval_items]
        masking = block_masking(self.grid, c.image_mask_ratio, c.min_mask_block) if c.kind in ("image", "pair") else None
        return MaskedDataset(c.kind, records, tokenizer=self.tokenizer, max_text_len=c.max_text_len,
                             transform=self.image_transform(train),
                             train=train, text_ratio=c.text_mask_ratio or 0.0, image_masking=masking,
                             random_transform=train and self.augments, prefer_pieces=self.mask_word_pieces())

    def mask_word_pieces(self) -> frozenset[int]:
        """The piece ids of ``text_mask_words`` (every piece of each word, as the tokenizer splits it
        alone; CLIP's BPE splits a word the same way wherever it stands). A word split into pieces
        puts each piece first wherever it occurs ("triangles" is "tri" + "angles"), so list words
        whose pieces are not common suffixes."""
        words = self.cfg.text_mask_words or []
        return frozenset(i for w in words for i in self.tokenizer.pieces(w.strip()))

    def train_dataset(self) -> MaskedDataset:
        return self._dataset(True)

    def eval_dataset(self) -> MaskedDataset:
        return self._dataset(False)

    def collate(self, samples):
        return collate(samples, self.tokenizer.pad_id)

    def eval_step(self, head: MDMHead, backbone, batch) -> dict[str, torch.Tensor]:
        return mdm_sums(head.predict(backbone, batch))

    def metrics(self, totals) -> dict[str, float]:
        return mdm_metrics(totals)
