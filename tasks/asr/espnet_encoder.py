"""Our speech encoder behind ESPnet's ``AbsEncoder`` contract.

``MagnetoEncoder`` is the VGG front end plus the shared backbone, exactly the encoder of
the transducer head, so an ESPnet user plugs it into ``ESPnetASRModel`` (CTC, attention
or transducer decoders) like any ESPnet encoder::

    from espnet2.asr.ctc import CTC
    from espnet2.asr.espnet_model import ESPnetASRModel
    from tasks.asr.espnet_encoder import MagnetoEncoder

    encoder = MagnetoEncoder(80, dim=512, depth=18, heads=8, norm="magneto")
    model = ESPnetASRModel(vocab_size, token_list, frontend, specaug, normalize, None, encoder, None,
                           decoder, CTC(vocab_size, encoder.output_size()), None)

The keyword arguments are ``BackboneConfig`` fields (relative positions on by default,
as in the paper's speech encoder), so they also work as an ESPnet ``encoder_conf``.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from espnet2.asr.encoder.abs_encoder import AbsEncoder

from foundation.config import BackboneConfig
from foundation.embed import VGGSubsampling
from foundation.transformer import Backbone
from tasks.asr.model import encode


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
