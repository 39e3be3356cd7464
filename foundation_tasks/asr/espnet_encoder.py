"""Our speech encoder behind ESPnet's ``AbsEncoder`` contract.

``MagnetoEncoder`` is the VGG front end plus the shared backbone, exactly the encoder of
the transducer head, so an ESPnet user plugs it into ``ESPnetASRModel`` (CTC, attention
or transducer decoders) like any ESPnet encoder::

    from espnet2.asr.ctc import CTC
    from espnet2.asr.espnet_model import ESPnetASRModel
    from foundation_tasks.asr.espnet_encoder import MagnetoEncoder

    encoder = MagnetoEncoder(80, dim=512, depth=18, heads=8, norm="magneto")
    model = ESPnetASRModel(vocab_size, token_list, frontend, specaug, normalize, None, encoder, None,
                           decoder, CTC(vocab_size, encoder.output_size()), None)

The keyword arguments are ``BackboneConfig`` fields (relative positions on by default,
as in the paper's speech encoder), so they also work as an ESPnet ``encoder_conf``.

ESPnet's config-driven training names encoders in ``espnet2.tasks.asr.encoder_choices``;
``register_in_espnet()`` adds ``magneto`` there, after which an ESPnet config says::

    encoder: magneto
    encoder_conf: {dim: 256, depth: 12, heads: 4, norm: magneto}

``python -m foundation_tasks.asr.espnet_train --config conf/train_asr_magneto.yaml ...`` is ESPnet's
``python -m espnet2.bin.asr_train`` with that registration done first.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from espnet2.asr.encoder.abs_encoder import AbsEncoder

from foundation.config import BackboneConfig
from foundation.embed import VGGSubsampling
from foundation.transformer import Backbone
from foundation_tasks.asr.model import encode


class MagnetoEncoder(AbsEncoder):
    """``forward(xs_pad (B, L, input_size), ilens (B,)) -> (out (B, T, dim), olens (B,), None)``
    with T = ceil(ceil(L / 2) / 2): 10 ms frames in, 40 ms out."""

    def __init__(self, input_size: int = 80, vgg_channels: Sequence[int] = (64, 128),
                 config: Optional[BackboneConfig] = None, **backbone_fields):
        super().__init__()
        if config is None:
            config = BackboneConfig.from_dict({"rel_pos": "1d", **backbone_fields}, where="MagnetoEncoder")
        elif backbone_fields:
            raise TypeError("pass either config or BackboneConfig fields, not both")
        self.frontend = VGGSubsampling(input_size, config.dim, tuple(vgg_channels))
        self.backbone = Backbone(config)

    @classmethod
    def from_modules(cls, frontend: VGGSubsampling, backbone: Backbone) -> "MagnetoEncoder":
        """Wrap (not copy) a trained front end and backbone, e.g. ``model.heads["asr"].frontend``
        and ``model.backbone`` of a checkpoint of ours."""
        enc = cls.__new__(cls)
        AbsEncoder.__init__(enc)
        enc.frontend, enc.backbone = frontend, backbone
        return enc

    def output_size(self) -> int:
        return self.backbone.dim

    def forward(self, xs_pad: torch.Tensor, ilens: torch.Tensor,
                prev_states: torch.Tensor = None) -> tuple[torch.Tensor, torch.Tensor, None]:
        if prev_states is not None:
            raise ValueError("MagnetoEncoder is not a streaming encoder: prev_states must be None")
        out, olens, _ = encode(self.frontend, self.backbone, xs_pad, ilens)
        return out, olens, None


def register_in_espnet(name: str = "magneto") -> None:
    """Make ``encoder: magneto`` (``--encoder magneto``) a choice of ESPnet's ASR task, for
    its parser, its config files and ``ASRTask.build_model``. Imports ``espnet2.tasks.asr``
    (ESPnet's whole task stack: ~20 s on a CPU), so nothing calls it at import."""
    from espnet2.tasks.asr import encoder_choices

    known = encoder_choices.classes.get(name)
    if known is not None and known is not MagnetoEncoder:
        raise ValueError(f"ESPnet's ASR encoder {name!r} is already {known.__qualname__}")
    encoder_choices.classes[name] = MagnetoEncoder
