"""The constants against the papers' tables (Magneto Fig. 2, DeepNet Sec. 3.3), and the
init statistics against the standard init."""
import math

import pytest
import torch

from foundation import Backbone, BackboneConfig
from foundation.scaling import deepnorm_alpha, deepnorm_beta, magneto_gamma, stack_scales

DEPTHS = [(6, 6), (12, 12), (18, 6), (24, 48), (100, 100), (500, 500)]


@pytest.mark.parametrize("N,M", DEPTHS)
def test_magneto_gamma_matches_table(N, M):
    # Magneto Fig. 2 (top right): encoder-only sqrt(log 2N); decoder-only sqrt(log 2M);
    # encoder-decoder: sqrt(1/3 log 3M log 2N) and sqrt(log 3M).
    assert magneto_gamma("encoder", N)[0] == pytest.approx((math.log(2 * N)) ** 0.5, rel=1e-12)
    assert magneto_gamma("decoder", 0, M)[1] == pytest.approx((math.log(2 * M)) ** 0.5, rel=1e-12)
    enc, dec = magneto_gamma("encoder_decoder", N, M)
    assert enc == pytest.approx((math.log(3 * M) * math.log(2 * N) / 3) ** 0.5, rel=1e-12)
    assert dec == pytest.approx((math.log(3 * M)) ** 0.5, rel=1e-12)


@pytest.mark.parametrize("N,M", DEPTHS)
def test_deepnorm_constants_match_table(N, M):
    assert deepnorm_alpha("encoder", N)[0] == pytest.approx((2 * N) ** 0.25)
    assert deepnorm_beta("encoder", N)[0] == pytest.approx((8 * N) ** -0.25)
    assert deepnorm_alpha("decoder", 0, M)[1] == pytest.approx((2 * M) ** 0.25)
    assert deepnorm_beta("decoder", 0, M)[1] == pytest.approx((8 * M) ** -0.25)
    a_e, a_d = deepnorm_alpha("encoder_decoder", N, M)
    b_e, b_d = deepnorm_beta("encoder_decoder", N, M)
    assert a_e == pytest.approx(0.81 * (N**4 * M) ** (1 / 16))
    assert b_e == pytest.approx(0.87 * (N**4 * M) ** (-1 / 16))
    assert a_d == pytest.approx((3 * M) ** 0.25)
    assert b_d == pytest.approx((12 * M) ** -0.25)
    # torchscale 0.3.0 divides by 1.15 instead of multiplying by 0.87
    assert deepnorm_beta("encoder_decoder", N, M, "torchscale")[0] == pytest.approx((N**4 * M) ** (-1 / 16) / 1.15)


def test_deepnet_paper_example_values():
    # DeepNet Table 1 footnote-style sanity: 18L-18L enc-dec (the paper's IWSLT setting)
    a_e, a_d = deepnorm_alpha("encoder_decoder", 18, 18)
    assert a_e == pytest.approx(0.81 * 18 ** (5 / 16))
    assert a_d == pytest.approx(54 ** 0.25)


def test_overrides_express_foundation_ln_and_upscale_ln():
    fln = BackboneConfig.preset("foundation_ln", dim=32, depth=4, heads=2)
    assert (fln.norm, fln.residual_scale) == ("postln", 0.974)
    assert Backbone(fln).scales["encoder"] == (0.974, 1.0)
    up = BackboneConfig.preset("upscale_ln", dim=32, depth=4, heads=2)
    assert Backbone(up).scales["encoder"] == pytest.approx(((2 * 4) ** 0.25, 1.0))
    assert stack_scales("preln", "encoder", 12)["encoder"] == (1.0, 1.0)


def _std_ratio(model, which, rows=None):
    """std of each layer's parameter over the standard Xavier-normal std."""
    out = []
    for layer in model.encoder.layers:
        w = dict(layer.named_parameters())[which]
        if rows is not None:
            w = w[rows]
        expected = math.sqrt(2.0 / (w.shape[0] + w.shape[1]))
        out.append(w.std().item() / expected)
    return sum(out) / len(out)


@pytest.mark.parametrize("norm", ["magneto", "deepnorm", "preln"])
def test_init_scales_v_o_ffn_but_not_q_k(norm):
    torch.manual_seed(0)
    D, N = 128, 8
    m = Backbone(BackboneConfig(dim=D, depth=N, heads=4, norm=norm))
    gain = {"magneto": math.sqrt(math.log(2 * N)), "deepnorm": (8 * N) ** -0.25, "preln": 1.0}[norm]
    q, k, v = slice(0, D), slice(D, 2 * D), slice(2 * D, 3 * D)
    assert _std_ratio(m, "attn.qkv.weight", q) == pytest.approx(1.0, rel=0.03)
    assert _std_ratio(m, "attn.qkv.weight", k) == pytest.approx(1.0, rel=0.03)
    assert _std_ratio(m, "attn.qkv.weight", v) == pytest.approx(gain, rel=0.03)
    assert _std_ratio(m, "attn.proj.weight") == pytest.approx(gain, rel=0.03)
    assert _std_ratio(m, "mlp.fc1.weight") == pytest.approx(gain, rel=0.03)
    assert _std_ratio(m, "mlp.fc2.weight") == pytest.approx(gain, rel=0.03)


def test_encoder_decoder_gains_and_cross_attention():
    torch.manual_seed(0)
    D, N, M = 64, 6, 12
    for norm in ("magneto", "deepnorm"):
        m = Backbone(BackboneConfig(dim=D, depth=N, decoder_depth=M, heads=4, arch="encoder_decoder", norm=norm))
        enc, dec = m.scales["encoder"].gain, m.scales["decoder"].gain
        if norm == "magneto":
            assert enc == pytest.approx(math.sqrt(math.log(3 * M) * math.log(2 * N) / 3))
        w = torch.cat([l.mlp.fc2.weight.flatten() for l in m.decoder.layers])
        assert w.std().item() / math.sqrt(2 / (5 * D)) == pytest.approx(dec, rel=0.03)
        w = torch.cat([l.mlp.fc2.weight.flatten() for l in m.encoder.layers])
        assert w.std().item() / math.sqrt(2 / (5 * D)) == pytest.approx(enc, rel=0.03)
        # cross-attention v/out: unscaled under Magneto, times beta under DeepNorm
        cross = torch.cat([l.cross_attn.proj.weight.flatten() for l in m.decoder.layers])
        expected = 1.0 if norm == "magneto" else dec
        assert cross.std().item() / math.sqrt(2 / (2 * D)) == pytest.approx(expected, rel=0.05)


def test_torchscale_variant_scales_biases():
    torch.manual_seed(0)
    paper = Backbone(BackboneConfig(dim=64, depth=4, heads=4))
    assert all(l.mlp.fc1.bias.abs().sum() == 0 for l in paper.encoder.layers)
    torch.manual_seed(0)
    ts = Backbone(BackboneConfig(dim=64, depth=4, heads=4, init_variant="torchscale"))
    bias = torch.cat([l.mlp.fc1.bias for l in ts.encoder.layers])
    bound = 1 / math.sqrt(64)  # nn.Linear's default bias init is U(-1/sqrt(fan_in), +)
    gamma = math.sqrt(math.log(8))
    assert bias.abs().max().item() <= bound * gamma + 1e-6
    assert bias.abs().max().item() > bound  # scaled beyond the unscaled range
