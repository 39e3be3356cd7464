"""The transducer head: VGG lengths, ESPnet's AbsEncoder contract, decoding, errors."""
from __future__ import annotations

import pytest
import torch

from foundation.config import BackboneConfig
from foundation.embed import VGGSubsampling
from foundation.transformer import Backbone
from foundation_tasks.asr.decode import beam_search, greedy_search
from foundation_tasks.asr.espnet_encoder import MagnetoEncoder
from foundation_tasks.asr.model import TransducerHead


@pytest.mark.parametrize("L", [1, 2, 3, 5, 7, 9, 11, 13, 37, 101])
def test_vgg_output_lengths_match_frames(L):
    vgg = VGGSubsampling(80, 16, (4, 8))
    out, lens = vgg(torch.randn(1, L, 80), torch.tensor([L]))
    assert out.shape[1] == int(lens[0]) == -(-(-(-L // 2)) // 2)
    # in a batch padded to an odd length, the longest utterance sets the frames
    batch, lens = vgg(torch.randn(3, L + 2, 80), torch.tensor([L + 2, L, 1]))
    assert batch.shape[1] == int(lens.max())
    assert lens.tolist() == VGGSubsampling.output_lengths(torch.tensor([L + 2, L, 1])).tolist()


def tiny_backbone(norm="magneto", depth=2):
    return Backbone(BackboneConfig(dim=32, depth=depth, heads=4, ffn_dim=64, norm=norm, rel_pos="1d"))


def tiny_head(**kw):
    args = dict(dim=32, vocab_size=7, vgg_channels=(4, 8), predictor_embed_dim=16, predictor_dim=24, joint_dim=20,
                aux_layers=[0], aux_mlp_dim=16, specaug=None)
    return TransducerHead(**{**args, **kw})


def tiny_batch(B=3, L=41, U=4, V=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor([L, L - 6, L - 13][:B])
    tl = torch.tensor([U, U - 1, 2][:B])
    targets = torch.randint(1, V, (B, U), generator=g) * (torch.arange(U)[None] < tl[:, None])
    return {"feats": torch.randn(B, L, 80, generator=g), "feat_lens": lens, "targets": targets, "target_lens": tl,
            "ids": [f"u{i}" for i in range(B)]}


def test_head_losses_and_sub_batching_agree():
    torch.manual_seed(0)
    backbone, head = tiny_backbone(), tiny_head(ctc_weight=0.3, aux_transducer_weight=0.2, joint_sub_batch=0)
    head.train()
    for m in (head, backbone):  # dropout off: two forwards must match
        for mod in m.modules():
            if isinstance(mod, torch.nn.Dropout):
                mod.p = 0.0
    batch = tiny_batch()
    grads = []
    for sub in (0, 1):
        head.joint_sub_batch = sub
        loss, logs = head(backbone, batch)
        assert set(logs) == {"rnnt", "ctc", "aux_rnnt", "utts"}
        backbone.zero_grad(), head.zero_grad()
        loss.backward()
        params = list(backbone.parameters()) + list(head.parameters())
        grads.append([p.grad.clone() for p in params if p.grad is not None])
        assert torch.isfinite(loss)
    assert len(grads[0]) == len(grads[1])
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_aux_loss_does_not_train_the_joint_network():
    torch.manual_seed(0)
    backbone, head = tiny_backbone(), tiny_head(ctc_weight=0.0, aux_transducer_weight=1.0, joint_sub_batch=2)
    head.train()
    losses = head.losses(backbone, tiny_batch())
    losses["aux_rnnt"].backward()
    assert all(p.grad is None or not p.grad.any() for p in head.joint.parameters())
    assert head.aux_mlp[0].weight.grad.abs().sum() > 0
    assert backbone.encoder.layers[0].mlp.fc1.weight.grad.abs().sum() > 0  # reaches the layer it taps
    assert backbone.encoder.layers[1].mlp.fc1.weight.grad is None  # and not the layers above it


def test_greedy_and_beam_search_return_unit_ids():
    """Shapes and ranges on an untrained model (decoding quality: test_asr_train.py)."""
    torch.manual_seed(0)
    backbone, head = tiny_backbone(), tiny_head()
    head.eval()
    batch = tiny_batch(L=25)
    with torch.no_grad():
        enc, enc_lens, _ = head.encode(backbone, batch["feats"], batch["feat_lens"])
        greedy = greedy_search(head.predictor, head.joint, enc, enc_lens, max_symbols=3)
        beam = beam_search(head.predictor, head.joint, enc, enc_lens, beam_size=1)
        beam4 = beam_search(head.predictor, head.joint, enc, enc_lens, beam_size=4, search_type="maes")
    assert len(greedy) == len(beam) == len(beam4) == 3
    assert all(all(0 < t < 7 for t in h) for h in greedy + beam + beam4)


def test_magneto_encoder_is_an_espnet_encoder_in_espnet_asr_model():
    """ESPnet's own CTC/attention model with our encoder: forward, loss, gradients into the
    backbone; and a CTC-only model (ESPnet's transducer branch needs warp-transducer)."""
    from espnet2.asr.ctc import CTC
    from espnet2.asr.decoder.transformer_decoder import TransformerDecoder
    from espnet2.asr.encoder.abs_encoder import AbsEncoder
    from espnet2.asr.espnet_model import ESPnetASRModel
    from espnet2.asr.specaug.specaug import SpecAug

    torch.manual_seed(0)
    vocab = 9
    tokens = ["<blank>", "<unk>", "a", "b", "c", "d", "e", "f", "<sos/eos>"]
    encoder = MagnetoEncoder(80, vgg_channels=(4, 8), dim=32, depth=2, heads=4, ffn_dim=64, norm="magneto")
    assert isinstance(encoder, AbsEncoder) and encoder.output_size() == 32
    speech = torch.randn(2, 57, 80)
    speech_lengths = torch.tensor([57, 40])
    out, olens, states = encoder(speech, speech_lengths)
    assert out.shape == (2, 15, 32) and olens.tolist() == [15, 10] and states is None
    text = torch.tensor([[2, 3, 4], [5, 6, -1]])
    text_lengths = torch.tensor([3, 2])
    specaug = SpecAug(apply_time_warp=False, freq_mask_width_range=(0, 27), num_freq_mask=2,
                      time_mask_width_ratio_range=(0.0, 0.04), num_time_mask=10)
    hybrid = ESPnetASRModel(
        vocab, tokens, None, specaug, None, None, encoder, None,
        TransformerDecoder(vocab, 32, attention_heads=4, linear_units=64, num_blocks=1),
        CTC(vocab, 32), None, ctc_weight=0.3, report_cer=False, report_wer=False,
    )
    loss, stats, _ = hybrid(speech, speech_lengths, text.clone(), text_lengths)
    loss.backward()
    assert torch.isfinite(loss) and stats["loss_att"] is not None and stats["loss_ctc"] is not None
    assert encoder.backbone.encoder.layers[0].attn.qkv.weight.grad.abs().sum() > 0
    ctc_only = ESPnetASRModel(vocab, tokens, None, None, None, None,
                              MagnetoEncoder(80, vgg_channels=(4, 8), dim=32, depth=2, heads=4, norm="preln"),
                              None, None, CTC(vocab, 32), None, ctc_weight=1.0, report_cer=False, report_wer=False)
    loss, stats, _ = ctc_only(speech, speech_lengths, text.clone(), text_lengths)
    assert torch.isfinite(loss)


def test_magneto_encoder_wraps_a_trained_head():
    backbone, head = tiny_backbone(), tiny_head()
    encoder = MagnetoEncoder.from_modules(head.frontend, backbone).eval()
    backbone.eval(), head.eval()
    feats, lens = torch.randn(2, 30, 80), torch.tensor([30, 22])
    feats[1, 22:] = 0.0  # padding as the collate writes it (the head's CMVN zeroes it too)
    with torch.no_grad():
        out, olens, _ = encoder(feats, lens)
        ref, ref_lens, _ = head.encode(backbone, feats, lens)  # the head also normalises (CMVN = identity here)
    assert torch.allclose(out, ref) and olens.tolist() == ref_lens.tolist()



def test_rnnt_start_trains_ctc_alone_first():
    """rnnt_start=2: the first two training forwards give CTC alone (no gradient reaches the
    predictor or joint network), the third both; evaluation always has the transducer loss and
    does not count; the count is a buffer, so a checkpoint (resume) carries it."""
    torch.manual_seed(0)
    backbone, head = tiny_backbone(), tiny_head(ctc_weight=0.5, aux_layers=[], rnnt_start=2)
    batch = tiny_batch()
    head.eval()
    _, logs = head(backbone, batch)
    assert "rnnt" in logs and int(head.updates) == 0
    head.train()
    for step in range(3):
        head.zero_grad()
        loss, logs = head(backbone, batch)
        loss.backward()
        transducer = step >= 2
        assert ("rnnt" in logs) is transducer
        assert (head.predictor.embed.weight.grad is not None) is transducer
        assert (head.joint.lin_out.weight.grad is not None) is transducer
        assert head.ctc.weight.grad is not None
        if not transducer:
            assert torch.allclose(loss, 0.5 * logs["ctc"])
    assert int(head.state_dict()["updates"]) == 3
    with pytest.raises(ValueError, match="ctc_weight"):
        tiny_head(ctc_weight=0.0, aux_layers=[], rnnt_start=2)


def test_rnnt_start_config_checks():
    from foundation.config import ConfigError
    from foundation_tasks.asr.task import ASRConfig

    assert ASRConfig(rnnt_start=300, ctc_weight=0.5).rnnt_start == 300
    with pytest.raises(ConfigError, match="rnnt_start.*ctc_weight"):
        ASRConfig(rnnt_start=300, ctc_weight=0.0)
    with pytest.raises(ConfigError, match="rnnt_start"):
        ASRConfig(rnnt_start=-1)
