"""Modality front ends and the ViT wrapper."""
import pytest
import torch

from foundation import BackboneConfig
from foundation.embed import TextEmbedding, VGGSubsampling
from foundation.vit import ViTConfig, VisionTransformer


@pytest.mark.parametrize("frames", [1, 7, 8, 9, 13, 100, 101])
def test_vgg_output_lengths_match_frames(frames):
    vgg = VGGSubsampling(in_features=80, dim=32, channels=(4, 8))
    feats = torch.randn(2, frames, 80)
    out, lengths = vgg(feats, torch.tensor([frames, max(1, frames - 2)]))
    assert out.shape == (2, -(-(-(-frames // 2)) // 2), 32)  # ceil(ceil(L/2)/2): 10 ms -> 40 ms
    assert lengths[0].item() == out.shape[1]
    short = vgg(feats[1:, : max(1, frames - 2)])[0]
    assert lengths[1].item() == short.shape[1]


def test_vgg_keeps_the_scale_of_normalised_features():
    # with PyTorch's default conv init the four ReLU convs shrank unit-variance (CMVN'd)
    # features to std ~0.04, which the backbone's residual branches drowned (issue 20)
    torch.manual_seed(0)
    out, _ = VGGSubsampling(80, 144, (8, 32))(torch.randn(4, 200, 80))
    assert 0.3 < out.std().item() < 3.0


def test_vgg_runs_channels_last_and_computes_the_plain_convolutions(tmp_path):
    import torch.nn.functional as F
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    vgg = VGGSubsampling(80, 16, (4, 8))
    assert all(m.weight.is_contiguous(memory_format=torch.channels_last) for m in vgg.convs if hasattr(m, "weight"))
    x = torch.randn(2, 30, 80)
    h = x.unsqueeze(1)  # the same VGG blocks on plain NCHW tensors
    for conv in (vgg.convs[0], vgg.convs[2]), (vgg.convs[5], vgg.convs[7]):
        for c in conv:
            h = F.relu(F.conv2d(h, c.weight.contiguous(), c.bias, padding=1))
        h = F.max_pool2d(h, 2, ceil_mode=True)
    expected = vgg.proj(h.permute(0, 2, 1, 3).reshape(2, h.shape[2], -1))
    torch.testing.assert_close(vgg(x)[0], expected, rtol=1e-5, atol=1e-5)
    # its weights save and load as any others (safetensors wants contiguous tensors)
    state = {k: v.contiguous() for k, v in vgg.state_dict().items()}
    save_file(state, tmp_path / "vgg.safetensors")
    again = VGGSubsampling(80, 16, (4, 8))
    again.load_state_dict(load_file(tmp_path / "vgg.safetensors"))
    assert again.convs[0].weight.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(again(x)[0], vgg(x)[0], rtol=0, atol=0)


def test_vgg_rejects_wrong_feature_dim():
    with pytest.raises(ValueError, match=r"expected \(B, frames, 80\)"):
        VGGSubsampling(80, 32)(torch.randn(1, 10, 40))


def test_text_embedding():
    emb = TextEmbedding(100, 16, max_positions=8)
    ids = torch.randint(0, 100, (2, 5))
    x = emb(ids)
    assert torch.allclose(x, emb.tokens(ids) + emb.positions.weight[:5])
    with pytest.raises(ValueError, match="only 8 positions"):
        emb(torch.zeros(1, 9, dtype=torch.long))


def test_vit_interfaces():
    torch.manual_seed(0)
    cfg = ViTConfig(backbone=BackboneConfig(dim=32, depth=4, heads=4), img_size=32, patch_size=8, num_classes=5)
    m = VisionTransformer(cfg).eval()
    x = torch.randn(2, 3, 32, 32)
    feats = m.forward_features(x)
    assert feats.shape == (2, 17, 32)
    assert torch.allclose(m(x), m.head(feats[:, 0]))
    final, inter = m.forward_intermediates(x, indices=2)
    assert torch.allclose(final, feats) and [t.shape for t in inter] == [(2, 32, 4, 4)] * 2
    nlc = m.forward_intermediates(x, indices=[0], output_fmt="NLC", intermediates_only=True)
    assert nlc[0].shape == (2, 16, 32)
    with pytest.raises(ValueError, match=r"images: expected \(B, 3, H, W\)"):
        m(torch.randn(2, 1, 32, 32))


def test_vit_dynamic_size_and_rel_pos_2d():
    cfg = ViTConfig(
        backbone=BackboneConfig(dim=32, depth=2, heads=4, rel_pos="2d", rel_pos_grid=[4, 4]),
        img_size=32, patch_size=8, num_classes=3, abs_pos_embed=False, global_pool="avg", fc_norm=True,
    )
    assert VisionTransformer(cfg)(torch.randn(1, 3, 32, 32)).shape == (1, 3)
    dyn = VisionTransformer(ViTConfig(backbone=BackboneConfig(dim=32, depth=2, heads=4), img_size=32,
                                      patch_size=8, num_classes=3, dynamic_img_size=True))
    assert dyn(torch.randn(1, 3, 48, 40)).shape == (1, 3)
