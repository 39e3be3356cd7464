"""Train a VQ-KD visual tokenizer (BEiT v2) on an ImageNet-layout folder.

    tasks:
      - name: vq_tokenizer
        data_dir: data/vision-demo
        img_size: 32
        patch_size: 4
        teacher: pixels          # or clip (clip_model, clip_pretrained: a local weights file),
                                 # or run (teacher_run: a vision run's model.safetensors)
        num_codes: 8192
        code_dim: 32

The backbone is the tokenizer's encoder; the head holds the codebook, the decoder and
(not saved) the teacher. Evaluation reports the reconstruction loss and how much of
the codebook the validation images use (``codebook_usage``, ``perplexity``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import torch
from torch import nn

from foundation.config import ConfigError
from foundation.engine.task import register_task
from foundation_tasks.vision_common.folder import ImageFolderDataset
from foundation_tasks.vision_common.task import ImageFolderTask
from foundation_tasks.vision_common.transforms import pretrain_transform, uncropped_eval_transform
from foundation_tasks.vision_common.vqkd import VQKDHead, build_vqkd
from foundation_tasks.vq_tokenizer.teacher import ClipTeacher, PixelTeacher, RunTeacher

TEACHERS = ("pixels", "clip", "run")


@dataclass
class VQTokenizerConfig:
    data_dir: Optional[str] = None  # ImageNet layout; labels are not used
    img_size: int = 224
    patch_size: int = 16
    num_codes: int = 8192  # codebook size K
    code_dim: int = 32  # codebook vector size d
    decay: float = 0.99  # EMA decay of the codebook
    kmeans_init: bool = True  # codebook from k-means on the first batch
    decoder_depth: int = 3
    decoder_dim: Optional[int] = None  # default: backbone.dim
    decoder_heads: Optional[int] = None  # default: backbone.heads
    teacher: str = "pixels"  # pixels (offline) | clip (BEiT v2) | run (a ViT trained here: teacher_run)
    norm_pix: bool = False  # pixels: normalise each target patch (MAE); codes describe structure, not colour
    clip_model: str = "ViT-B-16"  # open_clip model name, or an open_clip config .json
    clip_pretrained: Optional[str] = None  # local open_clip weights file; null = random teacher (tests only)
    teacher_run: Optional[str] = None  # run: a vision run's model.safetensors (e.g. pixel MIM), frozen
    rec_loss: Optional[str] = None  # cosine | mse; default cosine for clip and run, mse for pixels
    target_dim: Optional[int] = None  # decoder output size; default the teacher's feature size
    input_norm: str = "imagenet"  # the encoder's input: imagenet (mean/std) | unit ([-1, 1], BEiT v2 weights)
    scale: List[float] = field(default_factory=lambda: [0.08, 1.0])  # RandomResizedCrop area range
    hflip: float = 0.5
    interpolation: str = "bicubic"

    def __post_init__(self) -> None:
        def bad(name: str, msg: str) -> ConfigError:
            return ConfigError(f"field {name!r}: {msg} (got {getattr(self, name)!r})")

        if self.teacher not in TEACHERS:
            raise bad("teacher", f"must be one of {', '.join(TEACHERS)}")
        if self.rec_loss is None:
            self.rec_loss = "mse" if self.teacher == "pixels" else "cosine"
        if self.teacher == "run" and not self.teacher_run:
            raise bad("teacher_run", "teacher: run needs the teacher's model.safetensors")
        if self.rec_loss not in ("cosine", "mse"):
            raise bad("rec_loss", "must be cosine or mse")
        if self.input_norm not in ("imagenet", "unit"):
            raise bad("input_norm", "must be imagenet or unit")
        for name in ("img_size", "patch_size", "num_codes", "code_dim", "decoder_depth"):
            if getattr(self, name) < 1:
                raise bad(name, "must be >= 1")
        if not 0 < self.decay < 1:
            raise bad("decay", "must be in (0, 1)")
        if len(self.scale) != 2 or not 0 < self.scale[0] <= self.scale[1] <= 1:
            raise bad("scale", "must be [min, max] with 0 < min <= max <= 1")


@register_task("vq_tokenizer")
class VQTokenizer(ImageFolderTask):
    Config = VQTokenizerConfig
    primary_metric = "rec_loss"
    higher_is_better = False

    def check(self) -> None:
        super().check()
        c = self.cfg
        if c.clip_pretrained is not None and not Path(c.clip_pretrained).is_file():
            raise ConfigError(f"field 'clip_pretrained': not found: {c.clip_pretrained}")
        if c.teacher == "run" and not Path(c.teacher_run).is_file():
            raise ConfigError(f"field 'teacher_run': not found: {c.teacher_run}")
        if c.teacher == "clip" and c.clip_model.endswith(".json") and not Path(c.clip_model).is_file():
            raise ConfigError(f"field 'clip_model': not found: {c.clip_model}")

    def build_teacher(self) -> nn.Module:
        c = self.cfg
        if c.teacher == "pixels":
            return PixelTeacher(c.patch_size, norm_pix=c.norm_pix)
        if c.teacher == "run":
            return RunTeacher(c.teacher_run, c.img_size, c.patch_size)
        return ClipTeacher(c.clip_model, c.clip_pretrained)

    def build_head(self, shared=None) -> VQKDHead:
        """The tokenizer and its teacher, which is built on the first training step, not here."""
        return build_vqkd(self.cfg, self.backbone_cfg, self.target_dim(), self.build_teacher)

    def target_dim(self) -> int:
        """The decoder's output size: ``target_dim``, else the teacher's feature size without
        building it (pixels: p*p*3; run: its backbone's dim; clip: its embed_dim)."""
        c = self.cfg
        if c.target_dim is not None:
            return c.target_dim
        if c.teacher == "pixels":
            return c.patch_size * c.patch_size * 3
        if c.teacher == "run":
            from foundation import checkpoint

            return int(checkpoint.read_config(c.teacher_run)[1].backbone.dim)
        import open_clip

        if c.clip_model.endswith(".json"):
            open_clip.add_model_config(Path(c.clip_model))
        model_cfg = open_clip.get_model_config(Path(c.clip_model).stem if c.clip_model.endswith(".json") else c.clip_model)
        if model_cfg is None:
            raise ConfigError(f"field 'clip_model': unknown open_clip model {c.clip_model!r}")
        return int(model_cfg["embed_dim"])

    def dataset(self, split: str, train: bool) -> ImageFolderDataset:
        c = self.cfg
        if train:
            transform = pretrain_transform(c.img_size, c.scale, color_jitter=0.0, hflip=c.hflip,
                                           interpolation=c.interpolation)
        else:
            transform = uncropped_eval_transform(c.img_size, c.interpolation)
        return ImageFolderDataset(c.data_dir, split, transform, random_transform=train,
                                  expected_shape=(3, c.img_size, c.img_size))

    def collate(self, samples):
        return {"images": torch.stack([s[0] for s in samples])}

    def eval_step(self, head: VQKDHead, backbone: nn.Module, batch) -> dict[str, torch.Tensor]:
        images = batch["images"]
        quantized, ids, _ = head.encode(backbone, images)
        rec = head.reconstruction_loss(head.decode(quantized), head.targets(images), reduction="sum")
        return {"rec_loss_sum": rec.double(), "patches": torch.tensor(float(ids.numel()), dtype=torch.float64),
                "code_counts": torch.bincount(ids.flatten(), minlength=head.quantize.num_codes).double()}

    def metrics(self, totals) -> dict[str, float]:
        counts = totals["code_counts"]
        p = counts / counts.sum()
        entropy = -(p[p > 0] * p[p > 0].log()).sum()
        return {"rec_loss": float(totals["rec_loss_sum"] / totals["patches"]),
                "codebook_usage": float((counts > 0).double().mean()),  # fraction of codes used on val
                "perplexity": float(entropy.exp())}  # effective number of codes
