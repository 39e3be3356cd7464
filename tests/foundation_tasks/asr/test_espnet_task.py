"""`encoder: magneto` in ESPnet's config-driven ASR task, as an ESPnet user writes it: a
YAML config parsed by ASRTask's own parser, the model built by ASRTask.build_model
(ESPnet's frontend, SpecAug, CTC + attention decoder around our encoder), one loss."""
from __future__ import annotations

import pytest
import torch
import yaml

pytestmark = pytest.mark.usefixtures("one_thread")

CONFIG = {
    "encoder": "magneto",
    "encoder_conf": {"dim": 32, "depth": 2, "heads": 4, "norm": "magneto", "vgg_channels": [8, 16]},
    "decoder": "transformer",
    "decoder_conf": {"attention_heads": 4, "linear_units": 64, "num_blocks": 1},
    "model_conf": {"ctc_weight": 0.3, "lsm_weight": 0.1},
    "frontend_conf": {"n_fft": 400, "hop_length": 160, "n_mels": 80},
    "specaug": "specaug",
    "specaug_conf": {"apply_time_warp": False, "freq_mask_width_range": [0, 10], "num_freq_mask": 1,
                     "time_mask_width_range": [0, 10], "num_time_mask": 1},
    "normalize": "utterance_mvn",
}


def test_asr_task_builds_and_trains_with_encoder_magneto(tmp_path):
    from espnet2.tasks.asr import ASRTask

    from foundation_tasks.asr.espnet_encoder import MagnetoEncoder, register_in_espnet

    register_in_espnet()  # the one line
    (tmp_path / "train_asr_magneto.yaml").write_text(yaml.safe_dump(CONFIG))
    tokens = ["<blank>", "<unk>", "a", "b", "c", "<sos/eos>"]
    (tmp_path / "tokens.txt").write_text("\n".join(tokens) + "\n")
    args = ASRTask.get_parser().parse_args(["--config", str(tmp_path / "train_asr_magneto.yaml"),
                                            "--token_list", str(tmp_path / "tokens.txt"),
                                            "--output_dir", str(tmp_path / "exp")])
    assert args.encoder == "magneto"
    torch.manual_seed(0)
    model = ASRTask.build_model(args)
    assert isinstance(model.encoder, MagnetoEncoder) and model.encoder.backbone.config.norm == "magneto"
    assert model.encoder.backbone.config.rel_pos == "1d"  # the paper's speech encoder default
    speech = torch.randn(2, 16000)  # 1 s of 16 kHz audio -> 101 frames -> 26 encoder frames
    lengths = torch.tensor([16000, 12000])
    text = torch.tensor([[2, 3, 4], [4, 2, -1]])
    loss, stats, _ = model(speech, lengths, text, torch.tensor([3, 2]))
    assert torch.isfinite(loss) and stats["loss_ctc"] is not None and stats["loss_att"] is not None
    loss.backward()
    assert model.encoder.backbone.encoder.layers[0].attn.qkv.weight.grad.abs().sum() > 0
    # ESPnet's own error for a name it does not know is unchanged
    with pytest.raises(SystemExit):
        ASRTask.get_parser().parse_args(["--encoder", "no_such_encoder"])


def test_register_refuses_to_shadow_another_encoder():
    from espnet2.tasks.asr import encoder_choices

    from foundation_tasks.asr.espnet_encoder import register_in_espnet

    with pytest.raises(ValueError, match="already"):
        register_in_espnet("conformer")
    assert encoder_choices.classes["conformer"].__name__ == "ConformerEncoder"
