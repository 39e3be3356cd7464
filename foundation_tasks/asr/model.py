"""Transformer-Transducer around the shared backbone (Magneto Sec. 6; Zhang et al. 2020).

    fbank (B, L, 80) -> global CMVN -> SpecAugment (training) -> VGG front end (L/4 frames)
      -> backbone (relative positions, padding mask) -> enc (B, T, D)
    [blank] + targets -> 2-layer LSTM predictor -> dec (B, U + 1, H)
    joint(enc, dec) = lin_out(tanh(lin_enc(enc) + lin_dec(dec))) -> RNN-T loss

plus the auxiliary losses of Boyer et al. (2021): CTC on the encoder output, and an
auxiliary transducer loss on chosen intermediate layers, each through a small MLP into
the shared joint network whose parameters that loss does not update. The predictor,
joint network and SpecAugment are ESPnet's own modules, so ESPnet's transducer beam
search runs on them unchanged.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from foundation.embed import VGGSubsampling
from foundation_tasks.asr.transducer import BLANK, transducer_loss
from foundation_tasks.speech_common.cmvn import GlobalCMVN, padding_mask


def encode(frontend: VGGSubsampling, backbone: nn.Module, feats: torch.Tensor, lengths: torch.Tensor,
           return_layers: Sequence[int] = ()) -> tuple[torch.Tensor, torch.Tensor, dict[int, torch.Tensor]]:
    """Features (B, L, F) and their lengths -> (encoder output (B, T, D), lengths (B,),
    {layer: hidden}). Shared by the transducer head and the ESPnet ``AbsEncoder``."""
    x, out_lens = frontend(feats, lengths)
    out, hidden = backbone(x, padding_mask=padding_mask(out_lens, x.shape[1]), return_layers=list(return_layers))
    return out, out_lens, hidden


class TransducerHead(nn.Module):
    """Everything the ASR task adds around the shared backbone; ``head(backbone, batch)``
    returns (loss, logs). Batch: ``feats`` (B, L, F) float, ``feat_lens`` (B,),
    ``targets`` (B, U) token ids padded with 0, ``target_lens`` (B,)."""

    def __init__(self, *, dim: int, vocab_size: int, num_mel_bins: int = 80, vgg_channels: Sequence[int] = (64, 128),
                 predictor_embed_dim: int = 512, predictor_dim: int = 1024, predictor_layers: int = 2,
                 predictor_dropout: float = 0.1, joint_dim: int = 512, joint_sub_batch: int = 0,
                 ctc_weight: float = 0.3, aux_transducer_weight: float = 0.2, aux_layers: Iterable[int] = (),
                 aux_mlp_dim: int = 256, aux_mlp_dropout: float = 0.1, specaug: dict | None = None,
                 rnnt_start: int = 0, utterance_mean: bool = False):
        super().__init__()
        from espnet2.asr_transducer.decoder.rnn_decoder import RNNDecoder
        from espnet2.asr_transducer.joint_network import JointNetwork

        self.vocab_size = vocab_size  # output units, blank (0) included
        self.cmvn = GlobalCMVN(num_mel_bins, utterance_mean=utterance_mean)
        self.specaug = _specaug(specaug) if specaug else None
        self.frontend = VGGSubsampling(num_mel_bins, dim, tuple(vgg_channels))
        self.predictor = RNNDecoder(vocab_size, embed_size=predictor_embed_dim, hidden_size=predictor_dim,
                                    rnn_type="lstm", num_layers=predictor_layers, dropout_rate=predictor_dropout,
                                    embed_dropout_rate=predictor_dropout, embed_pad=BLANK)
        self.joint = JointNetwork(vocab_size, dim, predictor_dim, joint_space_size=joint_dim,
                                  joint_activation_type="tanh")
        self.joint_sub_batch = joint_sub_batch
        self.ctc_weight = ctc_weight
        self.ctc = nn.Linear(dim, vocab_size) if ctc_weight > 0 else None
        self.aux_layers = list(aux_layers)
        self.aux_weight = aux_transducer_weight if self.aux_layers else 0.0
        # Boyer et al. 2021 / ESPnet: Linear - LayerNorm - Dropout - ReLU - Linear into the joint space
        self.aux_mlp = nn.Sequential(
            nn.Linear(dim, aux_mlp_dim), nn.LayerNorm(aux_mlp_dim), nn.Dropout(aux_mlp_dropout), nn.ReLU(),
            nn.Linear(aux_mlp_dim, joint_dim),
        ) if self.aux_weight > 0 else None
        self.register_buffer("tokenizer_crc", torch.zeros((), dtype=torch.long))  # which tokenizer the ids are
        # CTC alone for the first rnnt_start training forwards (counted in a buffer, so resuming keeps it)
        self.rnnt_start = rnnt_start
        if rnnt_start > 0:
            if self.ctc is None:
                raise ValueError("rnnt_start > 0 trains CTC alone first: it needs ctc_weight > 0")
            self.register_buffer("updates", torch.zeros((), dtype=torch.long))

    def encode(self, backbone: nn.Module, feats: torch.Tensor, feat_lens: torch.Tensor,
               return_layers: Sequence[int] = ()):
        x = self.cmvn(feats, feat_lens)
        if self.training and self.specaug is not None:
            x, _ = self.specaug(x, feat_lens)  # normalised first: masks hold the mean
        return encode(self.frontend, backbone, x, feat_lens, return_layers)

    def predict(self, targets: torch.Tensor) -> torch.Tensor:
        """[blank] + targets -> predictor output (B, U + 1, H)."""
        self.predictor.set_device(targets.device)
        # outside autocast: under bf16 autocast cuDNN's LSTM is cast to fp16 (no loss scaling
        # here), and the predictor is small
        with torch.autocast(targets.device.type, enabled=False):
            return self.predictor(F.pad(targets, (1, 0), value=BLANK))

    def losses(self, backbone: nn.Module, batch: dict, transducer: bool = True) -> dict[str, torch.Tensor]:
        """Per-utterance means of every loss term (before weighting); ``transducer=False``: CTC only."""
        aux = self.aux_layers if self.training and transducer else ()
        enc, enc_lens, hidden = self.encode(backbone, batch["feats"], batch["feat_lens"], aux)
        return self.losses_from(enc, enc_lens, hidden, batch, transducer)

    def losses_from(self, enc: torch.Tensor, enc_lens: torch.Tensor, hidden: dict[int, torch.Tensor],
                    batch: dict, transducer: bool = True) -> dict[str, torch.Tensor]:
        # (RNN-T emits any number of units per frame, so U > T is fine; CTC's zero_infinity
        # drops an utterance too short for its transcript)
        targets, tgt_lens = batch["targets"], batch["target_lens"]
        B = targets.shape[0]
        out = {}
        if transducer:
            dec = self.predict(targets)
            act, lin_out = self.joint.joint_activation, self.joint.lin_out
            out["rnnt"] = transducer_loss(self.joint.lin_enc(enc), self.joint.lin_dec(dec), lin_out, act, targets,
                                          enc_lens, tgt_lens, sub_batch=self.joint_sub_batch) / B
        if self.ctc is not None:
            logp = self.ctc(enc).float().log_softmax(-1).transpose(0, 1)
            out["ctc"] = F.ctc_loss(logp, targets, enc_lens, tgt_lens, blank=BLANK, reduction="sum",
                                    zero_infinity=True) / B
        if self.aux_weight > 0 and hidden and transducer:
            # the joint network is shared but not trained by this loss (ESPnet's TransducerTasks)
            lin_dec = self.joint.lin_dec
            dec_proj = F.linear(dec, lin_dec.weight.detach(), None if lin_dec.bias is None else lin_dec.bias.detach())
            aux = sum(transducer_loss(self.aux_mlp(hidden[i]), dec_proj, lin_out, act, targets, enc_lens, tgt_lens,
                                      sub_batch=self.joint_sub_batch, frozen_output=True)
                      for i in self.aux_layers)
            out["aux_rnnt"] = aux / (B * len(self.aux_layers))
        return out

    def weighted(self, losses: dict[str, torch.Tensor]) -> torch.Tensor:
        loss = losses.get("rnnt", 0.0)
        if "ctc" in losses:
            loss = loss + self.ctc_weight * losses["ctc"]
        if "aux_rnnt" in losses:
            loss = loss + self.aux_weight * losses["aux_rnnt"]
        return loss

    def forward(self, backbone: nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
        transducer = True
        if self.training and self.rnnt_start > 0:
            transducer = int(self.updates) >= self.rnnt_start
            self.updates += 1
        losses = self.losses(backbone, batch, transducer)
        logs = {k: v.detach() for k, v in losses.items()}
        logs["utts"] = float(batch["targets"].shape[0])  # the engine counts buckets as samples
        if self.training and self.rnnt_start > 0:  # the loss changes form here: the studies judge each phase apart
            logs["phase"] = float(transducer)
        return self.weighted(losses), logs


def _specaug(cfg: dict) -> nn.Module:
    """ESPnet's SpecAug: frequency masks of width up to F, time masks of up to a ratio of
    the utterance (the "adaptive" masks of Park et al. 2020), no time warp (Table 15)."""
    from espnet2.asr.specaug.specaug import SpecAug

    return SpecAug(apply_time_warp=False, apply_freq_mask=cfg["freq_masks"] > 0,
                   freq_mask_width_range=(0, cfg["freq_mask_width"]), num_freq_mask=cfg["freq_masks"],
                   apply_time_mask=cfg["time_masks"] > 0,
                   time_mask_width_ratio_range=(0.0, cfg["time_mask_ratio"]), num_time_mask=cfg["time_masks"])
