"""What every vision-language task has: the config fields of the text and image front end,
one BEiT-3 embedding shared by all VL tasks of a model, and pretrained-embedding loading.

**Sharing.** The engine builds each task's head separately around one shared backbone
(``Task.build_head``); BEiT-3's embeddings (text tokens, patches, positions) must be
shared the same way, or text-only, image-only and image-text batches would each train
their own. The tasks of one model are created together, all with that model's one
``BackboneConfig`` object, before any of them builds its head; so tasks created with the
same config object while none of them has built a head yet form a group, and the group's
heads hold one ``BEiT3Embedding`` (and the pretraining heads one MLM and one MIM output).
Its settings (tokenizer, vocabulary, image and patch size, text positions) must then
agree, which ``build_head`` checks, naming the field.
(A later build from the same config object, e.g. a copy of the model, starts a new group.)

**Pretrained weights.** The engine's ``init_from`` loads the backbone only. ``pretrained``
loads the embedding (and, for VQA / NLVR2 with ``pretrained_head: true``, the head) from
a VL pretraining run's ``model.safetensors`` or a ``tasks.vl_common.convert`` output; the
vision positions are resized to this task's patch grid. ``check`` makes sure the file
exists before training; ``build_head`` loads it when it exists (a trained checkpoint
loaded elsewhere then overwrites these weights anyway).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, List, Optional

from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from foundation.config import BackboneConfig, ConfigError
from foundation.engine.task import Task
from tasks.vl_common.beit3 import EXPERTS, BEiT3Embedding
from tasks.vl_common.images import image_transform
from tasks.vl_common.text import TOKENIZERS, Tokenizer, get_tokenizer


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
    pretrained: Optional[str] = None  # safetensors with a BEiT-3 embedding (see tasks/vl_common/task.py)

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
        if self.train_color_jitter is not None and not 0 <= self.train_color_jitter <= 1:
            raise bad("train_color_jitter", "must be in [0, 1] or null")
        lo_hi = self.train_crop_scale
        if len(lo_hi) != 2 or not 0 < lo_hi[0] <= lo_hi[1] <= 1:
            raise bad("train_crop_scale", "must be [low, high] with 0 < low <= high <= 1")


class _Group:
    def __init__(self):
        self.built = False
        self.modules: dict[str, nn.Module] = {}
        self.settings: dict[str, tuple[dict[str, Any], str]] = {}  # name -> (settings, first task)
        self.loaded: set[str] = set()  # files whose embedding is already in the shared one
        self.uses: set[str] = set()  # parts of the embedding some head uses (see VLTask.embedding)


_GROUPS: dict[int, tuple[weakref.ref, _Group]] = {}


def _join(backbone: BackboneConfig) -> _Group:
    key = id(backbone)
    entry = _GROUPS.get(key)
    if entry is None or entry[0]() is not backbone or entry[1].built:
        def forget(ref, key=key):
            if _GROUPS.get(key, (None,))[0] is ref:
                del _GROUPS[key]

        entry = (weakref.ref(backbone, forget), _Group())
        _GROUPS[key] = entry
    return entry[1]


class VLTask(Task):
    """Base of the VL tasks: ``self.cfg`` is a ``VLConfig`` subclass."""

    embedding_params = ("embed",)

    def __init__(self, cfg: Any, backbone: BackboneConfig):
        super().__init__(cfg, backbone)
        self._group = _join(backbone)

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
                    text_positions=self.cfg.text_positions, dim=self.backbone_cfg.dim)

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
        if self.cfg.pretrained is not None and not Path(self.cfg.pretrained).is_file():
            raise ConfigError(f"field 'pretrained': file not found: {self.cfg.pretrained}")

    def check_finetune_data(self, dataset: str, demo_subdir: str, files: list[tuple[str, Path]]) -> None:
        """A fine-tuning task's data_dir, its annotation ``files`` ((field, path)) and
        ``pretrained_head`` (VQA, NLVR2): each error names the field and the path."""
        c = self.cfg
        if c.data_dir is None or not Path(c.data_dir).is_dir():
            raise ConfigError(f"field 'data_dir': directory not found: {c.data_dir} "
                              f"(`foundation data make vl --out DIR` writes a demo {dataset} to DIR/{demo_subdir})")
        for name, path in files:
            if not path.is_file():
                raise ConfigError(f"field '{name}': {path} not found")
        if c.pretrained_head and c.pretrained is None:
            raise ConfigError(f"field 'pretrained_head': needs `pretrained` (a converted BEiT-3 {self.name.upper()} "
                              "checkpoint)")

    def shared(self, name: str, settings: dict[str, Any], make: Callable[[], nn.Module]) -> nn.Module:
        """The group's module ``name`` (built by the first head that asks, with ``make``);
        every task asking for it must ask with the same ``settings``."""
        group = self._group
        group.built = True
        if name not in group.modules:
            group.modules[name] = make()
            group.settings[name] = (settings, self.name)
        theirs, owner = group.settings[name]
        if theirs != settings:
            diff = [f"{k}: {settings.get(k)!r} here, {theirs.get(k)!r} in {owner}"
                    for k in sorted(set(settings) | set(theirs)) if settings.get(k) != theirs.get(k)]
            raise ConfigError(f"the VL tasks of one model share the {name}, so these fields must agree: "
                              + "; ".join(diff))
        return group.modules[name]

    def embedding(self, uses: tuple[str, ...] = ("text", "vision")) -> BEiT3Embedding:
        """The BEiT-3 embedding shared by the model's VL heads. ``uses`` names the parts this
        head's forward uses (text, vision, mask); parts no head of the model uses are frozen,
        so that DDP (which refuses parameters without gradients) can train e.g. VQA alone,
        whose forward never uses the mask token."""
        s = self.embedding_settings()
        embed = self.shared("BEiT-3 embedding", s, lambda: BEiT3Embedding(
            s["vocab_size"], s["dim"], s["img_size"], s["patch_size"], text_positions=s["text_positions"]))
        self._group.uses.update(uses)
        for part, params in embed.parts().items():
            for p in params:
                p.requires_grad_(part in self._group.uses)
        return embed

    # ------------------------------------------------------------------ pretrained weights

    def pretrained_state(self) -> tuple[str, dict] | None:
        """(the file, its tensors) of ``pretrained`` when set and present."""
        path = self.cfg.pretrained
        if path is None or not Path(path).is_file():
            return None
        try:
            return path, load_file(path)
        except (SafetensorError, OSError) as e:
            raise ConfigError(f"field 'pretrained': {path} is not a readable safetensors file ({e})") from None

    def load_pretrained(self, head: nn.Module, head_prefixes: tuple[str, ...] = ()) -> None:
        """The embedding from ``pretrained`` into ``head.embed`` and, for ``head_prefixes``
        (e.g. ``("pooler.", "head.")``), those head modules too, strictly."""
        from tasks.vl_common.convert import find_embedding, load_embedding

        if self.cfg.pretrained in self._group.loaded and not head_prefixes:
            return  # another head of this model already loaded it into the shared embedding
        found = self.pretrained_state()
        if found is None:
            return
        path, state = found
        prefix, emb = find_embedding(state, path)
        load_embedding(head.embed, emb, path)
        self._group.loaded.add(path)
        if not head_prefixes:
            return
        own = {k: v for k, v in head.state_dict().items() if k.startswith(head_prefixes)}
        theirs = {k[len(prefix):]: v for k, v in state.items() if k.startswith(tuple(prefix + p for p in head_prefixes))}
        problems = sorted(set(own) ^ set(theirs)) + [
            f"{k}: {tuple(theirs[k].shape)} vs {tuple(own[k].shape)}" for k in own if k in theirs and own[k].shape != theirs[k].shape]
        if problems:
            raise ConfigError(f"field 'pretrained_head': the head in {path} does not fit {self.name}'s: "
                              + "; ".join(problems[:10]))
        head.load_state_dict(theirs, strict=False)
