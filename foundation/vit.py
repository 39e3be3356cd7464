"""Vision Transformer around the shared backbone, with timm's model interface
(``forward_features`` / ``forward_head`` / ``forward_intermediates``) so that timm,
mmseg and our tasks can all use it. ``norm="preln"`` is ViT; ``norm="magneto"`` is the
Magneto vision model of the paper's Sec. 5."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Union

import torch
from timm.layers import resample_abs_pos_embed
from torch import nn

from foundation.config import BackboneConfig, ConfigError, build, load_yaml, to_dict
from foundation.embed import PatchEmbed
from foundation.transformer import Backbone


@dataclass
class ViTConfig:
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    img_size: int = 224
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    global_pool: str = "token"  # token (class token) | avg (mean of patch tokens)
    class_token: bool = True
    abs_pos_embed: bool = True  # learned absolute position embedding (ViT); BEiT uses rel_pos="2d"
    fc_norm: bool = False  # LayerNorm after pooling (BEiT's mean-pooled fine-tuning head)
    dynamic_img_size: bool = False  # accept other image sizes (position embedding resampled)

    def __post_init__(self) -> None:
        if self.global_pool not in ("token", "avg"):
            raise ConfigError(f"field 'global_pool': must be token or avg (got {self.global_pool!r})")
        if self.global_pool == "token" and not self.class_token:
            raise ConfigError("field 'global_pool': 'token' pooling needs class_token=true")
        if self.img_size % self.patch_size:
            raise ConfigError(f"field 'img_size': {self.img_size} is not a multiple of patch_size={self.patch_size}")

    @property
    def grid(self) -> tuple[int, int]:
        return (self.img_size // self.patch_size,) * 2

    @classmethod
    def from_dict(cls, data: dict, where: str = "vit config") -> "ViTConfig":
        return build(cls, data, where=where)

    @classmethod
    def from_yaml(cls, path, overrides=None) -> "ViTConfig":
        return load_yaml(cls, path, overrides)

    def to_dict(self) -> dict:
        return to_dict(self)


class VisionTransformer(nn.Module):
    def __init__(self, config: ViTConfig):
        super().__init__()
        self.config = cfg = config
        dim = cfg.backbone.dim
        self.num_features = self.embed_dim = dim
        self.num_prefix_tokens = 1 if cfg.class_token else 0
        if cfg.backbone.rel_pos == "2d" and (
            list(cfg.backbone.rel_pos_grid) != list(cfg.grid) or cfg.backbone.rel_pos_prefix != self.num_prefix_tokens
        ):
            raise ConfigError(
                f"backbone.rel_pos_grid {cfg.backbone.rel_pos_grid} / rel_pos_prefix {cfg.backbone.rel_pos_prefix} "
                f"must match the patch grid {list(cfg.grid)} and {self.num_prefix_tokens} class token(s)"
            )
        self.patch_embed = PatchEmbed(
            img_size=cfg.img_size, patch_size=cfg.patch_size, in_chans=cfg.in_chans, embed_dim=dim,
            strict_img_size=not cfg.dynamic_img_size, output_fmt="NHWC" if cfg.dynamic_img_size else None,
            flatten=not cfg.dynamic_img_size,
        )
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if cfg.class_token else None
        n_pos = self.patch_embed.num_patches + self.num_prefix_tokens
        self.pos_embed = nn.Parameter(torch.zeros(1, n_pos, dim)) if cfg.abs_pos_embed else None
        self.backbone = Backbone(cfg.backbone)
        self.fc_norm = nn.LayerNorm(dim, eps=cfg.backbone.layernorm_eps) if cfg.fc_norm else nn.Identity()
        self.head = nn.Linear(dim, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()
        for p in (self.cls_token, self.pos_embed):
            if p is not None:
                nn.init.trunc_normal_(p, std=0.02)
        if isinstance(self.head, nn.Linear):
            nn.init.trunc_normal_(self.head.weight, std=0.02)
            nn.init.zeros_(self.head.bias)

    def embed(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """Pixels -> tokens ``(B, prefix + H*W, D)`` with position embedding, and (H, W)."""
        if images.dim() != 4 or images.shape[1] != self.config.in_chans:
            raise ValueError(f"images: expected (B, {self.config.in_chans}, H, W), got {tuple(images.shape)}")
        x = self.patch_embed(images)
        if self.config.dynamic_img_size:
            B, H, W, D = x.shape
            x = x.reshape(B, H * W, D)
        else:
            H, W = self.patch_embed.grid_size
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        if self.pos_embed is not None:
            pos = self.pos_embed
            if (H, W) != tuple(self.patch_embed.grid_size):
                pos = resample_abs_pos_embed(pos, (H, W), num_prefix_tokens=self.num_prefix_tokens)
            x = x + pos
        return x, (H, W)

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        return self.backbone(self.embed(images)[0])

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = x[:, 0] if self.config.global_pool == "token" else x[:, self.num_prefix_tokens:].mean(1)
        x = self.fc_norm(x)
        return x if pre_logits else self.head(x)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(images))

    def forward_intermediates(
        self,
        images: torch.Tensor,
        indices: Optional[Union[int, List[int]]] = None,
        norm: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
        return_prefix_tokens: bool = False,
    ):
        """timm's contract: ``indices`` an int (last n blocks) or a list of block indices;
        returns ``(final_features, [intermediate, ...])`` or just the list. Intermediates are
        (B, D, H, W) for "NCHW" or (B, H*W, D) for "NLC"; ``norm`` applies the final LN."""
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be NCHW or NLC, got {output_fmt!r}")
        depth = self.config.backbone.depth
        if indices is None:
            indices = list(range(depth))
        elif isinstance(indices, int):
            indices = list(range(depth - indices, depth))
        x, (H, W) = self.embed(images)
        final, hidden = self.backbone(x, return_layers=indices)
        final_norm = self.backbone.encoder.norm
        outs, prefixes = [], []
        for i in indices:
            h = hidden[i]
            if norm and final_norm is not None:
                h = final_norm(h)
            prefixes.append(h[:, : self.num_prefix_tokens])
            h = h[:, self.num_prefix_tokens:]
            if output_fmt == "NCHW":
                h = h.reshape(h.shape[0], H, W, -1).permute(0, 3, 1, 2).contiguous()
            outs.append(h)
        if return_prefix_tokens:
            outs = list(zip(outs, prefixes))
        return outs if intermediates_only else (final, outs)

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        if global_pool is not None:
            self.config.global_pool = global_pool
        self.config.num_classes = num_classes
        self.head = nn.Linear(self.embed_dim, num_classes) if num_classes > 0 else nn.Identity()

    def get_classifier(self) -> nn.Module:
        return self.head


# --------------------------------------------------------------------------- timm registry
# `import foundation` registers these, so `timm.create_model("magneto_base_patch16_224")`
# works like any timm model, including `pretrained=True,
# pretrained_cfg_overlay=dict(file="our.safetensors")` (timm reads safetensors itself).
# Sizes are ViT's (DeiT for tiny/small); `preln_*` are the Pre-LN (ViT) twins.
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model  # noqa: E402

_SIZES = {"tiny": (192, 12, 3), "small": (384, 12, 6), "base": (768, 12, 12), "large": (1024, 24, 16)}


def _timm_cfg(**kw):
    return {
        "url": "", "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": None,
        "crop_pct": 0.9, "interpolation": "bicubic", "fixed_input_size": True,
        "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225),
        "first_conv": "patch_embed.proj", "classifier": "head", "license": "mit", **kw,
    }


def _build_from_timm_kwargs(norm: str, size: str, **kwargs) -> VisionTransformer:
    """timm's create_model keywords -> our config (unknown keywords are errors)."""
    dim, depth, heads = _SIZES[size]
    backbone = dict(dim=dim, depth=depth, heads=heads, norm=norm,
                    drop_path=kwargs.pop("drop_path_rate", 0.0), dropout=kwargs.pop("drop_rate", 0.0),
                    attn_dropout=kwargs.pop("attn_drop_rate", 0.0), layer_scale=kwargs.pop("init_values", None))
    backbone.update(kwargs.pop("backbone", {}))
    vit = {k: kwargs.pop(k) for k in list(kwargs) if k in ViTConfig.__dataclass_fields__}
    size_in = vit.get("img_size")
    if isinstance(size_in, (tuple, list)):  # timm passes (H, W) from the pretrained cfg
        if len(set(size_in)) != 1:
            raise ValueError(f"img_size: square images only, got {tuple(size_in)}")
        vit["img_size"] = size_in[0]
    if kwargs:
        raise TypeError(f"{norm}_{size}_patch16_224: unexpected keyword(s) {sorted(kwargs)}")
    return VisionTransformer(ViTConfig.from_dict(dict(backbone=backbone, patch_size=16, **vit)))


def _create(variant: str, pretrained: bool, **kwargs) -> VisionTransformer:
    norm, size = variant.split("_")[:2]
    kwargs.pop("pretrained_cfg", None)
    return build_model_with_cfg(
        lambda **kw: _build_from_timm_kwargs(norm, size, **kw), variant, pretrained,
        pretrained_strict=True, feature_cfg=dict(out_indices=3, feature_cls="getter"), **kwargs,
    )


default_cfgs = generate_default_cfgs(
    {f"{norm}_{size}_patch16_224": _timm_cfg() for norm in ("magneto", "preln") for size in _SIZES}
)


def _factory(name: str):
    def create(pretrained: bool = False, **kwargs) -> VisionTransformer:
        return _create(name, pretrained, **kwargs)

    create.__name__ = name
    create.__doc__ = f"{name}: {'Magneto (Sub-LN + gamma init)' if name.startswith('magneto') else 'Pre-LN (ViT)'} " \
                     f"{name.split('_')[1]}, patch 16, 224x224."
    create.__module__ = __name__
    return register_model(create)


for _norm in ("magneto", "preln"):
    for _size in _SIZES:
        globals()[f"{_norm}_{_size}_patch16_224"] = _factory(f"{_norm}_{_size}_patch16_224")
