"""What every vision-language task has: the config fields of the text and image front end,
one BEiT-3 embedding shared by all VL tasks of a model, and fitting pretrained embeddings.

**Sharing.** The engine builds each task's head separately around one shared backbone
(``Task.build_head``); BEiT-3's embeddings (text tokens, patches, positions) must be
shared the same way, or text-only, image-only and image-text batches would each train
their own. The engine hands every ``build_head`` the model's ``SharedModules``: the
first VL head builds the ``BEiT3Embedding`` there (and the pretraining heads one MLM and
one MIM output), the others take the same module. Its settings (tokenizer, vocabulary,
image and patch size, text positions) must then agree, which the registry checks,
naming the fields.

**Pretrained weights.** The engine's ``init_from`` loads the backbone and the embedding
(``embed.*``) from a VL pretraining run's ``model.safetensors`` or a
``foundation_tasks.vl_common.convert`` output; ``adapt_init`` resizes the vision positions to this
task's patch grid. VQA / NLVR2 load their head from the file only with
``pretrained_head: true`` (a converted BEiT-3 VQA / NLVR2 model), and then it must fit.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, List, Optional

import torch
from torch import nn

from foundation.config import ConfigError
from foundation.engine.task import SharedModules, Task
from foundation_tasks.vl_common.beit3 import EXPERTS, BEiT3Embedding, resize_vision_pos
from foundation_tasks.vl_common.images import image_transform
from foundation_tasks.vl_common.text import TOKENIZERS, Tokenizer, get_tokenizer


@dataclass
class VLConfig:
    """Front-end fields shared by the VL tasks (BEiT-3 base at 224 px by default)."""

    tokenizer: str = "open_clip"  # open_clip (bundled CLIP BPE) | sentencepiece (spm_model, e.g. beit3.spm)
    spm_model: Optional[str] = None
    vocab_size: Optional[int] = None  # text embedding rows; default: the tokenizer's ids + [MASK]
    text_positions: int = 1022  # text position table (torchscale's max_source_positions 1024 - 2)
    max_text_len: int = 64  # tokens per text, bos and eos included (longer texts are cut)
    img_size: int = 224
    patch_size: int = 16
    image_mean: List[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])  # BEiT-3's VL normalisation
    image_std: List[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])
    train_crop_scale: List[float] = field(default_factory=lambda: [1.0, 1.0])  # RandomResizedCrop area range
    train_color_jitter: Optional[float] = None  # ColorJitter(j, j, j) at training (BEiT-3 pretraining: 0.4)
    # an early-convolution stem (3x3 stride-2 convs, Xiao et al. 2021) in place of the patchifying
    # conv, same token grid; not BEiT-3's layout (its converted weights need false)
    conv_stem: bool = False
    # std of the fine-tuning head's Linear weights (truncated at +-std). BEiT-3's 0.02 suits its
    # 768+-wide heads on a pretrained backbone; a from-scratch dim-64 model trained with such a
    # near-zero head fits the answer prior and never looks at the image (docs/findings.md, Vision-language)
    head_init_std: float = 0.02
    # std of the text embedding's init (BEiT's 0.02 by default; torchscale's BEiT-3 draws dim^-1/2).
    # Masked data modeling from 0.02 at dim 64 barely reads a caption's colour words off the image
    # (19 % against 16 with the image hidden), from dim^-1/2 it does (56 %), though VQA gains no more from it
    # (docs/findings.md, pretraining where labels are scarce)
    text_embed_std: float = 0.02
    # keep every decoded image in memory after its first read (small data sets on CPU, e.g. the
    # demo's: ~5 % of a tiny VQA step); each DataLoader worker keeps its own
    cache_images: bool = False

    def __post_init__(self) -> None:
        def bad(name: str, msg: str) -> ConfigError:
            return ConfigError(f"field {name!r}: {msg} (got {getattr(self, name)!r})")

        if self.tokenizer not in TOKENIZERS:
            raise bad("tokenizer", f"must be one of {', '.join(TOKENIZERS)}")
        if self.vocab_size is not None and self.vocab_size < 1:
            raise bad("vocab_size", "must be >= 1 or null")
        if not 3 <= self.max_text_len <= self.text_positions:
            raise bad("max_text_len", f"must be in [3, text_positions={self.text_positions}]")
        if self.patch_size < 1 or self.img_size < self.patch_size or self.img_size % self.patch_size:
            raise bad("img_size", f"must be a positive multiple of patch_size={self.patch_size}")
        for name in ("image_mean", "image_std"):
            if len(getattr(self, name)) != 3:
                raise bad(name, "must have 3 values (RGB)")
        for name in ("head_init_std", "text_embed_std"):
            if not 0 < getattr(self, name) <= 1:
                raise bad(name, "must be in (0, 1]")
        if self.train_color_jitter is not None and not 0 <= self.train_color_jitter <= 1:
            raise bad("train_color_jitter", "must be in [0, 1] or null")
        lo_hi = self.train_crop_scale
        if len(lo_hi) != 2 or not 0 < lo_hi[0] <= lo_hi[1] <= 1:
            raise bad("train_crop_scale", "must be [low, high] with 0 < low <= high <= 1")


class VLTask(Task):
    """Base of the VL tasks: ``self.cfg`` is a ``VLConfig`` subclass."""

    embedding_params = ("embed",)
    # head modules that init_from loads only with the config's ``pretrained_head: true``
    head_prefixes: tuple[str, ...] = ()

    # ------------------------------------------------------------------ front end

    @property
    def tokenizer(self) -> Tokenizer:
        return get_tokenizer(self.cfg.tokenizer, self.cfg.spm_model)

    @property
    def augments(self) -> bool:
        """Whether training images are randomly transformed (then seeded per item)."""
        return tuple(self.cfg.train_crop_scale) != (1.0, 1.0) or bool(self.cfg.train_color_jitter)

    def image_transform(self, train: bool):
        """open_clip's training transform when augmenting, else its evaluation one."""
        c = self.cfg
        return image_transform(c.img_size, train and self.augments, c.image_mean, c.image_std, c.train_crop_scale,
                               c.train_color_jitter)

    def embedding_settings(self) -> dict[str, Any]:
        c = self.cfg
        if c.vocab_size is not None and c.tokenizer == "sentencepiece" and not Path(c.spm_model or "").is_file():
            # a trained model rebuilt from its file elsewhere: the embedding's size is in the
            # config and the sentencepiece model in the file's metadata (check() insists on the file)
            vocab = c.vocab_size
        else:
            tok = self.tokenizer
            vocab = c.vocab_size or tok.size
            if vocab < tok.size:
                raise ConfigError(f"field 'vocab_size': {vocab} rows cannot hold the tokenizer's {tok.size} ids")
        return dict(tokenizer=self.cfg.tokenizer, spm_model=self.cfg.spm_model, vocab_size=vocab,
                    img_size=self.cfg.img_size, patch_size=self.cfg.patch_size,
                    text_positions=self.cfg.text_positions, dim=self.backbone_cfg.dim, conv_stem=self.cfg.conv_stem,
                    text_embed_std=self.cfg.text_embed_std)

    def export_meta(self) -> dict[str, Any]:
        """The text tokenizer (its name; a sentencepiece model's bytes) and the evaluation
        image transform's settings, for ``foundation predict``."""
        c = self.cfg
        meta = dict(tokenizer=c.tokenizer, max_text_len=c.max_text_len, img_size=c.img_size,
                    image_mean=list(c.image_mean), image_std=list(c.image_std))
        if c.tokenizer == "sentencepiece":
            meta["spm_model"] = Path(c.spm_model).read_bytes()
        return meta

    def check(self) -> None:
        experts = list(self.backbone_cfg.experts)
        if experts and not set(EXPERTS) <= set(experts):
            raise ConfigError(f"field 'backbone.experts': {self.name} is a BEiT-3 task: its image and text tokens "
                              f"take the experts {list(EXPERTS)} (BEiT-3), or the shared layers of a backbone "
                              f"without experts (got {self.backbone_cfg.experts!r})")
        self.tokenizer  # noqa: B018  (a missing spm_model is an error here, even with vocab_size set)
        self.embedding_settings()

    def check_finetune_data(self, dataset: str, demo_subdir: str, files: list[tuple[str, Path]]) -> None:
        """A fine-tuning task's data_dir and its annotation ``files`` ((field, path)): each
        error names the field and the path."""
        c = self.cfg
        if c.data_dir is None or not Path(c.data_dir).is_dir():
            raise ConfigError(f"field 'data_dir': directory not found: {c.data_dir} "
                              f"(`foundation data make vl --out DIR` writes a demo {dataset} to DIR/{demo_subdir})")
        for name, path in files:
            if not path.is_file():
                raise ConfigError(f"field '{name}': {path} not found")

    def shared(self, shared: SharedModules, name: str, settings: dict[str, Any], make: Callable[[], nn.Module]) -> nn.Module:
        """The model's module ``name`` (built by the first head that asks, with ``make``);
        every task asking for it must ask with the same ``settings``."""
        return shared.get_or_create(name, settings, make, owner=self.name)

    def embedding(self, shared: SharedModules, uses: tuple[str, ...] = ("text", "vision")) -> BEiT3Embedding:
        """The BEiT-3 embedding shared by the model's VL heads. ``uses`` names the parts this
        head's forward uses (text, vision, mask); parts no head of the model uses are frozen,
        so that DDP (which refuses parameters without gradients) can train e.g. VQA alone,
        whose forward never uses the mask token."""
        s = self.embedding_settings()
        embed = self.shared(shared, "BEiT-3 embedding", s, lambda: BEiT3Embedding(
            s["vocab_size"], s["dim"], s["img_size"], s["patch_size"], text_positions=s["text_positions"],
            conv_stem=s["conv_stem"], text_std=s["text_embed_std"]))
        used = shared.get_or_create("BEiT-3 embedding parts in use", {}, set)
        used.update(uses)
        for part, params in embed.parts().items():
            for p in params:
                p.requires_grad_(part in used)
        return embed

    # ------------------------------------------------------------------ init_from

    def adapt_init(self, name: str, tensor: torch.Tensor, target: torch.Tensor):
        """The embedding's vision positions resized to this patch grid; the head
        (``head_prefixes``) only with ``pretrained_head``, and then it must fit."""
        if name.startswith(self.head_prefixes):
            if not self.cfg.pretrained_head:
                return "pretrained_head: false"
            if tensor.shape != target.shape:
                raise ConfigError(f"field 'pretrained_head': the head in init_from does not fit {self.name}'s: "
                                  f"{name}: {tuple(tensor.shape)} vs {tuple(target.shape)}")
            return tensor
        if name == "embed.vision_pos" and tensor.shape != target.shape and tensor.shape[1:] == target.shape[1:]:
            n = self.cfg.img_size // self.cfg.patch_size
            try:
                return resize_vision_pos(tensor, (n, n))
            except ValueError as e:
                return str(e)
        return super().adapt_init(name, tensor, target)
