"""BEiT-3 on our multiway backbone against torchscale 0.3.0's ``BEiT3`` (the released
architecture): same outputs for image-only, text-only and image-text inputs, with text
padding and masked patches; and the converters for released checkpoints."""
import pytest
import torch
from torch import nn

from foundation.checkpoint import CheckpointError
from foundation_tasks.vl_common.beit3 import BEiT3, BEiT3Config, BEiT3Embedding, resize_vision_pos
from foundation_tasks.vl_common.convert import (
    convert_released, find_embedding, from_torchscale_beit3, import_torchscale_beit3, load_beit3,
    load_embedding, to_torchscale_beit3,
)
from support import perturb_layernorms

EncoderConfig, TorchscaleBEiT3 = import_torchscale_beit3()
DIM, HEADS, FFN, LAYERS, VOCAB, IMG, PATCH = 32, 4, 64, 2, 50, 16, 4
TOL = 1e-5


def torchscale_beit3(**options) -> nn.Module:
    torch.manual_seed(0)
    args = dict(encoder_embed_dim=DIM, encoder_attention_heads=HEADS, encoder_ffn_embed_dim=FFN,
                encoder_layers=LAYERS, vocab_size=VOCAB, multiway=True, no_output_layer=True,
                img_size=IMG, patch_size=PATCH, max_source_positions=24)
    args.update(options)
    model = TorchscaleBEiT3(EncoderConfig(**args))
    perturb_layernorms(model, tokens=True)
    return model.eval()


def batch(seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(3, 3, IMG, IMG, generator=g)
    text = torch.randint(0, VOCAB, (3, 7), generator=g)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[1, 4:] = True  # the second text ends in padding
    pad[2, 2:] = True
    masked = torch.rand(3, (IMG // PATCH) ** 2, generator=g) < 0.4
    return images, text, pad, masked


KINDS = {
    "image": lambda im, t, p, m: (dict(visual_tokens=im), dict(images=im)),
    "masked_image": lambda im, t, p, m: (dict(visual_tokens=im, vision_masked_position=m), dict(images=im, vision_mask=m)),
    "text": lambda im, t, p, m: (dict(textual_tokens=t, text_padding_position=p), dict(text_ids=t, text_padding_mask=p)),
    "pair": lambda im, t, p, m: (dict(textual_tokens=t, visual_tokens=im, text_padding_position=p),
                                 dict(text_ids=t, images=im, text_padding_mask=p)),
}
NORMS = {"magneto": dict(), "preln": dict(subln=False), "deepnorm": dict(deepnorm=True)}


@torch.no_grad()
def max_diff(ts, ours, kind, seed=3):
    images, text, pad, masked = batch(seed)
    theirs_in, ours_in = KINDS[kind](images, text, pad, masked)
    ref = ts(**theirs_in)["encoder_out"]
    out = ours(**ours_in)
    assert out.shape == ref.shape
    keep = torch.ones(out.shape[:2], dtype=torch.bool)
    if kind in ("text", "pair"):  # padded positions are not outputs anyone reads
        keep[:, out.shape[1] - pad.shape[1]:] = ~pad
    return (out - ref)[keep].abs().max().item()


@pytest.mark.parametrize("norm", list(NORMS))
@pytest.mark.parametrize("kind", list(KINDS))
def test_parity_with_torchscale_beit3(norm, kind):
    ts = torchscale_beit3(**NORMS[norm])
    ours = from_torchscale_beit3(ts)
    assert ours.config.backbone.norm == norm and ours.config.backbone.experts == ["vision", "text"]
    assert max_diff(ts, ours, kind) < TOL


def test_parity_without_final_norm_as_beit3_vqa():
    ts = torchscale_beit3(normalize_output=False)  # BEiT-3's VQA models
    ours = from_torchscale_beit3(ts)
    assert not ours.config.backbone.final_norm
    assert max_diff(ts, ours, "pair") < TOL


def test_our_model_back_to_torchscale():
    cfg = BEiT3Config(backbone=BEiT3Config().backbone.replace(dim=DIM, heads=HEADS, ffn_dim=FFN, depth=LAYERS,
                                                              init_variant="torchscale"),
                      vocab_size=VOCAB, img_size=IMG, patch_size=PATCH, text_positions=22)
    torch.manual_seed(1)
    ours = BEiT3(cfg).eval()
    perturb_layernorms(ours, tokens=True)
    from foundation_tasks.vl_common.convert import torchscale_beit3_args

    ts = TorchscaleBEiT3(EncoderConfig(**torchscale_beit3_args(cfg))).eval()
    ts.load_state_dict(to_torchscale_beit3(ours), strict=True)
    assert max_diff(ts, ours, "pair") < TOL and max_diff(ts, ours, "masked_image") < TOL


def test_padding_does_not_change_real_tokens():
    """A text padded further gives the same outputs on its real tokens (and on the image)."""
    ours = from_torchscale_beit3(torchscale_beit3())
    images, text, pad, _ = batch()
    with torch.no_grad():
        short = ours(text_ids=text[:1, :4], images=images[:1])
        longer = ours(text_ids=torch.cat([text[:1, :4], torch.zeros(1, 5, dtype=torch.long)], 1), images=images[:1],
                      text_padding_mask=torch.tensor([[False] * 4 + [True] * 5]))
    assert (short - longer[:, : short.shape[1]]).abs().max() < TOL


def test_segments_follow_the_inputs():
    emb = BEiT3Embedding(VOCAB, DIM, IMG, PATCH, text_positions=10)
    images, text, pad, _ = batch()
    n = 1 + (IMG // PATCH) ** 2
    assert emb(images=images)[2] == [("vision", n)] and emb(images=images)[1] is None
    assert emb(text_ids=text, text_padding_mask=pad)[2] == [("text", 7)]
    x, padding, segments = emb(text_ids=text, text_padding_mask=pad, images=images)
    assert segments == [("vision", n), ("text", 7)] and x.shape == (3, n + 7, DIM)
    assert not padding[:, :n].any() and torch.equal(padding[:, n:], pad)
    with pytest.raises(ValueError, match="position table has 10 rows"):
        emb(text_ids=torch.zeros(1, 11, dtype=torch.long))


def test_text_embedding_init_std():
    """BEiT's 0.02 by default; text_std (the configs' text_embed_std) scales the text rows only,
    and the other tables draw the same numbers either way."""
    def built(**kw):
        torch.manual_seed(0)
        return BEiT3Embedding(4000, 64, IMG, PATCH, text_positions=10, **kw)

    beit, wide = built(), built(text_std=64 ** -0.5)
    assert beit.text_embed.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert wide.text_embed.weight.std().item() == pytest.approx(0.125, rel=0.05)
    for name in ("cls_token", "mask_token", "vision_pos", "text_pos"):
        assert torch.equal(getattr(beit, name), getattr(wide, name))


def _released_state(ts: nn.Module, head: str) -> dict[str, torch.Tensor]:
    """A state dict laid out as microsoft/unilm's released BEiT-3 checkpoints."""
    state = {f"beit3.{k}": v.clone() for k, v in ts.state_dict().items()}
    g = torch.Generator().manual_seed(5)
    if head == "vqa":
        shapes = {"pooler.norm.weight": (DIM,), "pooler.norm.bias": (DIM,), "pooler.dense.weight": (DIM, DIM),
                  "pooler.dense.bias": (DIM,), "head.0.weight": (2 * DIM, DIM), "head.0.bias": (2 * DIM,),
                  "head.1.weight": (2 * DIM,), "head.1.bias": (2 * DIM,), "head.3.weight": (11, 2 * DIM),
                  "head.3.bias": (11,)}
        state.update({k: torch.randn(s, generator=g) for k, s in shapes.items()})
    return state


def test_released_checkpoint_conversion(tmp_path):
    ts = torchscale_beit3(normalize_output=False)
    src = tmp_path / "beit3_tiny_vqa.pth"
    torch.save({"model": _released_state(ts, "vqa")}, src)
    model, head, kind = convert_released(src, heads=HEADS)
    assert kind == "vqa" and head["head.3.weight"].shape == (11, 2 * DIM)
    assert max_diff(ts, model.eval(), "pair") < TOL
    out = tmp_path / "converted.safetensors"
    from foundation_tasks.vl_common.convert import main as convert_cli

    assert convert_cli([str(src), str(out), "--heads", str(HEADS)]) == 0  # what a user runs
    again = load_beit3(out).eval()
    assert max_diff(ts, again, "text") < TOL
    # the embedding of a converted file, at another resolution too
    from safetensors.torch import load_file

    prefix, emb_state = find_embedding(load_file(str(out)), str(out))
    assert prefix == ""
    bigger = BEiT3Embedding(VOCAB, DIM, 2 * IMG, PATCH, text_positions=22)
    load_embedding(bigger, emb_state, str(out))
    assert bigger.vision_pos.shape[0] == 1 + (2 * IMG // PATCH) ** 2


def test_released_checkpoint_errors(tmp_path):
    bad = tmp_path / "bad.pth"
    torch.save({"model": {"encoder.layers.0.fc1.weight": torch.zeros(2, 2)}}, bad)
    with pytest.raises(CheckpointError, match="not a BEiT-3 checkpoint"):
        convert_released(bad, heads=HEADS)
    state = _released_state(torchscale_beit3(), "")
    odd = tmp_path / "odd_dim.pth"
    torch.save(state, odd)
    with pytest.raises(CheckpointError, match="pass --heads"):
        convert_released(odd)


def test_resize_vision_pos_keeps_class_row():
    table = torch.randn(1 + 16, 8)
    out = resize_vision_pos(table, (6, 6))
    assert out.shape == (37, 8) and torch.equal(out[0], table[0])
    assert torch.equal(resize_vision_pos(table, (4, 4)), table)


def test_converted_vqa_model_answers_as_beit3(tmp_path):
    """A released VQA checkpoint, converted, loaded by our VQA task through `init_from` (backbone,
    embedding, and with `pretrained_head` the head), gives BEiT-3's logits: pooler (LN, dense,
    tanh) on the first token, then Linear, LN, GELU, Linear."""
    import torch.nn.functional as F

    from foundation_tasks.vl_common.convert import main as convert_cli

    ts = torchscale_beit3(normalize_output=False, vocab_size=49409)  # open_clip's ids + [MASK]
    state = _released_state(ts, "vqa")
    src, out = tmp_path / "vqa.pth", tmp_path / "vqa.safetensors"
    torch.save({"model": state}, src)
    assert convert_cli([str(src), str(out), "--heads", str(HEADS)]) == 0
    beit3 = load_beit3(out).eval()
    from foundation.engine.init import load_init_from
    from foundation.engine.model import ModelConfig, MultiTaskModel

    vqa = {"name": "vqa", "answers": [f"a{i}" for i in range(11)], "img_size": IMG, "patch_size": PATCH,
           "max_text_len": 16, "text_positions": 22}
    skipped = MultiTaskModel(ModelConfig(beit3.config.backbone, [vqa]))
    report = load_init_from(skipped, out, log=lambda s: None)
    assert report.skipped["heads.vqa.head.3.weight"] == "pretrained_head: false"
    assert "heads.vqa.embed.text_embed.weight" in report.loaded and not report.missing
    model = MultiTaskModel(ModelConfig(beit3.config.backbone, [{**vqa, "pretrained_head": True}])).eval()
    load_init_from(model, out, log=lambda s: None)
    head = model.heads["vqa"]
    images, text, pad, _ = batch()
    with torch.no_grad():
        ours = head.logits(model.backbone, {"images": images, "text_ids": text, "text_padding_mask": pad})
        x = ts(textual_tokens=text, visual_tokens=images, text_padding_position=pad)["encoder_out"][:, 0]
        s = state
        x = F.layer_norm(x, (DIM,), s["pooler.norm.weight"], s["pooler.norm.bias"])
        x = torch.tanh(F.linear(x, s["pooler.dense.weight"], s["pooler.dense.bias"]))
        x = F.linear(x, s["head.0.weight"], s["head.0.bias"])
        x = F.gelu(F.layer_norm(x, (2 * DIM,), s["head.1.weight"], s["head.1.bias"]))
        ref = F.linear(x, s["head.3.weight"], s["head.3.bias"])
    assert (ours - ref).abs().max() < TOL


def test_conv_stem_keeps_the_token_grid_and_default_layout():
    plain = BEiT3Embedding(100, 32, img_size=32, patch_size=8)
    stem = BEiT3Embedding(100, 32, img_size=32, patch_size=8, conv_stem=True)
    assert "patch_embed.proj.weight" in plain.state_dict()  # BEiT-3's layout unless asked
    assert not any(k.startswith("patch_embed.proj.weight") for k in stem.state_dict())
    images = torch.randn(2, 3, 32, 32)
    assert stem.vision(images).shape == plain.vision(images).shape == (2, 1 + 16, 32)
    # three stride-2 stages for 8 px patches: the stem sees pixels beyond one 8x8 patch
    strides = [m.stride[0] for m in stem.patch_embed.proj if isinstance(m, nn.Conv2d)]
    assert strides == [2, 2, 2, 1]
    with pytest.raises(Exception, match="power of two"):
        BEiT3Embedding(100, 32, img_size=36, patch_size=6, conv_stem=True)


def test_init_head_std():
    from foundation_tasks.vl_common.beit3 import init_head

    layer = nn.Linear(64, 64)
    init_head(layer)
    assert layer.weight.abs().max() <= 0.02 and layer.bias.abs().max() == 0
    init_head(layer, std=0.125)
    assert 0.05 < layer.weight.std() < 0.08 and layer.weight.abs().max() <= 0.125
