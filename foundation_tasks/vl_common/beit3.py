"""BEiT-3 on our multiway ``Backbone``: the architecture of torchscale 0.3.0's
``torchscale/model/BEiT3.py`` (the released BEiT-3 code).

BEiT-3 = a text embedding, a vision embedding (patches, a class token, a mask token for
masked image modeling) and one absolute position table per modality, then one multiway
Transformer over the concatenation ``[image tokens, text tokens]``: self-attention is
shared, every other module has a ``vision`` and a ``text`` expert (torchscale's A and B).

The engine owns the backbone and each task head owns what sits below and above it, so
the model comes in pieces:

* ``BEiT3Embedding``: token ids and/or pixels -> ``(x, padding_mask, segments)``, the
  backbone's inputs. Image-only input is all ``vision``, text-only all ``text``, a pair is
  ``[("vision", 1 + patches), ("text", L)]``; the text padding mask follows an all-False
  vision mask, and padded positions are zeroed by the backbone (as torchscale does).
* ``Pooler``: BEiT-3's class-token pooler (LayerNorm, dense, tanh) used by the VQA head.
* ``BEiT3``: embedding + backbone, the standalone model (``forward`` -> hidden states), a
  checkpoint kind of its own; the converters in ``foundation_tasks.vl_common.convert`` produce it.

Differences from torchscale, on purpose: position tables hold only the rows that are used
(torchscale's fairseq-style tables start at row 2, so ours are its rows ``2:``), and a
freshly built model is initialised BEiT-style (truncated normal, std 0.02, for tokens,
positions, class and mask tokens) instead of torchscale's N(0, dim^-1/2) tokens and
N(0, 1) positions; converted weights are of course taken as they are.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from foundation import checkpoint
from foundation.config import BackboneConfig, ConfigError, build
from foundation.embed import PatchEmbed
from foundation.transformer import Backbone

EXPERTS = ("vision", "text")  # torchscale's multiway A, B


def early_conv_stem(in_chans: int, dim: int, patch_size: int) -> nn.Sequential:
    """Xiao et al. 2021, "Early convolutions help transformers see better" (ViT_C): 3x3
    stride-2 conv + BatchNorm + ReLU stages down to the patch grid, then a 1x1 conv to
    ``dim``; a drop-in for the stride-``patch_size`` patchifying conv (a power of two)."""
    if patch_size < 2 or patch_size & (patch_size - 1):
        raise ConfigError(f"field 'conv_stem': needs a patch_size that is a power of two >= 2 (got {patch_size})")
    layers: list[nn.Module] = []
    channels = in_chans
    while patch_size > 1:
        layers += [nn.Conv2d(channels, dim, 3, 2, 1, bias=False), nn.BatchNorm2d(dim), nn.ReLU(inplace=True)]
        channels, patch_size = dim, patch_size // 2
    return nn.Sequential(*layers, nn.Conv2d(dim, dim, 1))


class BEiT3Embedding(nn.Module):
    """Text tokens, image patches and their positions -> the backbone's input."""

    def __init__(self, vocab_size: int, dim: int, img_size: int = 224, patch_size: int = 16,
                 in_chans: int = 3, text_positions: int = 1022, conv_stem: bool = False, text_std: float = 0.02):
        super().__init__()
        if img_size % patch_size:
            raise ConfigError(f"field 'img_size': {img_size} is not a multiple of patch_size={patch_size}")
        self.text_embed = nn.Embedding(vocab_size, dim)
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, dim)
        if conv_stem:  # same token grid, the patchifying conv replaced (patch_embed.proj.*)
            self.patch_embed.proj = early_conv_stem(in_chans, dim, patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.vision_pos = nn.Parameter(torch.zeros(1 + self.patch_embed.num_patches, dim))
        self.text_pos = nn.Parameter(torch.zeros(text_positions, dim))
        # BEiT's std 0.02 for all of them. torchscale's BEiT3 starts text rows at N(0, dim^-1/2) and
        # positions at N(0, 1) (nn.Embedding's default); on the tiny demo recipes (docs/
        # vision-language.md) its text init scores ~5 VQA points lower on the demo mix (though it
        # learns shape words faster on their own), its positions lower again.
        # ``text_std``: the VL configs' ``text_embed_std`` (BEiT's 0.02 by default)
        for p in (self.text_embed.weight, self.cls_token, self.mask_token, self.vision_pos, self.text_pos):
            nn.init.trunc_normal_(p, std=text_std if p is self.text_embed.weight else 0.02)

    @property
    def num_vision_tokens(self) -> int:
        """Class token + patches: where the text starts in a pair (torchscale's split position)."""
        return self.vision_pos.shape[0]

    @property
    def grid(self) -> tuple[int, int]:
        return tuple(self.patch_embed.grid_size)

    def vision(self, images: torch.Tensor, masked: torch.Tensor | None = None) -> torch.Tensor:
        """(B, C, H, W) -> (B, 1 + patches, dim); ``masked`` (B, patches) bool puts the mask
        token in place of those patches (masked image modeling)."""
        x = self.patch_embed(images)
        if masked is not None:
            if masked.shape != x.shape[:2]:
                raise ValueError(f"vision mask: expected (B, patches) = {tuple(x.shape[:2])}, got {tuple(masked.shape)}")
            x = torch.where(masked[..., None], self.mask_token.to(x.dtype), x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1).to(x.dtype), x], dim=1)
        return x + self.vision_pos

    def text(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, L) token ids -> (B, L, dim)."""
        L = ids.shape[1]
        if L > self.text_pos.shape[0]:
            raise ValueError(f"text of {L} tokens, but the position table has {self.text_pos.shape[0]} rows "
                             "(field 'text_positions')")
        return self.text_embed(ids) + self.text_pos[:L]

    def forward(
        self,
        text_ids: torch.Tensor | None = None,
        text_padding_mask: torch.Tensor | None = None,
        images: torch.Tensor | None = None,
        vision_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, list[tuple[str, int]]]:
        """``(x, padding_mask, segments)`` for ``backbone(x, padding_mask, segments=segments)``."""
        if text_ids is None and images is None:
            raise ValueError("BEiT3Embedding: give text_ids, images or both")
        parts, segments = [], []
        if images is not None:
            parts.append(self.vision(images, vision_mask))
            segments.append((EXPERTS[0], parts[-1].shape[1]))
        if text_ids is not None:
            parts.append(self.text(text_ids))
            segments.append((EXPERTS[1], text_ids.shape[1]))
        x = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
        padding = None
        if text_ids is not None and text_padding_mask is not None:
            if text_padding_mask.shape != text_ids.shape:
                raise ValueError(f"text_padding_mask: expected {tuple(text_ids.shape)}, got {tuple(text_padding_mask.shape)}")
            padding = text_padding_mask.bool()
            if images is not None:  # the image part is never padded
                padding = torch.cat([padding.new_zeros(x.shape[0], x.shape[1] - padding.shape[1]), padding], dim=1)
        return x, padding, segments

    def parts(self) -> dict[str, list[nn.Parameter]]:
        """Parameters by what uses them: text inputs, image inputs, masked image inputs."""
        return {"text": [self.text_embed.weight, self.text_pos],
                "vision": [*self.patch_embed.parameters(), self.cls_token, self.vision_pos],
                "mask": [self.mask_token]}

    def no_weight_decay(self) -> list[str]:
        """As BEiT-3 (positions, class token) plus the mask token."""
        return ["cls_token", "mask_token", "vision_pos", "text_pos"]


def encode(embed: BEiT3Embedding, backbone: nn.Module, return_layers=None, **inputs: Any):
    """Hidden states ``(B, T, dim)`` of the backbone over ``embed(**inputs)``; with
    ``return_layers``, ``(hidden states, {block: its output})`` as ``Backbone.forward``."""
    x, padding, segments = embed(**inputs)
    return backbone(x, padding, segments=segments, return_layers=return_layers)


POOLS = ("cls", "max")


def check_pool(pool: str) -> None:
    """The VL task configs' ``pool`` field: one line naming it and what it takes."""
    if pool not in POOLS:
        raise ConfigError(f"field 'pool': must be one of {', '.join(POOLS)} (got {pool!r})")


def image_summary(x: torch.Tensor, pool: str, num_vision_tokens: int) -> torch.Tensor:
    """(B, N, dim) -> (B, 1, dim): what a VL head reads of the image in ``encode``'s output
    (the image first: its class token, then its patches, then the text). ``cls``: the class
    token (BEiT-3); ``max``: the element-wise max over the patch tokens, as a CNN's global
    max pool, which learns small objects faster without per-patch labels (docs/vision-language.md)."""
    if pool == "cls":
        return x[:, :1]
    if pool == "max":
        return x[:, 1:num_vision_tokens].amax(1, keepdim=True)
    raise ValueError(f"pool must be one of {POOLS}, got {pool!r}")


class Pooler(nn.Module):
    """BEiT-3's pooler: LayerNorm, dense, tanh of the first (class) token."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.dense = nn.Linear(dim, dim)
        self.activation = nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(self.norm(x[:, 0])))


def init_head(module: nn.Module, scale: float = 1.0, std: float = 0.02) -> None:
    """BEiT-3's head init: truncated normal (std 0.02, cut at +-std) Linear weights, zero
    biases, unit LayerNorms; ``scale`` then multiplies every Linear (0.001 for the NLVR2
    head). ``std``: the VL configs' ``head_init_std`` (see ``foundation_tasks.vl_common.task``)."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=std, a=-std, b=std)
            nn.init.zeros_(m.bias)
            if scale != 1.0:
                with torch.no_grad():
                    m.weight.mul_(scale)
        elif isinstance(m, nn.LayerNorm):
            m.reset_parameters()


def resize_vision_pos(table: torch.Tensor, grid: Sequence[int]) -> torch.Tensor:
    """A (1 + h*w, dim) vision position table resized (bicubic) to another patch grid, the
    class-token row kept, as BEiT-3 does when it fine-tunes at a higher resolution."""
    n = table.shape[0] - 1
    side = int(round(n ** 0.5))
    if side * side != n:
        raise ValueError(f"vision position table of {n} patch rows is not a square grid")
    h, w = grid
    if (side, side) == (h, w):
        return table
    patches = table[1:].reshape(1, side, side, -1).permute(0, 3, 1, 2).float()
    patches = F.interpolate(patches, size=(h, w), mode="bicubic", align_corners=False)
    return torch.cat([table[:1], patches.permute(0, 2, 3, 1).reshape(h * w, -1).to(table.dtype)])


# --------------------------------------------------------------------------- the standalone model


@dataclass
class BEiT3Config:
    """The standalone BEiT-3: its backbone (multiway, experts ``["vision", "text"]``) and
    the embedding sizes. ``text_positions`` = torchscale's ``max_source_positions`` - 2."""

    backbone: BackboneConfig = field(default_factory=lambda: BackboneConfig(experts=list(EXPERTS)))
    vocab_size: int = 64010
    img_size: int = 224
    patch_size: int = 16
    in_chans: int = 3
    text_positions: int = 1022

    def __post_init__(self) -> None:
        if list(self.backbone.experts) != list(EXPERTS):
            raise ConfigError(f"field 'backbone.experts': BEiT-3 needs {list(EXPERTS)} (got {self.backbone.experts!r})")
        for name in ("vocab_size", "img_size", "patch_size", "in_chans", "text_positions"):
            if getattr(self, name) < 1:
                raise ConfigError(f"field {name!r}: must be >= 1 (got {getattr(self, name)!r})")

    @classmethod
    def from_dict(cls, data: dict, where: str = "BEiT3 config") -> "BEiT3Config":
        return build(cls, data, where=where)


class BEiT3(nn.Module):
    """``BEiT3(config)(text_ids=, text_padding_mask=, images=, vision_mask=)`` -> (B, T, dim)
    hidden states, image tokens first (``num_vision_tokens`` of them) when images are given."""

    def __init__(self, config: BEiT3Config):
        super().__init__()
        self.config = config
        self.embed = BEiT3Embedding(config.vocab_size, config.backbone.dim, config.img_size, config.patch_size,
                                    config.in_chans, config.text_positions)
        self.backbone = Backbone(config.backbone)

    @property
    def num_vision_tokens(self) -> int:
        return self.embed.num_vision_tokens

    def forward(self, text_ids=None, text_padding_mask=None, images=None, vision_mask=None, return_layers=None):
        x, padding, segments = self.embed(text_ids, text_padding_mask, images, vision_mask)
        return self.backbone(x, padding, segments=segments, return_layers=return_layers)


checkpoint.register_model_kind("BEiT3", BEiT3, BEiT3Config, BEiT3Config.from_dict)
