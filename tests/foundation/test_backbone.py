"""Backbone behaviour: masks, causality, multiway routing, options, config and bad input."""
import pytest
import torch

from foundation import Backbone, BackboneConfig, ConfigError
from foundation.layers import RelativePositionBias2d

NORMS = ["preln", "postln", "magneto", "deepnorm"]


def tiny(**kw):
    base = dict(dim=32, depth=2, heads=4)
    base.update(kw)
    return Backbone(BackboneConfig(**base)).eval()


@pytest.mark.parametrize("norm", NORMS)
def test_padding_does_not_leak(norm):
    torch.manual_seed(0)
    m = tiny(norm=norm)
    x = torch.randn(2, 7, 32)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, 4:] = True
    y = m(x, padding_mask=pad)
    x2 = x.clone()
    x2[1, 4:] = 1e3 * torch.randn(3, 32)  # garbage in the padding
    assert torch.allclose(m(x2, padding_mask=pad), y, atol=1e-5)
    # the unpadded prefix equals running the short sequence alone
    assert torch.allclose(m(x[1:, :4])[0], y[1, :4], atol=1e-5)


@pytest.mark.parametrize("norm", NORMS)
def test_decoder_is_causal(norm):
    torch.manual_seed(0)
    m = tiny(norm=norm, arch="decoder")
    x = torch.randn(1, 6, 32)
    y = m(x)
    x2 = x.clone()
    x2[0, 4:] += torch.randn(2, 32)  # changing the future must not change the past
    # (random, not constant: a constant shift is invisible through LayerNorm)
    y2 = m(x2)
    assert torch.allclose(y[0, :4], y2[0, :4], atol=1e-5)
    assert not torch.allclose(y[0, 4:], y2[0, 4:], atol=1e-3)


def test_causal_with_padding_and_bias_paths_agree():
    torch.manual_seed(0)
    m = tiny(arch="decoder", rel_pos="1d")
    x = torch.randn(2, 5, 32)
    pad = torch.zeros(2, 5, dtype=torch.bool)
    y_pad = m(x, padding_mask=pad)  # additive-mask path
    assert torch.allclose(y_pad, m(x), atol=1e-5)


def test_encoder_decoder_cross_attention_sees_memory():
    torch.manual_seed(0)
    m = tiny(arch="encoder_decoder", decoder_depth=3)
    src, tgt = torch.randn(2, 5, 32), torch.randn(2, 4, 32)
    y = m(src, decoder_x=tgt)
    assert y.shape == (2, 4, 32)
    assert not torch.allclose(m(src + 1.0, decoder_x=tgt), y)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    src2 = src.clone()
    src2[1, 3:] = 100.0
    assert torch.allclose(m(src, pad, decoder_x=tgt), m(src2, pad, decoder_x=tgt), atol=1e-5)
    mem = m.encode(src)
    assert torch.allclose(m.decode(tgt, mem), y, atol=1e-6)
    assert not hasattr(m.decoder.layers[0].cross_attn, "qkv")
    assert m.decoder.layers[0].cross_attn.norm is None  # Magneto: cross-attention has only its input LN


def test_multiway_routes_tokens_by_segment():
    torch.manual_seed(0)
    m = tiny(experts=["vision", "text"], norm="magneto")
    x = torch.randn(2, 6, 32)
    both = m(x, segments=[("vision", 4), ("text", 2)])
    # perturbing the text expert changes only what text tokens see through their own
    # projections; vision-only input is unaffected by text weights
    v_only = m(x, segments=[("vision", 6)])
    with torch.no_grad():
        for layer in m.encoder.layers:
            layer.mlp["text"].fc2.weight.add_(torch.randn_like(layer.mlp["text"].fc2.weight))
    assert torch.allclose(m(x, segments=[("vision", 6)]), v_only, atol=1e-6)
    assert not torch.allclose(m(x, segments=[("vision", 4), ("text", 2)]), both, atol=1e-3)
    # empty segments are allowed (split position 0 / -1)
    assert m(x, segments=[("vision", 0), ("text", 6)]).shape == x.shape


def test_vl_expert_used_only_for_mixed_input():
    torch.manual_seed(0)
    m = tiny(experts=["vision", "text"], depth=3, vl_expert_layers=1)
    assert "vl" in m.encoder.layers[2].mlp and "vl" not in m.encoder.layers[1].mlp
    x = torch.randn(1, 5, 32)
    mixed, text = m(x, segments=[("vision", 3), ("text", 2)]), m(x, segments=[("text", 5)])
    with torch.no_grad():
        m.encoder.layers[2].mlp["vl"].fc2.weight.normal_()
    assert not torch.allclose(m(x, segments=[("vision", 3), ("text", 2)]), mixed, atol=1e-4)
    assert torch.allclose(m(x, segments=[("text", 5)]), text, atol=1e-6)


def test_return_layers_and_checkpointing():
    torch.manual_seed(0)
    cfg = BackboneConfig(dim=32, depth=4, heads=4, drop_path=0.0)
    m = Backbone(cfg)
    x = torch.randn(2, 5, 32, requires_grad=True)
    out, hidden = m(x, return_layers=[0, 2, -1])
    assert sorted(hidden) == [-1, 0, 2] and hidden[-1].shape == (2, 5, 32)
    out.sum().backward()
    g = x.grad.clone()
    x.grad = None
    ck = Backbone(cfg.replace(checkpoint_activations=True))
    ck.load_state_dict(m.state_dict())
    ck(x).sum().backward()
    assert torch.allclose(x.grad, g, atol=1e-5)
    with pytest.raises(ValueError, match="layer 4 does not exist"):
        m(x, return_layers=[4])


def test_drop_path_rises_linearly_and_layer_scale():
    m = tiny(depth=5, drop_path=0.2, layer_scale=1e-5)
    rates = [getattr(l.drop_path, "drop_prob", 0.0) for l in m.encoder.layers]
    assert rates == pytest.approx([0.0, 0.05, 0.1, 0.15, 0.2])
    assert torch.allclose(m.encoder.layers[0].ls1.gamma, torch.full((32,), 1e-5))


def test_rel_pos_2d_matches_definition():
    h, w = 3, 4
    rp = RelativePositionBias2d(heads=2, grid=(h, w), prefix=1)
    torch.nn.init.normal_(rp.table)
    bias = rp(1 + h * w)[0]  # (H, T, T)
    n_rel = (2 * h - 1) * (2 * w - 1)
    for qi in range(h * w):
        for ki in range(h * w):
            dy, dx = qi // w - ki // w, qi % w - ki % w
            idx = (dy + h - 1) * (2 * w - 1) + (dx + w - 1)
            assert torch.equal(bias[:, 1 + qi, 1 + ki], rp.table[idx])
    assert torch.equal(bias[:, 0, 5], rp.table[n_rel])
    assert torch.equal(bias[:, 5, 0], rp.table[n_rel + 1])
    assert torch.equal(bias[:, 0, 0], rp.table[n_rel + 2])
    m = tiny(rel_pos="2d", rel_pos_grid=[h, w])
    with pytest.raises(ValueError, match="3x4 patch grid"):
        m(torch.randn(1, 5, 32))


def test_attn_mask_bool_and_additive_agree():
    torch.manual_seed(0)
    m = tiny()
    x = torch.randn(2, 5, 32)
    blocked = torch.zeros(5, 5, dtype=torch.bool)
    blocked[:, 3] = True
    additive = torch.zeros(5, 5).masked_fill(blocked, float("-inf"))
    assert torch.allclose(m(x, attn_mask=blocked), m(x, attn_mask=additive), atol=1e-6)
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[:, 3] = True
    assert torch.allclose(m(x, attn_mask=blocked)[:, [0, 1, 2, 4]], m(x, padding_mask=pad)[:, [0, 1, 2, 4]], atol=1e-5)


def test_bad_input_messages():
    m = tiny(experts=["vision", "text"])
    x = torch.randn(2, 5, 32)
    seg = [("vision", 5)]
    with pytest.raises(ValueError, match=r"expected \(B, T, 32\)"):
        m(torch.randn(2, 5, 16), segments=seg)
    with pytest.raises(ValueError, match=r"padding_mask: expected shape \(B, T\)"):
        m(x, padding_mask=torch.zeros(2, 4, dtype=torch.bool), segments=seg)
    with pytest.raises(ValueError, match="bool tensor"):
        m(x, padding_mask=torch.zeros(2, 5), segments=seg)
    with pytest.raises(ValueError, match="attn_mask: expected"):
        m(x, attn_mask=torch.zeros(4, 4), segments=seg)
    with pytest.raises(ValueError, match="add up to 4, but T = 5"):
        m(x, segments=[("vision", 2), ("text", 2)])
    with pytest.raises(ValueError, match="unknown expert 'audio'"):
        m(x, segments=[("audio", 5)])
    with pytest.raises(ValueError, match="pass segments"):
        m(x)
    plain = tiny()  # a plain backbone shares every layer: the segments' expert names are ignored
    assert torch.equal(plain(x, segments=[("vision", 2), ("text", 3)]), plain(x))
    with pytest.raises(ValueError, match="add up to 4, but T = 5"):
        plain(x, segments=[("speech", 4)])


def test_config_errors_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match="'norm'.*preln, postln, magneto, deepnorm"):
        BackboneConfig(norm="layernorm")
    with pytest.raises(ConfigError, match="'heads'.*divide dim"):
        BackboneConfig(dim=30, heads=4)
    bad = tmp_path / "bad.yaml"
    bad.write_text("dim: 64\nheads: 4\ndepht: 3\n")
    with pytest.raises(ConfigError, match="depht"):
        BackboneConfig.from_yaml(bad)
    bad.write_text("dim: sixty-four\n")
    with pytest.raises(ConfigError, match="dim"):
        BackboneConfig.from_yaml(bad)
    with pytest.raises(ConfigError, match="not found"):
        BackboneConfig.from_yaml(tmp_path / "missing.yaml")


def test_config_yaml_round_trip_and_overrides(tmp_path):
    cfg = BackboneConfig(dim=64, depth=3, heads=4, experts=["vision", "text"], rel_pos="1d", norm="deepnorm")
    cfg.to_yaml(tmp_path / "b.yaml")
    assert BackboneConfig.from_yaml(tmp_path / "b.yaml") == cfg
    over = BackboneConfig.from_yaml(tmp_path / "b.yaml", ["norm=magneto", "depth=5"])
    assert (over.norm, over.depth, over.ffn_dim) == ("magneto", 5, 256)


def test_shipped_backbone_configs_load():
    from pathlib import Path

    files = sorted(Path(__file__).parents[2].glob("configs/backbone/*.yaml"))
    assert files
    for f in files:
        cfg = BackboneConfig.from_yaml(f)
        assert cfg.norm in NORMS
