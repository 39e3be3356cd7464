"""The BEiT v2 tokenizer converter, on a randomly initialised model of the released one's
layout: timm's ``Beit`` (BEiT's own ViT: q/v biases, mean-pooling ``fc_norm``) as the
encoder and the decoder, plus the quantizer and task layers of ``modeling_vqkd.VQKD``.
The converted tokenizer must compute what BEiT v2 computes: the same encoder features,
the same token ids, the same decoder output."""
from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from timm.models.beit import Beit
from torch import nn

from foundation.checkpoint import CheckpointError
from foundation_tasks.vision_common.tokenizer import load_tokenizer
from foundation_tasks.vision_common.transforms import MEAN, STD
from foundation_tasks.vq_tokenizer.convert import convert, from_beit2

IMG, PATCH, DIM, CODES, CODE_DIM, DEC_DIM = 32, 8, 64, 48, 8, 32


def beit(img_size: int, patch_size: int, in_chans: int, dim: int, depth: int) -> Beit:
    """BEiT v2's VisionTransformer as VQKD builds it: abs. positions, no rel. pos, no layer
    scale, mean pooling (fc_norm), LayerNorm eps 1e-6, no head."""
    return Beit(img_size=img_size, patch_size=patch_size, in_chans=in_chans, num_classes=0, embed_dim=dim,
                depth=depth, num_heads=dim // 32, use_abs_pos_emb=True, use_rel_pos_bias=False, init_values=None,
                global_pool="avg", qkv_bias=True, norm_layer=functools.partial(nn.LayerNorm, eps=1e-6)).eval()


def task_layer(d_in: int, d_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_in, d_in), nn.Tanh(), nn.Linear(d_in, d_out))


@pytest.fixture(scope="module")
def released():
    """(state dict in BEiT v2's layout, the modules that define what it computes)."""
    torch.manual_seed(0)
    encoder = beit(IMG, PATCH, 3, DIM, 2)
    decoder = beit(IMG // PATCH, 1, CODE_DIM, DEC_DIM, 1)
    for m in (encoder, decoder):  # non-zero q/v biases, so the bias mapping is exercised
        for name, p in m.named_parameters():
            if name.endswith(("q_bias", "v_bias")):
                nn.init.normal_(p, std=0.1)
    enc_task, dec_task = task_layer(DIM, CODE_DIM), task_layer(DEC_DIM, 24)
    codebook = F.normalize(torch.randn(CODES, CODE_DIM), dim=-1)
    state = {f"encoder.{k}": v for k, v in encoder.state_dict().items()}
    state.update({f"decoder.{k}": v for k, v in decoder.state_dict().items()})
    state.update({f"encode_task_layer.{k}": v for k, v in enc_task.state_dict().items()})
    state.update({f"decode_task_layer.{k}": v for k, v in dec_task.state_dict().items()})
    state.update({
        "quantize.embedding.weight": codebook, "quantize.embedding.cluster_size": torch.rand(CODES),
        "quantize.embedding.embed_avg": torch.randn(CODES, CODE_DIM), "quantize.embedding.initted": torch.ones(1),
        "quantize.cluster_size": torch.rand(CODES),
        "teacher_model.visual.proj": torch.randn(4, 4), "scaling_layer.shift": torch.zeros(1, 3, 1, 1),
    })
    return state, (encoder, decoder, enc_task, dec_task, codebook)


def test_converted_tokenizer_computes_what_beit2_computes(released, tmp_path):
    state, (encoder, decoder, enc_task, dec_task, codebook) = released
    # head counts are not in the weights: BEiT v2 base has width / 64 (the default); ours differ
    path = convert(state, tmp_path / "beit2.safetensors", heads=DIM // 32, decoder_heads=DEC_DIM // 32,
                   log=lambda s: None)
    tok = load_tokenizer(path)
    assert tok.backbone.config.norm == "preln" and tok.head.input_norm == "unit"
    images01 = torch.rand(3, 3, IMG, IMG)
    ours_in = (images01 - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]
    with torch.no_grad():
        # BEiT v2: [-1, 1] input, patch tokens after fc_norm, task layer, l2-normalise, nearest code
        theirs = encoder.fc_norm(encoder.forward_features(images01 * 2 - 1)[:, 1:])
        ours = tok.backbone(tok.head.embed(tok.head._input(ours_in))[0])[:, 1:]
        torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=1e-4)
        z = F.normalize(enc_task(theirs), dim=-1)
        d = z.pow(2).sum(-1, keepdim=True) + codebook.pow(2).sum(-1) - 2 * z @ codebook.t()
        assert torch.equal(tok(ours_in), d.argmin(-1))
        # the decoder: codes as a (B, d, h, w) map through a 1x1 "patch embedding"
        q = codebook[d.argmin(-1)]
        grid = IMG // PATCH
        q_map = q.transpose(1, 2).reshape(3, CODE_DIM, grid, grid)
        rec_theirs = dec_task(decoder.fc_norm(decoder.forward_features(q_map)[:, 1:]))
        torch.testing.assert_close(tok.head.decode(q), rec_theirs, atol=2e-5, rtol=1e-4)


def test_converter_reports_and_refuses(released):
    state, _ = released
    converted, ignored = from_beit2(state)
    assert set(ignored) == {"teacher_model.visual.proj", "scaling_layer.shift", "quantize.embedding.cluster_size",
                            "quantize.embedding.embed_avg"}
    bias = converted["backbone.encoder.layers.0.attn.qkv.bias"]
    assert torch.equal(bias[DIM: 2 * DIM], torch.zeros(DIM))  # BEiT has no key bias
    assert torch.equal(bias[:DIM], state["encoder.blocks.0.attn.q_bias"])
    with pytest.raises(CheckpointError, match="does not know: encoder.blocks.0.attn.relative_position_bias_table"):
        from_beit2({**state, "encoder.blocks.0.attn.relative_position_bias_table": torch.zeros(3, 2)})
