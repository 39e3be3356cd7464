"""Our ViT in mmsegmentation's registries: ``MagnetoViT`` (backbone) and
``MagnetoLayerDecayOptimizerConstructor`` (BEiT's layer-wise lr decay for it).

An mmseg user writes, in an mmseg config::

    custom_imports = dict(imports=['foundation_tasks.segmentation.mmseg_backbone'], allow_failed_imports=False)
    model = dict(backbone=dict(type='MagnetoViT', norm='magneto', ...), ...)
    optim_wrapper = dict(constructor='MagnetoLayerDecayOptimizerConstructor',
                         paramwise_cfg=dict(num_layers=12, layer_decay_rate=0.9), ...)

``MagnetoViT`` takes mmseg ``BEiT``'s arguments (so ``type='BEiT'`` -> ``type='MagnetoViT'``
on top of ``_base_/models/upernet_beit.py`` works as is) plus ``norm`` (magneto | preln |
postln | deepnorm) and returns what BEiT returns: a tuple of (B, C, H/p, W/p) maps, one per
``out_indices`` block, ready for ``Feature2Pyramid``. Differences from BEiT, by design:
one relative position table shared by all blocks (BEiT's ``shared_rel_pos_bias``),
biases on q, k and v (BEiT: q and v), exact GELU, LayerNorm eps from ``norm_cfg``.

mmseg's inference APIs work on these configs as on its own, from a program's first line::

    from mmseg.apis import MMSegInferencer, inference_model, init_model
    model = init_model('configs/segmentation/mmseg/tiny-magneto_upernet_demo-48x48.py', 'iter_2000.pth')
    result = inference_model(model, 'demo.jpg')

(``custom_imports`` in the config brings this module in; on mmcv-lite the start-up hook
``foundation_mmseg.pth``, see ``mmseg_autoinstall``, readies ``mmcv.ops`` before mmseg's
first import; with full mmcv nothing is needed). Importing this module installs the
mmcv-lite compatibility step too (mmseg_compat), for programs that import it first.
"""
from __future__ import annotations

import json
from typing import Sequence

import torch
from torch import nn

from foundation_tasks.segmentation import mmseg_compat

mmseg_compat.install()

from mmengine.dist import get_dist_info  # noqa: E402
from mmengine.logging import print_log  # noqa: E402
from mmengine.optim import DefaultOptimWrapperConstructor  # noqa: E402
from mmseg.registry import MODELS, OPTIM_WRAPPER_CONSTRUCTORS  # noqa: E402

from foundation.config import BackboneConfig  # noqa: E402
from foundation.vit import VisionTransformer, ViTConfig  # noqa: E402
from foundation_tasks.segmentation.pretrained import load_vit_weights  # noqa: E402

NO_WEIGHT_DECAY = ("pos_embed", "cls_token", "rel_pos.table")


def _square(size, name: str) -> int:
    if isinstance(size, int):
        return size
    size = tuple(size)
    if len(size) != 2 or size[0] != size[1]:
        raise ValueError(f"MagnetoViT: {name} must be square, got {size}")
    return size[0]


@MODELS.register_module()
class MagnetoViT(VisionTransformer):
    """``foundation.vit.VisionTransformer`` as an mmseg backbone (see the module docstring).

    Parameter names are VisionTransformer's (``patch_embed.*``, ``cls_token``,
    ``pos_embed``, ``backbone.encoder.layers.{i}.*``), so our VisionTransformer and MIM
    checkpoints load with ``pretrained='x.safetensors'`` (or ``init_cfg=dict(type=
    'Pretrained', checkpoint='x.safetensors')``), position tables resized to ``img_size``.
    """

    def __init__(
        self,
        norm: str = "magneto",
        img_size: int | Sequence[int] = 640,
        patch_size: int = 16,
        in_channels: int = 3,
        embed_dims: int = 768,
        num_layers: int = 12,
        num_heads: int = 12,
        mlp_ratio: float = 4,
        out_indices: Sequence[int] | int = (3, 5, 7, 11),
        qv_bias: bool = True,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.1,
        init_values: float | None = 0.1,
        rel_pos: bool = True,  # BEiT's 2-d relative position bias
        abs_pos_embed: bool = False,  # ViT's learned absolute position embedding
        final_norm: bool = False,
        norm_cfg: dict | None = None,
        act_cfg: dict | None = None,
        patch_norm: bool = False,
        num_fcs: int = 2,
        norm_eval: bool = False,
        backbone: dict | None = None,  # further BackboneConfig fields (e.g. init_variant)
        pretrained: str | None = None,
        init_cfg: dict | None = None,
    ):
        norm_cfg = dict(norm_cfg or {"type": "LN", "eps": 1e-6})
        act_cfg = dict(act_cfg or {"type": "GELU"})
        if norm_cfg.get("type") != "LN":
            raise ValueError(f"MagnetoViT: norm_cfg type must be LN, got {norm_cfg.get('type')!r}")
        if act_cfg.get("type") != "GELU":
            raise ValueError(f"MagnetoViT: act_cfg type must be GELU, got {act_cfg.get('type')!r}")
        if patch_norm or num_fcs != 2:
            raise ValueError("MagnetoViT: patch_norm=True and num_fcs != 2 are not supported")
        if not (rel_pos or abs_pos_embed):
            raise ValueError("MagnetoViT: choose a position encoding (rel_pos and/or abs_pos_embed)")
        if pretrained is not None and init_cfg is not None:
            raise ValueError("MagnetoViT: give pretrained or init_cfg, not both")
        size, patch = _square(img_size, "img_size"), _square(patch_size, "patch_size")
        grid = [size // patch] * 2
        fields = dict(
            dim=embed_dims, depth=num_layers, heads=num_heads, ffn_dim=int(embed_dims * mlp_ratio), norm=norm,
            qkv_bias=qv_bias, dropout=drop_rate, attn_dropout=attn_drop_rate, drop_path=drop_path_rate,
            layer_scale=init_values, layernorm_eps=norm_cfg.get("eps", 1e-6), final_norm=final_norm,
            rel_pos="2d" if rel_pos else "none", rel_pos_grid=grid if rel_pos else None, rel_pos_prefix=1,
        )
        fields.update(backbone or {})
        config = ViTConfig(backbone=BackboneConfig.from_dict(fields, where="MagnetoViT backbone"),
                           img_size=size, patch_size=patch, in_chans=in_channels, num_classes=0,
                           abs_pos_embed=abs_pos_embed, dynamic_img_size=not rel_pos)
        super().__init__(config)
        depth = config.backbone.depth
        indices = [out_indices] if isinstance(out_indices, int) else list(out_indices)
        for i in indices:
            if not -depth <= i < depth:
                raise ValueError(f"MagnetoViT: out_indices {i} does not exist in a {depth}-layer backbone")
        self.out_indices = [i % depth for i in indices]
        self.final_norm, self.norm_eval = final_norm, norm_eval
        if init_cfg is not None and init_cfg.get("type") == "Pretrained":
            pretrained = init_cfg.get("checkpoint")
        self.pretrained, self.init_cfg = pretrained, init_cfg

    @property
    def grid(self) -> tuple[int, int]:
        return self.config.grid

    def forward(self, inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x, (H, W) = self.embed(inputs)
        _, hidden = self.backbone(x, return_layers=self.out_indices)
        last = self.config.backbone.depth - 1
        outs = []
        for i in self.out_indices:
            h = hidden[i]
            if i == last and self.final_norm and self.backbone.encoder.norm is not None:
                h = self.backbone.encoder.norm(h)
            h = h[:, self.num_prefix_tokens:]
            outs.append(h.reshape(h.shape[0], H, W, -1).permute(0, 3, 1, 2).contiguous())
        return tuple(outs)

    def init_weights(self) -> None:
        """mmengine calls this after building: the constructor already initialised every
        weight (Magneto's gamma included), so only a pretrained checkpoint is loaded here."""
        if self.pretrained is None:
            return
        if not str(self.pretrained).endswith(".safetensors"):
            raise ValueError(f"MagnetoViT: pretrained must be a .safetensors checkpoint of foundation "
                             f"(VisionTransformer, MIM run or Backbone), got {self.pretrained}")
        report = load_vit_weights(self, self.pretrained, self.grid, self.config.backbone, self.num_prefix_tokens)
        print_log(f"MagnetoViT: {self.pretrained}: {report}", logger="current")

    def train(self, mode: bool = True):
        super().train(mode)
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, nn.LayerNorm):
                    m.eval()
        return self

    def layer_id(self, name: str) -> int:
        """BEiT's layer numbering of a parameter name of this module: 0 below the blocks,
        i + 1 for block i, depth + 1 above (shared position table, final norm)."""
        if name.startswith(("patch_embed.", "cls_token", "pos_embed")):
            return 0
        parts = name.split(".")
        if parts[:3] == ["backbone", "encoder", "layers"]:
            return int(parts[3]) + 1
        return self.config.backbone.depth + 1


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class MagnetoLayerDecayOptimizerConstructor(DefaultOptimWrapperConstructor):
    """Layer-wise lr decay for ``MagnetoViT`` (mmseg's own constructor recognises BEiT, MAE
    and ConvNeXt by class name only). ``paramwise_cfg``: ``layer_decay_rate`` (also
    ``decay_rate``) and optionally ``num_layers`` (default: the backbone's depth).

    Block i of L gets lr x rate ** (L - i), the patch embedding / class token / position
    embedding rate ** (L + 1), the decode heads and the neck 1 - BEiT's rule and the
    engine's (foundation.engine.optim). No weight decay on 1-d parameters, biases, the
    position embedding, class token and relative position table.
    """

    def add_params(self, params: list, module: nn.Module, **kwargs) -> None:
        backbone = getattr(module, "backbone", None)
        if not isinstance(backbone, MagnetoViT):
            raise TypeError(f"MagnetoLayerDecayOptimizerConstructor needs model.backbone to be a MagnetoViT, "
                            f"got {type(backbone).__name__}")
        cfg = self.paramwise_cfg
        rate = cfg.get("layer_decay_rate", cfg.get("decay_rate"))
        if rate is None or not 0 < rate <= 1:
            raise ValueError(f"paramwise_cfg.layer_decay_rate must be in (0, 1], got {rate!r}")
        depth = backbone.config.backbone.depth
        if cfg.get("num_layers", depth) != depth:
            raise ValueError(f"paramwise_cfg.num_layers={cfg['num_layers']} but the backbone has {depth} layers")
        groups: dict[str, dict] = {}
        for name, param in module.named_parameters():
            if not param.requires_grad:
                continue
            inner = name[len("backbone."):] if name.startswith("backbone.") else None
            layer = backbone.layer_id(inner) if inner is not None else depth + 1
            decays = not (param.ndim == 1 or name.endswith(".bias") or name.endswith(NO_WEIGHT_DECAY))
            key = f"layer_{layer}_{'decay' if decays else 'no_decay'}"
            if key not in groups:
                scale = rate ** (depth + 1 - layer)
                groups[key] = {"params": [], "param_names": [], "lr_scale": scale, "lr": scale * self.base_lr,
                               "weight_decay": self.base_wd if decays else 0.0, "group_name": key}
            groups[key]["params"].append(param)
            groups[key]["param_names"].append(name)
        if get_dist_info()[0] == 0:
            summary = {k: {"lr_scale": g["lr_scale"], "weight_decay": g["weight_decay"], "params": len(g["params"])}
                       for k, g in groups.items()}
            print_log(f"MagnetoLayerDecayOptimizerConstructor: rate {rate}, {depth} layers: "
                      f"{json.dumps(summary)}", logger="current")
        params.extend(groups[k] for k in sorted(groups, key=lambda k: (int(k.split("_")[1]), k)))


# the checked annotation loader, for mmseg pipelines
from foundation_tasks.segmentation import transforms as _transforms  # noqa: E402,F401
