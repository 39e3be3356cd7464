"""Our Backbone against torchscale 0.3.0's Encoder (the official Magneto / DeepNet code):
``from_torchscale`` must compute the same function, ``to_torchscale`` must invert it."""
import pytest
import torch
from torch import nn

from foundation.checkpoint import from_torchscale, import_torchscale, to_torchscale, torchscale_args
from foundation.config import BackboneConfig
from foundation.transformer import Backbone
from support import perturb_layernorms

EncoderConfig, Encoder = import_torchscale()

DIM, HEADS, FFN, LAYERS = 64, 4, 128, 3
TOL = 1e-5
NORMS = {  # torchscale's EncoderConfig has subln=True by default
    "magneto": dict(),
    "deepnorm": dict(deepnorm=True, subln=False),
    "preln": dict(subln=False, deepnorm=False),
    "postln": dict(subln=False, deepnorm=False, encoder_normalize_before=False),
}


def make_encoder(**options) -> nn.Module:
    torch.manual_seed(0)
    args = EncoderConfig(
        encoder_embed_dim=DIM, encoder_attention_heads=HEADS, encoder_ffn_embed_dim=FFN,
        encoder_layers=LAYERS, vocab_size=-1, no_output_layer=True, **options,
    )
    enc = Encoder(args)
    perturb_layernorms(enc)
    return enc.eval()


def inputs(T: int = 12, seed: int = 2):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, T, DIM, generator=g)
    pad = torch.zeros(2, T, dtype=torch.bool)
    pad[1, T - 3:] = True  # the second sequence ends in padding
    return x, pad


def segments_for(split: int, T: int, experts=("vision", "text")):
    """torchscale's multiway_split_position as our segments."""
    if split == -1:
        return [(experts[0], T)]
    if split == 0:
        return [(experts[1], T)]
    return [(experts[0], split), (experts[1], T - split)]


@torch.no_grad()
def compare(enc, ours, T=12, split=None):
    """(max |diff| over all positions, over non-padded positions)."""
    x, pad = inputs(T)
    ref = enc(src_tokens=None, token_embeddings=x, encoder_padding_mask=pad,
              multiway_split_position=split)["encoder_out"]
    out = ours(x, padding_mask=pad, segments=None if split is None else segments_for(split, T))
    assert out.shape == ref.shape
    keep = ~pad
    return (out - ref).abs().max().item(), (out[keep] - ref[keep]).abs().max().item()


@pytest.mark.parametrize("norm", list(NORMS))
def test_norm_rules_match_torchscale(norm):
    enc = make_encoder(**NORMS[norm])
    ours = from_torchscale(enc)
    assert ours.config.norm == norm
    assert not ours.training  # follows the source's mode
    assert ours.config.layernorm_eps == 1e-5 and ours.config.experts == []
    full, nonpad = compare(enc, ours)
    print(f"{norm}: max|diff| all={full:.3g} non-pad={nonpad:.3g}")
    assert full < TOL and nonpad < TOL


def test_deepnorm_encoder_of_an_encoder_decoder():
    """torchscale's encoder-decoder encoder uses alpha = 0.81 (N^4 M)^(1/16): kept as residual_scale."""
    torch.manual_seed(0)
    args = EncoderConfig(encoder_embed_dim=DIM, encoder_attention_heads=HEADS, encoder_ffn_embed_dim=FFN,
                         encoder_layers=LAYERS, vocab_size=-1, no_output_layer=True, **NORMS["deepnorm"])
    args.decoder_layers = 2
    enc = Encoder(args, is_encoder_decoder=True)
    perturb_layernorms(enc)
    enc.eval()
    ours = from_torchscale(enc)
    assert ours.config.residual_scale == pytest.approx(0.81 * (LAYERS**4 * 2) ** (1 / 16))
    full, _ = compare(enc, ours)
    assert full < TOL


def test_preln_without_final_norm():
    enc = make_encoder(subln=False, normalize_output=False)
    ours = from_torchscale(enc)
    assert ours.config.final_norm is False and ours.encoder.norm is None
    full, _ = compare(enc, ours)
    assert full < TOL


@pytest.mark.parametrize("norm", ["magneto", "preln"])
@pytest.mark.parametrize("split", [-1, 0, 5])
def test_multiway_split_positions(norm, split):
    enc = make_encoder(multiway=True, **NORMS[norm])
    ours = from_torchscale(enc, experts=("vision", "text"))
    assert ours.config.experts == ["vision", "text"]
    full, nonpad = compare(enc, ours, split=split)
    print(f"multiway {norm} split={split}: max|diff| all={full:.3g} non-pad={nonpad:.3g}")
    assert full < TOL and nonpad < TOL


def test_multiway_experts_are_distinct():
    """A and B really go to experts[0] and experts[1]: swapping the segments changes the output."""
    enc = make_encoder(multiway=True)
    ours = from_torchscale(enc, experts=("img", "txt"))
    x, pad = inputs()
    with torch.no_grad():
        a = ours(x, padding_mask=pad, segments=[("img", 12)])
        b = ours(x, padding_mask=pad, segments=[("txt", 12)])
    assert (a - b).abs().max() > 1e-2
    assert torch.equal(ours.encoder.layers[0].attn.proj["txt"].weight, enc.layers[0].self_attn.out_proj.B.weight)


@pytest.mark.parametrize("norm", ["magneto", "deepnorm"])
def test_relative_position_bias_1d(norm):
    # 40 tokens with 16 buckets / max distance 24: exact, logarithmic and clamped buckets
    enc = make_encoder(rel_pos_buckets=16, max_rel_pos=24, **NORMS[norm])
    ours = from_torchscale(enc)
    cfg = ours.config
    assert (cfg.rel_pos, cfg.rel_pos_buckets, cfg.rel_pos_max_distance) == ("1d", 16, 24)
    assert torch.equal(ours.encoder.rel_pos.table, enc.relative_position.relative_attention_bias.weight)
    full, nonpad = compare(enc, ours, T=40)
    print(f"rel_pos 1d {norm}: max|diff| all={full:.3g} non-pad={nonpad:.3g}")
    assert full < TOL and nonpad < TOL


def test_multiway_with_relative_position():
    enc = make_encoder(multiway=True, rel_pos_buckets=32, max_rel_pos=64)
    ours = from_torchscale(enc)
    full, nonpad = compare(enc, ours, T=20, split=8)
    assert full < TOL and nonpad < TOL


def _random_backbone(**fields) -> Backbone:
    torch.manual_seed(3)
    model = Backbone(BackboneConfig(dim=DIM, depth=LAYERS, heads=HEADS, ffn_dim=FFN, **fields))
    with torch.no_grad():
        for p in model.parameters():  # our paper init zeroes biases; make every tensor count
            p.add_(0.1 * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("fields", [
    dict(norm="magneto", experts=["vision", "text"], rel_pos="1d"),
    dict(norm="deepnorm"),
    dict(norm="preln", final_norm=False, activation="relu"),
    dict(norm="postln", rel_pos="1d", rel_pos_buckets=8, rel_pos_max_distance=16),
])
def test_to_torchscale_round_trip(fields):
    ours = _random_backbone(**fields)
    state = to_torchscale(ours)
    enc = Encoder(EncoderConfig(**torchscale_args(ours.config))).eval()
    enc.load_state_dict(state, strict=True)
    split = 5 if ours.config.experts else None
    full, _ = compare(enc, ours, split=split)
    print(f"to_torchscale {fields}: max|diff| {full:.3g}")
    assert full < TOL
    back = from_torchscale(enc, experts=ours.config.experts or ("vision", "text"))
    assert back.config.norm == ours.config.norm
    theirs_sd, ours_sd = back.state_dict(), ours.state_dict()
    assert theirs_sd.keys() == ours_sd.keys()
    assert all(torch.equal(theirs_sd[k], ours_sd[k]) for k in ours_sd)


def test_qkv_rows_are_q_k_v():
    enc = make_encoder()
    ours = from_torchscale(enc)
    qkv = ours.encoder.layers[1].attn.qkv.weight
    attn = enc.layers[1].self_attn
    for part, proj in zip(qkv.chunk(3), (attn.q_proj, attn.k_proj, attn.v_proj)):
        assert torch.equal(part, proj.weight)


@pytest.mark.parametrize("options, setattr_args, needle", [
    (dict(xpos_rel_pos=True), {}, "xpos_rel_pos"),
    (dict(layernorm_embedding=True), {}, "layernorm_embedding"),
    (dict(no_scale_embedding=False), {}, "no_scale_embedding"),
    (dict(), {"moe_freq": 2, "moe_expert_count": 2}, "moe_freq"),
    (dict(), {"activation_fn": "gelu_new"}, "activation_fn"),
])
def test_refuses_unsupported_torchscale_options(options, setattr_args, needle):
    enc = make_encoder(**options)
    for k, v in setattr_args.items():
        setattr(enc.args, k, v)
    with pytest.raises(ValueError, match=needle):
        from_torchscale(enc)


def test_modules_outside_the_stack_are_refused_unless_ignored():
    args = EncoderConfig(encoder_embed_dim=DIM, encoder_attention_heads=HEADS, encoder_ffn_embed_dim=FFN,
                         encoder_layers=1, vocab_size=-1, no_output_layer=True)
    enc = Encoder(args, embed_tokens=nn.Embedding(10, DIM)).eval()
    with pytest.raises(ValueError, match="embed_tokens"):
        from_torchscale(enc)
    ours = from_torchscale(enc, ignore=("embed_tokens",))
    assert not any("embed" in k for k in ours.state_dict())
    with pytest.raises(ValueError, match="ignore"):
        from_torchscale(enc, ignore=("layers",))


def test_multiway_needs_two_experts():
    with pytest.raises(ValueError, match="experts"):
        from_torchscale(make_encoder(multiway=True), experts=("vision",))


@pytest.mark.parametrize("fields, needle", [
    (dict(layer_scale=0.1), "layer_scale"),
    (dict(experts=["a", "b"], vl_expert_layers=1), "vl_expert_layers"),
    (dict(qkv_bias=False), "qkv_bias"),
    (dict(arch="decoder"), "arch"),
    (dict(experts=["a", "b", "c"]), "experts"),
    (dict(norm="postln", residual_scale=0.974), "residual_scale"),
])
def test_to_torchscale_refuses_what_torchscale_cannot_express(fields, needle):
    model = Backbone(BackboneConfig(dim=16, depth=2, heads=2, ffn_dim=32, **fields))
    with pytest.raises(ValueError, match=needle):
        to_torchscale(model)
