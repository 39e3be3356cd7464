"""Vision Transformer around the shared backbone, with timm's model interface
(``forward_features`` / ``forward_head`` / ``forward_intermediates``) so that timm,
mmseg and our tasks can all use it. ``norm="preln"`` is ViT; ``norm="magneto"`` is the
Magneto vision model of the paper's Sec. 5."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Mapping, Optional, Union

import torch
from omegaconf import OmegaConf
from timm.layers import resample_abs_pos_embed
from timm.models._features import feature_take_indices
from timm.models.vision_transformer import global_pool_nlc
from torch import nn

from foundation import checkpoint
from foundation.config import BackboneConfig, ConfigError, build, read_yaml, to_dict
from foundation.embed import ViTFrontEnd
from foundation.transformer import Backbone


POOLS = ("token", "avg", "max", "avgmax", "")  # timm's names; "" = no pooling (per-token head)


@dataclass
class ViTConfig:
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    img_size: int = 224
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    global_pool: str = "token"  # token (class token) | avg (mean of patch tokens) | max | avgmax | ""
    class_token: bool = True
    abs_pos_embed: bool = True  # learned absolute position embedding (ViT); BEiT uses rel_pos="2d"
    fc_norm: bool = False  # LayerNorm after pooling (BEiT's mean-pooled fine-tuning head)
    dynamic_img_size: bool = False  # accept other image sizes (position embedding resampled)

    def __post_init__(self) -> None:
        if self.global_pool not in POOLS:
            raise ConfigError(f"field 'global_pool': must be one of {', '.join(map(repr, POOLS))} "
                              f"(got {self.global_pool!r})")
        if self.global_pool == "token" and not self.class_token:
            raise ConfigError("field 'global_pool': 'token' pooling needs class_token=true")
        if self.img_size % self.patch_size:
            raise ConfigError(f"field 'img_size': {self.img_size} is not a multiple of patch_size={self.patch_size}")

    @property
    def grid(self) -> tuple[int, int]:
        return (self.img_size // self.patch_size,) * 2

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "vit config") -> "ViTConfig":
        data = dict(data)
        backbone = data.pop("backbone", None)
        cfg = build(cls, data, where=where)
        if isinstance(backbone, BackboneConfig):
            cfg.backbone = backbone
        elif backbone is not None:
            # from the given fields alone: merged over the default section, derived fields
            # (ffn_dim = 4 * dim) would keep the default's value (3072 for any dim)
            cfg.backbone = build(BackboneConfig, backbone, where=f"{where}: backbone")
        return cfg

    @classmethod
    def from_yaml(cls, path, overrides=None) -> "ViTConfig":
        data = read_yaml(path, overrides or ())
        return cls.from_dict(OmegaConf.to_container(data), where=str(path))

    def to_dict(self) -> dict:
        return to_dict(self)


class VisionTransformer(ViTFrontEnd):
    """timm's ``VisionTransformer`` interface over our backbone: ``forward_features``,
    ``forward_head``, ``forward_intermediates`` (timm's signature), ``feature_info``,
    ``prune_intermediate_layers``, ``set_grad_checkpointing``, ``group_matcher``,
    ``no_weight_decay``, ``reset_classifier``. The front end (``patch_embed``, ``cls_token``,
    ``pos_embed``, ``embed``) is ``foundation.embed.ViTFrontEnd``, the one the vision heads use."""

    def __init__(self, config: ViTConfig):
        cfg = config
        prefix = 1 if cfg.class_token else 0
        if cfg.backbone.rel_pos == "2d" and (
            list(cfg.backbone.rel_pos_grid) != list(cfg.grid) or cfg.backbone.rel_pos_prefix != prefix
        ):
            raise ConfigError(
                f"backbone.rel_pos_grid {cfg.backbone.rel_pos_grid} / rel_pos_prefix {cfg.backbone.rel_pos_prefix} "
                f"must match the patch grid {list(cfg.grid)} and {prefix} class token(s)"
            )
        dim = cfg.backbone.dim
        # the class token and positions are drawn after the backbone (init_front_end below),
        # the order of random draws that seeded runs depend on
        super().__init__(dim, cfg.img_size, cfg.patch_size, cfg.in_chans, class_token=cfg.class_token,
                         abs_pos_embed=cfg.abs_pos_embed, dynamic_img_size=cfg.dynamic_img_size, init=False)
        self.config = cfg
        self.num_features = self.embed_dim = dim
        self.num_classes = cfg.num_classes
        self.global_pool = cfg.global_pool
        self.has_class_token = cfg.class_token
        self.backbone = Backbone(cfg.backbone)
        self.fc_norm = nn.LayerNorm(dim, eps=cfg.backbone.layernorm_eps) if cfg.fc_norm else nn.Identity()
        self.head = nn.Linear(dim, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()
        reduction = self.patch_embed.patch_size[0]
        # what timm's features_only wrapper reports: one entry per block
        self.feature_info = [dict(module=f"backbone.encoder.layers.{i}", num_chs=dim, reduction=reduction)
                             for i in range(cfg.backbone.depth)]
        self.init_front_end()
        if isinstance(self.head, nn.Linear):
            nn.init.trunc_normal_(self.head.weight, std=0.02)
            nn.init.zeros_(self.head.bias)

    @property
    def blocks(self) -> nn.ModuleList:
        return self.backbone.encoder.layers

    @staticmethod
    def _mask(x: torch.Tensor, attn_mask: Optional[torch.Tensor], is_causal: bool) -> Optional[torch.Tensor]:
        if not is_causal:
            return attn_mask
        T = x.shape[1]
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)  # True = masked out
        if attn_mask is None:
            return causal
        if attn_mask.dtype == torch.bool:
            return attn_mask | causal
        return attn_mask.masked_fill(causal, float("-inf"))

    def forward_features(self, images: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
                         is_causal: bool = False) -> torch.Tensor:
        x = self.embed(images)[0]
        return self.backbone(x, attn_mask=self._mask(x, attn_mask, is_causal))

    def pool(self, x: torch.Tensor, pool_type: Optional[str] = None) -> torch.Tensor:
        return global_pool_nlc(x, pool_type=self.global_pool if pool_type is None else pool_type,
                               num_prefix_tokens=self.num_prefix_tokens)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.fc_norm(self.pool(x))
        return x if pre_logits else self.head(x)

    def forward(self, images: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
                is_causal: bool = False) -> torch.Tensor:
        return self.forward_head(self.forward_features(images, attn_mask, is_causal))

    def forward_intermediates(
        self,
        images: torch.Tensor,
        indices: Optional[Union[int, List[int]]] = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
        output_dict: bool = False,
        attn_mask: Optional[torch.Tensor] = None,
        is_causal: bool = False,
    ):
        """timm's contract and signature: ``indices`` an int (last n blocks), a list of block
        indices (negative from the end) or None (all); returns ``(final_features,
        [intermediate, ...])``, only the list, or timm's dict (``output_dict``). Intermediates
        are (B, D, H, W) for "NCHW" or (B, H*W, D) for "NLC"; ``norm`` applies the final LN;
        ``stop_early`` skips the blocks after the last one asked for."""
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be NCHW or NLC, got {output_fmt!r}")
        take, _ = feature_take_indices(len(self.blocks), indices)
        x, (H, W) = self.embed(images)
        final, hidden = self.backbone(x, attn_mask=self._mask(x, attn_mask, is_causal), return_layers=take,
                                      stop_early=stop_early)
        final_norm = self.backbone.encoder.norm
        outs, prefixes = [], []
        for i in take:
            h = hidden[i]
            if norm and final_norm is not None:
                h = final_norm(h)
            prefixes.append(h[:, : self.num_prefix_tokens])
            h = h[:, self.num_prefix_tokens:]
            if output_fmt == "NCHW":
                h = h.reshape(h.shape[0], H, W, -1).permute(0, 3, 1, 2).contiguous()
            outs.append(h)
        if output_dict:
            out = {"image_intermediates": outs}
            if return_prefix_tokens and self.num_prefix_tokens:
                out["image_intermediates_prefix"] = prefixes
            if not intermediates_only:
                out["image_features"] = final
            return out
        if return_prefix_tokens and self.num_prefix_tokens:
            outs = list(zip(outs, prefixes))
        return outs if intermediates_only else (final, outs)

    def prune_intermediate_layers(self, indices: Union[int, List[int]] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> List[int]:
        """Drop the blocks after the last of ``indices`` (and the final norm / head), as timm's
        ViT does for ``features_only`` models; returns the absolute indices kept."""
        take, max_index = feature_take_indices(len(self.blocks), indices)
        self.backbone.encoder.layers = self.blocks[: max_index + 1]
        self.feature_info = self.feature_info[: max_index + 1]
        if prune_norm:
            self.backbone.encoder.norm = None
        if prune_head:
            self.fc_norm = nn.Identity()
            self.reset_classifier(0, "")
        return take

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        if global_pool is not None:
            if global_pool not in POOLS or (global_pool == "token" and not self.has_class_token):
                raise ValueError(f"global_pool: must be one of {POOLS} ('token' needs the class token), "
                                 f"got {global_pool!r}")
            self.global_pool = self.config.global_pool = global_pool
        self.num_classes = self.config.num_classes = num_classes
        self.head = nn.Linear(self.embed_dim, num_classes) if num_classes > 0 else nn.Identity()

    def get_classifier(self) -> nn.Module:
        return self.head

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Activation checkpointing of every block in training (``backbone.checkpoint_activations``)."""
        self.config.backbone.checkpoint_activations = enable
        self.backbone.encoder.checkpointing = enable

    @property
    def grad_checkpointing(self) -> bool:
        return self.backbone.encoder.checkpointing

    def no_weight_decay(self) -> set[str]:
        """Names timm's optimizer factory keeps out of weight decay (1-d tensors are anyway)."""
        names = {"pos_embed", "cls_token"}
        if self.backbone.encoder.rel_pos is not None:
            names.add("backbone.encoder.rel_pos.table")
        return names

    def group_matcher(self, coarse: bool = False) -> dict:
        """Parameter groups by depth for timm's layer-wise lr decay: the front end, one group
        per block, the final norm with the last block."""
        return dict(
            stem=r"^cls_token|^pos_embed|^patch_embed|^backbone\.encoder\.rel_pos",
            blocks=[(r"^backbone\.encoder\.layers\.(\d+)", None), (r"^backbone\.encoder\.norm", (99999,))],
        )


# --------------------------------------------------------------------------- timm registry
# `import foundation` registers these, so `timm.create_model("magneto_base_patch16_224")`
# works like any timm model, with timm's keywords, `features_only=True` and
# `pretrained=True, pretrained_cfg_overlay=dict(file="model.safetensors")` for a file written
# by `foundation.checkpoint.save` / `foundation export timm` (its architecture then is the
# default, the keywords override it). Sizes are ViT's (DeiT for tiny/small): FFN 4 x dim;
# Magneto adds two Sub-LN LayerNorms per block. `preln_*` are the Pre-LN (ViT) twins.
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model  # noqa: E402

_SIZES = {"tiny": (192, 12, 3), "small": (384, 12, 6), "base": (768, 12, 12), "large": (1024, 24, 16)}
# timm keyword -> our backbone field
_BACKBONE_KW = {"embed_dim": "dim", "depth": "depth", "num_heads": "heads", "qkv_bias": "qkv_bias",
                "drop_path_rate": "drop_path", "proj_drop_rate": "dropout", "attn_drop_rate": "attn_dropout",
                "init_values": "layer_scale"}
# timm keywords whose default value we already are; anything else is refused
_TIMM_DEFAULTS = {"drop_rate": 0.0, "pos_drop_rate": 0.0, "patch_drop_rate": 0.0, "reg_tokens": 0,
                  "no_embed_class": False, "pre_norm": False, "qk_norm": False, "weight_init": ""}


def _timm_cfg(**kw):
    return {
        "url": "", "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": None,
        "crop_pct": 0.9, "interpolation": "bicubic", "fixed_input_size": True,
        "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225),
        "first_conv": "patch_embed.proj", "classifier": "head", "license": "mit", **kw,
    }


def _name_config(norm: str, size: str) -> dict:
    dim, depth, heads = _SIZES[size]
    # the Pre-LN twin is timm's ViT exactly (LayerNorm eps 1e-6); Magneto keeps torchscale's 1e-5
    eps = 1e-6 if norm == "preln" else 1e-5
    return dict(backbone=dict(dim=dim, depth=depth, heads=heads, norm=norm, layernorm_eps=eps), patch_size=16,
                img_size=224)


def _file_config(path: str, variant: str) -> Optional[dict]:
    """The ViT config a pretrained file was saved with (None for a plain state dict)."""
    from safetensors import safe_open

    if not str(path).endswith(".safetensors"):
        return None
    with safe_open(str(path), framework="pt") as f:
        kind = (f.metadata() or {}).get(checkpoint.META_KIND)
    if kind is None:
        return None
    if kind != "VisionTransformer":
        raise ValueError(f"{path}: a {kind} checkpoint, not a ViT; for a classification run write a timm file "
                         f"first: foundation export timm RUN_DIR --out model.safetensors")
    cfg = checkpoint.read_config(path)[1].to_dict()
    if cfg["backbone"]["norm"] != variant.split("_")[0]:
        raise ValueError(f"{path}: a norm={cfg['backbone']['norm']!r} ViT; create it as "
                         f"{cfg['backbone']['norm']}_{variant.split('_', 1)[1]}, not {variant}")
    return cfg


def _config_from_timm_kwargs(base: dict, name: str, kwargs: dict, from_file: bool) -> ViTConfig:
    """timm's create_model keywords over a base config (the name's sizes or a file's config)."""
    cfg = {**base, "backbone": dict(base["backbone"])}
    bb = cfg["backbone"]
    ratio = bb["ffn_dim"] / bb["dim"] if bb.get("ffn_dim") else 4.0
    for key, ours in _BACKBONE_KW.items():
        if key in kwargs:
            bb[ours] = kwargs.pop(key)
    bb["ffn_dim"] = int(bb["dim"] * kwargs.pop("mlp_ratio", ratio))
    for key, default in _TIMM_DEFAULTS.items():
        if key in kwargs and kwargs.pop(key) != default:
            raise TypeError(f"{name}: keyword {key!r} is not supported (only {default!r})")
    fc_norm, final_norm = kwargs.pop("fc_norm", None), kwargs.pop("final_norm", None)
    for key in [k for k in kwargs if k in ViTConfig.__dataclass_fields__ and k != "backbone"]:
        cfg[key] = kwargs.pop(key)
    if not from_file:
        # timm's placement: pooled heads (avg, max) normalise after pooling instead of before
        use_fc = fc_norm if fc_norm is not None else cfg.get("global_pool", "token") in ("avg", "max", "avgmax")
        final = True if final_norm is None else final_norm
        cfg["fc_norm"], bb["final_norm"] = final and use_fc, final and not use_fc
    else:  # a file keeps its own norms unless told
        cfg["fc_norm"] = cfg["fc_norm"] if fc_norm is None else fc_norm
        bb["final_norm"] = bb["final_norm"] if final_norm is None else final_norm
    bb.update(kwargs.pop("backbone", None) or {})  # our own fields, for what timm has no keyword for
    for key in ("img_size", "patch_size"):  # timm passes (H, W) pairs
        if isinstance(cfg.get(key), (tuple, list)):
            if len(set(cfg[key])) != 1:
                raise ValueError(f"{name}: {key}: square only, got {tuple(cfg[key])}")
            cfg[key] = cfg[key][0]
    if kwargs:
        raise TypeError(f"{name}: unexpected keyword(s) {sorted(kwargs)}")
    return ViTConfig.from_dict(cfg, where=name)


def _filter_pretrained(state: dict, model: VisionTransformer) -> dict:
    """A file's tensors for ``model``: the position embedding resampled to the model's grid;
    anything else that does not fit is an error naming it (never a silent half-load)."""
    state = dict(state)
    pos = state.get("pos_embed")
    if pos is not None and model.pos_embed is not None and pos.shape != model.pos_embed.shape:
        state["pos_embed"] = resample_abs_pos_embed(pos, list(model.patch_embed.grid_size),
                                                    num_prefix_tokens=model.num_prefix_tokens)
    own = model.state_dict()
    body = [k for k in own if not k.startswith("head.")]  # timm itself replaces a head of another size
    missing = [k for k in body if k not in state]
    unexpected = [k for k in state if k not in own]
    wrong = [f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}" for k in body
             if k in state and state[k].shape != own[k].shape]
    if missing or unexpected or wrong:
        parts = [f"{what}: {', '.join(keys[:6])}{' ...' if len(keys) > 6 else ''}"
                 for what, keys in (("missing", missing), ("unexpected", unexpected), ("shape", wrong)) if keys]
        raise ValueError(f"pretrained file does not fit this model ({'; '.join(parts)}); pass the sizes it was "
                         "trained with (embed_dim, depth, num_heads, patch_size, ...) or load a file written by "
                         "foundation.checkpoint.save / foundation export timm")
    return state


def _create(variant: str, pretrained: bool, **kwargs) -> VisionTransformer:
    norm, size = variant.split("_")[:2]
    overlay = dict(kwargs.pop("pretrained_cfg_overlay", None) or {})
    pretrained_cfg = kwargs.pop("pretrained_cfg", None)
    file = overlay.get("file") or (pretrained_cfg or {}).get("file") if pretrained else None
    base = _file_config(file, variant) if file else None
    if base is not None:  # timm's defaults for num_classes / img_size then are the file's
        overlay.setdefault("num_classes", base["num_classes"])
        overlay.setdefault("input_size", (base["in_chans"], base["img_size"], base["img_size"]))
    start = base if base is not None else _name_config(norm, size)
    return build_model_with_cfg(
        lambda **kw: VisionTransformer(_config_from_timm_kwargs(start, variant, kw, base is not None)),
        variant, pretrained, pretrained_cfg=pretrained_cfg, pretrained_cfg_overlay=overlay,
        pretrained_strict=True, pretrained_filter_fn=_filter_pretrained,
        feature_cfg=dict(out_indices=kwargs.pop("out_indices", 3), feature_cls="getter"), **kwargs,
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


# saveable / loadable by foundation.checkpoint (a file names this module, so it loads with no import first)
checkpoint.register_model_kind("VisionTransformer", VisionTransformer, ViTConfig, ViTConfig.from_dict)
