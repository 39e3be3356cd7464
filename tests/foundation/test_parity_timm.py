"""Our VisionTransformer against timm's: ``from_timm`` must compute the same function."""
import pytest
import timm
import torch
from timm.models.vision_transformer import ResPostBlock, VisionTransformer as TimmViT
from torch import nn

from foundation.checkpoint.timm import from_timm
from foundation.vit import VisionTransformer

TOL = 1e-5


def _randomise(model: nn.Module, seed: int = 0) -> nn.Module:
    """Random weights everywhere, LayerNorms away from 1 / 0 and non-zero biases, so that
    every mapped tensor matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.add_(0.02 * torch.randn(p.shape, generator=g))
    return model.eval()


@torch.no_grad()
def compare(theirs: nn.Module, ours: nn.Module, images: torch.Tensor) -> tuple[float, float]:
    a, b = theirs.forward_features(images), ours.forward_features(images)
    assert a.shape == b.shape
    feats = (a - b).abs().max().item()
    head = (theirs.forward_head(a) - ours.forward_head(b)).abs().max().item()
    assert torch.allclose(theirs(images), ours(images), atol=TOL, rtol=0)
    return feats, head


def test_vit_tiny_patch16_224():
    torch.manual_seed(0)
    theirs = _randomise(timm.create_model("vit_tiny_patch16_224", pretrained=False))
    ours = from_timm(theirs)
    assert isinstance(ours, VisionTransformer) and not ours.training
    cfg = ours.config
    assert (cfg.backbone.norm, cfg.backbone.dim, cfg.backbone.depth, cfg.backbone.heads) == ("preln", 192, 12, 3)
    assert cfg.backbone.layernorm_eps == 1e-6 and cfg.global_pool == "token" and cfg.num_classes == 1000
    assert torch.equal(ours.backbone.encoder.norm.weight, theirs.norm.weight)
    images = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    feats, head = compare(theirs, ours, images)
    print(f"vit_tiny_patch16_224: forward_features max|diff|={feats:.3g}, head max|diff|={head:.3g}")
    assert feats < TOL and head < TOL


def _small_timm(**kw) -> TimmViT:
    torch.manual_seed(0)
    args = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=5, qkv_bias=True)
    return _randomise(TimmViT(**{**args, **kw}))


@pytest.mark.parametrize("kw", [
    dict(global_pool="avg", init_values=0.1, qkv_bias=False),  # fc_norm after pooling, layer scale
    dict(class_token=False, global_pool="avg", fc_norm=False, mlp_ratio=2.0),
    dict(act_layer=nn.ReLU, num_classes=0),
    # timm's Sub-LN blocks are Magneto's layout (without its init)
    dict(scale_attn_norm=True, scale_mlp_norm=True),
])
def test_timm_variants(kw):
    theirs = _small_timm(**kw)
    ours = from_timm(theirs)
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    feats, head = compare(theirs, ours, images)
    print(f"{kw}: {ours.config.backbone.norm}, forward_features {feats:.3g}, head {head:.3g}")
    assert feats < TOL and head < TOL
    if "scale_attn_norm" in kw:
        assert ours.config.backbone.norm == "magneto"


@pytest.mark.parametrize("kw, needle", [
    (dict(reg_tokens=2), "reg_tokens"),
    (dict(qk_norm=True), "qk_norm"),
    (dict(global_pool="map"), "global_pool"),
    (dict(no_embed_class=True), "no_embed_class"),
    (dict(pre_norm=True), "pre_norm"),
    (dict(act_layer="gelu_tanh"), "act_layer"),
    (dict(scale_attn_norm=True), "scale_attn_norm"),
    (dict(block_fn=ResPostBlock), "block_fn"),
])
def test_refuses_what_we_cannot_hold(kw, needle):
    with pytest.raises(ValueError, match=needle):
        from_timm(_small_timm(**kw))


def test_not_a_timm_vit():
    with pytest.raises(TypeError, match="timm VisionTransformer"):
        from_timm(nn.Linear(2, 2))
