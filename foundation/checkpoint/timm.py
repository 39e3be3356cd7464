"""timm ``VisionTransformer`` -> our ``foundation.vit.VisionTransformer`` (the same function)."""
from __future__ import annotations

from typing import Any

from torch import nn

from foundation.checkpoint.format import load_state_into
from foundation.config import BackboneConfig
from foundation.vit import ViTConfig, VisionTransformer


def from_timm(vit: nn.Module) -> nn.Module:
    """Our ``foundation.vit.VisionTransformer`` computing what a timm ``VisionTransformer``
    computes (eval mode): Pre-LN blocks (``norm="preln"``), or Sub-LN ones
    (``norm="magneto"``) for timm blocks built with ``scale_attn_norm`` and
    ``scale_mlp_norm``. Keys map directly (``blocks.{i}`` -> ``backbone.encoder.layers.{i}``,
    ``norm`` -> ``backbone.encoder.norm``). Training-only dropouts outside the blocks
    (``pos_drop``, ``patch_drop``, ``head_drop``) are not carried over.
    """
    cfg = ViTConfig(**_timm_vit_fields(vit))
    state = {}
    for key, value in vit.state_dict().items():
        if key.startswith("blocks."):
            key = "backbone.encoder.layers." + key[len("blocks."):]
        elif key.startswith("norm."):
            key = "backbone.encoder." + key
        state[key] = value
    model = VisionTransformer(cfg)
    load_state_into(model, state, where=f"converted timm {type(vit).__name__}")
    return model.train(vit.training)


def _timm_vit_fields(vit: nn.Module) -> dict[str, Any]:
    """ViTConfig fields of a timm VisionTransformer; ValueError naming what we cannot hold."""
    from timm.layers import Attention as TimmAttention, LayerScale, Mlp, PatchEmbed
    from timm.models.vision_transformer import Block as TimmBlock, VisionTransformer as TimmViT

    def refuse(option: str, why: str) -> ValueError:
        return ValueError(f"timm VisionTransformer option {option}: {why}")

    def identity(m: nn.Module | None) -> bool:
        return m is None or isinstance(m, nn.Identity)

    if not isinstance(vit, TimmViT):
        raise TypeError(f"from_timm needs a timm VisionTransformer, got {type(vit).__name__}")
    if getattr(vit, "num_reg_tokens", 0):
        raise refuse("reg_tokens", f"{vit.num_reg_tokens} register tokens are not supported")
    if vit.global_pool not in ("token", "avg") or getattr(vit, "attn_pool", None) is not None:
        raise refuse("global_pool", f"{vit.global_pool!r} is not supported (token or avg)")
    if vit.global_pool == "avg" and getattr(vit, "pool_include_prefix", False):
        raise refuse("pool_include_prefix", "average pooling over the class token is not supported")
    if vit.pos_embed is not None and vit.cls_token is not None and vit.no_embed_class:
        raise refuse("no_embed_class", "a position embedding without the class token's entry is not supported")
    if not identity(vit.norm_pre):
        raise refuse("pre_norm", "a LayerNorm before the blocks is not supported")
    pe = vit.patch_embed
    if type(pe) is not PatchEmbed or not identity(pe.norm) or pe.proj.bias is None:
        raise refuse("embed_layer", "only timm's PatchEmbed with a biased projection and no norm is supported")
    if pe.img_size is None or pe.img_size[0] != pe.img_size[1] or pe.patch_size[0] != pe.patch_size[1]:
        raise refuse("img_size", f"square images and patches only (img_size={pe.img_size}, patch_size={pe.patch_size})")

    blocks = list(vit.blocks)
    if not blocks:
        raise refuse("depth", "a model without blocks")
    first = blocks[0]
    for blk in blocks:
        if type(blk) is not TimmBlock or type(blk.attn) is not TimmAttention or type(blk.mlp) is not Mlp:
            raise refuse("block_fn", f"only timm's Block / Attention / Mlp are supported, got {type(blk).__name__}")
        if not (identity(blk.attn.q_norm) and identity(blk.attn.k_norm)):
            raise refuse("qk_norm", "query/key normalisation is not supported")
        if getattr(blk.attn, "gate", None) is not None:
            raise refuse("attn gate", "gated attention is not supported")
        if blk.attn.attn_dim != vit.embed_dim:
            raise refuse("attn_head_dim", f"heads x head_dim = {blk.attn.attn_dim} != embed_dim {vit.embed_dim}")
        if blk.attn.proj.bias is None or blk.mlp.fc1.bias is None or blk.mlp.fc2.bias is None:
            raise refuse("proj_bias", "projections without bias are not supported")
        if identity(blk.attn.norm) != identity(blk.mlp.norm):
            raise refuse("scale_attn_norm / scale_mlp_norm", "Sub-LN needs both (Magneto), or neither (ViT)")
        if isinstance(blk.ls1, LayerScale) != isinstance(first.ls1, LayerScale):
            raise refuse("init_values", "layer scale in some blocks only")
    norms = [m for m in vit.modules() if isinstance(m, nn.LayerNorm)]
    non_ln = [type(m).__name__ for m in vit.modules() if "norm" in type(m).__name__.lower()
              and not isinstance(m, nn.LayerNorm)]
    if non_ln:
        raise refuse("norm_layer", f"only LayerNorm is supported, got {sorted(set(non_ln))}")
    if len({m.eps for m in norms}) > 1 or any(not m.elementwise_affine or m.bias is None for m in norms):
        raise refuse("norm_layer", "LayerNorms must share one eps and have weight and bias")
    act = first.mlp.act
    if isinstance(act, nn.GELU) and act.approximate == "none":
        activation = "gelu"
    elif type(act) in (nn.ReLU, nn.SiLU):
        activation = "relu" if isinstance(act, nn.ReLU) else "swish"
    else:
        raise refuse("act_layer", f"{act!r} is not supported (exact GELU, ReLU or SiLU)")
    drop_path = blocks[-1].drop_path1.drop_prob if hasattr(blocks[-1].drop_path1, "drop_prob") else 0.0

    backbone = BackboneConfig(
        dim=vit.embed_dim,
        depth=len(blocks),
        heads=first.attn.num_heads,
        ffn_dim=first.mlp.fc1.out_features,
        norm="preln" if identity(first.attn.norm) else "magneto",
        activation=activation,
        layernorm_eps=first.norm1.eps,
        qkv_bias=first.attn.qkv.bias is not None,
        dropout=first.attn.proj_drop.p,
        attn_dropout=first.attn.attn_drop.p,
        drop_path=float(drop_path),
        # the init value only matters before the weights are loaded; timm does not keep it
        layer_scale=1.0 if isinstance(first.ls1, LayerScale) else None,
        final_norm=not identity(vit.norm),
        init_variant="paper",
    )
    return dict(
        backbone=backbone,
        img_size=pe.img_size[0],
        patch_size=pe.patch_size[0],
        in_chans=pe.proj.in_channels,
        num_classes=vit.num_classes,
        global_pool=vit.global_pool,
        class_token=vit.cls_token is not None,
        abs_pos_embed=vit.pos_embed is not None,
        fc_norm=not identity(vit.fc_norm),
        dynamic_img_size=bool(getattr(vit, "dynamic_img_size", False)),
    )
