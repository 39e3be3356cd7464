"""The VQ-KD visual tokenizer of BEiT v2 around the shared backbone.

    image -> front end -> backbone (the tokenizer's ViT encoder) -> encode_task_layer
          -> NormEMAQuantizer (ids) -> decoder_embed + decoder_pos_embed -> decoder (a
          small Transformer of its own) -> decode_task_layer -> teacher features

The encoder is the engine's backbone, so a tokenizer run (the ``vq_tokenizer`` task, which
adds the teacher) trains like any other task and its checkpoint is an ordinary run
checkpoint. ``encode_ids`` is what MIM and VL pretraining use (``tokenizer.load_tokenizer``). Names follow BEiT v2's ``VQKD`` (``encode_task_layer``, ``quantize``,
``decode_task_layer``) so that ``convert.from_beit2`` maps its released weights 1:1.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from foundation.config import BackboneConfig
from foundation.transformer import Backbone
from foundation.embed import ViTFrontEnd
from foundation_tasks.vision_common.quantizer import NormEMAQuantizer
from foundation_tasks.vision_common.transforms import unnormalize


def task_layer(dim_in: int, dim_out: int) -> nn.Sequential:
    """BEiT v2's Linear - Tanh - Linear between the Transformers and the codebook."""
    layers = nn.Sequential(nn.Linear(dim_in, dim_in), nn.Tanh(), nn.Linear(dim_in, dim_out))
    for m in layers:
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            nn.init.zeros_(m.bias)
    return layers


def decoder_config(cfg: Any, backbone: BackboneConfig) -> BackboneConfig:
    """The decoder: the backbone's rule and width unless set, ``decoder_depth`` layers, no drop path."""
    dim = cfg.decoder_dim or backbone.dim
    heads = cfg.decoder_heads or (backbone.heads if dim == backbone.dim else max(1, dim // 64))
    return backbone.replace(dim=dim, heads=heads, depth=cfg.decoder_depth, ffn_dim=4 * dim if dim != backbone.dim
                            else backbone.ffn_dim, drop_path=0.0, rel_pos="none", rel_pos_grid=None)


def build_vqkd(cfg: Any, backbone: BackboneConfig, target_dim: int,
               teacher: Optional[Callable[[], nn.Module]] = None) -> "VQKDHead":
    """The head a ``vq_tokenizer`` task config (``cfg``) describes; ``teacher=None``: one
    that only encodes (the frozen tokenizer of MIM)."""
    return VQKDHead(backbone.dim, cfg.img_size, cfg.patch_size, decoder_config(cfg, backbone),
                    num_codes=cfg.num_codes, code_dim=cfg.code_dim, decay=cfg.decay, kmeans_init=cfg.kmeans_init,
                    target_dim=target_dim, rec_loss=cfg.rec_loss, input_norm=cfg.input_norm, teacher=teacher)


class VQKDHead(ViTFrontEnd):
    def __init__(self, dim: int, img_size: int, patch_size: int, decoder: BackboneConfig, *, num_codes: int = 8192,
                 code_dim: int = 32, decay: float = 0.99, kmeans_init: bool = True, target_dim: int = 512,
                 rec_loss: str = "cosine", input_norm: str = "imagenet",
                 teacher: Optional[Callable[[], nn.Module]] = None):
        super().__init__(dim, img_size, patch_size)
        self.encode_task_layer = task_layer(dim, code_dim)
        self.quantize = NormEMAQuantizer(num_codes, code_dim, decay=decay, kmeans_init=kmeans_init)
        self.decoder_embed = nn.Linear(code_dim, decoder.dim)  # BEiT v2: a 1x1 conv "patch embedding"
        self.decoder_cls_token = nn.Parameter(torch.zeros(1, 1, decoder.dim))
        self.decoder_pos_embed = nn.Parameter(torch.zeros(1, self.patch_embed.num_patches + 1, decoder.dim))
        nn.init.trunc_normal_(self.decoder_cls_token, std=0.02)
        nn.init.trunc_normal_(self.decoder_pos_embed, std=0.02)
        self.decoder = Backbone(decoder)
        self.decode_task_layer = task_layer(decoder.dim, target_dim)
        self.rec_loss, self.input_norm = rec_loss, input_norm
        # built on first use (rebuilding a checkpoint for encoding never loads CLIP); kept in
        # a list, not as a submodule, so it is not in the state dict
        self._make_teacher, self._teacher = teacher, []
        self.target_dim = target_dim

    @property
    def teacher(self) -> Optional[nn.Module]:
        if not self._teacher and self._make_teacher is not None:
            teacher = self._make_teacher()
            if teacher.out_dim != self.target_dim:
                raise ValueError(f"the teacher gives {teacher.out_dim}-d targets, the decoder predicts {self.target_dim}")
            self._teacher.append(teacher)
        return self._teacher[0] if self._teacher else None

    def no_weight_decay(self) -> set[str]:
        return super().no_weight_decay() | {"decoder_cls_token", "decoder_pos_embed"}

    def _input(self, images: torch.Tensor) -> torch.Tensor:
        """The encoder's input: our ImageNet-normalised images, or [-1, 1] for BEiT v2's weights."""
        return images if self.input_norm == "imagenet" else unnormalize(images) * 2 - 1

    def encode(self, backbone: nn.Module, images: torch.Tensor):
        """(quantised (B, N, d), ids (B, N), commitment loss)."""
        hidden = backbone(self.embed(self._input(images))[0])[:, 1:]  # final-normed patch tokens
        return self.quantize(self.encode_task_layer(hidden.float()))

    @torch.no_grad()
    def encode_ids(self, backbone: nn.Module, images: torch.Tensor) -> torch.Tensor:
        """Visual token ids (B, N) of images (B, 3, H, W), ImageNet-normalised."""
        z = self.encode_task_layer(backbone(self.embed(self._input(images))[0])[:, 1:].float())
        return self.quantize.nearest(F.normalize(z, dim=-1))

    def decode(self, quantized: torch.Tensor) -> torch.Tensor:
        x = self.decoder_embed(quantized)
        x = torch.cat([self.decoder_cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.decoder_pos_embed
        return self.decode_task_layer(self.decoder(x)[:, 1:])

    def reconstruction_loss(self, rec: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """Per patch: 1 - cosine (BEiT v2) or the mean squared error; averaged or summed over patches."""
        if self.rec_loss == "cosine":
            per_patch = 1 - F.cosine_similarity(rec.float(), target.float(), dim=-1)
        else:
            per_patch = (rec.float() - target.float()).pow(2).mean(-1)
        return per_patch.mean() if reduction == "mean" else per_patch.sum()

    def targets(self, images: torch.Tensor) -> torch.Tensor:
        if self.teacher is None:
            raise RuntimeError("this tokenizer was built without a teacher (as a frozen tokenizer); "
                               "it can encode images but not be trained")
        teacher = self.teacher.to(images.device)
        return teacher(images, self.grid)

    def forward(self, backbone: nn.Module, batch: dict[str, torch.Tensor]):
        images = batch["images"]
        target = self.targets(images)
        quantized, ids, commit = self.encode(backbone, images)
        rec = self.reconstruction_loss(self.decode(quantized), target)
        used = torch.unique(ids).numel() / self.quantize.num_codes
        return rec + commit, {"rec_loss": rec.detach(), "commit_loss": commit.detach(), "codes_in_batch": used}

