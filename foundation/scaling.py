"""The four residual / normalisation rules, each described once (``RULES``), and the
papers' formulas for their residual weights (alpha) and init gains (gamma / beta).

Block, attention, feed-forward and stack read a ``NormRule``; none branches on a rule's
name. The formulas are pure functions of the architecture and depths, so a test can check
them against the papers' tables:

* Magneto (Sub-LN), Magneto paper Fig. 2 / Sec. 3.2:
  encoder-only gamma = sqrt(log 2N); decoder-only gamma = sqrt(log 2M);
  encoder-decoder: encoder sqrt(1/3 log 3M log 2N), decoder sqrt(log 3M).
* DeepNorm, DeepNet paper Sec. 3.3 / Fig. 1 (x = LN(alpha x + G(x)), weights times beta):
  encoder-only alpha=(2N)^1/4, beta=(8N)^-1/4; decoder-only alpha=(2M)^1/4, beta=(8M)^-1/4;
  encoder-decoder: encoder alpha=0.81 (N^4 M)^1/16, beta=0.87 (N^4 M)^-1/16,
  decoder alpha=(3M)^1/4, beta=(12M)^-1/4.
* Pre-LN / Post-LN: alpha = 1, gain = 1.

The official implementation (torchscale 0.3.0) uses 1/1.15 instead of 0.87 for the
encoder beta of an encoder-decoder; ``variant="torchscale"`` reproduces that.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

ARCHS = ("encoder", "decoder", "encoder_decoder")


class StackScales(NamedTuple):
    """What one stack (encoder or decoder) of a model is built with."""

    alpha: float  # weight of the residual (shortcut) branch
    gain: float  # multiplier of W_v, W_o, W_1, W_2 after the standard init


def magneto_gamma(arch: str, n_enc: int = 0, n_dec: int = 0) -> tuple[float | None, float | None]:
    """(encoder gamma, decoder gamma) of Magneto's init; None for an absent stack."""
    _check(arch, n_enc, n_dec)
    if arch == "encoder":
        return math.sqrt(math.log(2 * n_enc)), None
    if arch == "decoder":
        return None, math.sqrt(math.log(2 * n_dec))
    enc = math.sqrt(math.log(3 * n_dec) * math.log(2 * n_enc) / 3)
    return enc, math.sqrt(math.log(3 * n_dec))


def deepnorm_alpha(arch: str, n_enc: int = 0, n_dec: int = 0) -> tuple[float | None, float | None]:
    """(encoder alpha, decoder alpha) of DeepNorm's residual connection."""
    _check(arch, n_enc, n_dec)
    if arch == "encoder":
        return (2 * n_enc) ** 0.25, None
    if arch == "decoder":
        return None, (2 * n_dec) ** 0.25
    return 0.81 * (n_enc**4 * n_dec) ** (1 / 16), (3 * n_dec) ** 0.25


def deepnorm_beta(
    arch: str, n_enc: int = 0, n_dec: int = 0, variant: str = "paper"
) -> tuple[float | None, float | None]:
    """(encoder beta, decoder beta) of DeepNorm's init.

    variant="torchscale": the encoder of an encoder-decoder uses (N^4 M)^-1/16 / 1.15
    (torchscale 0.3.0, ``encoder.py``) instead of the paper's 0.87 (N^4 M)^-1/16.
    """
    _check(arch, n_enc, n_dec)
    if variant not in ("paper", "torchscale"):
        raise ValueError(f"init_variant must be 'paper' or 'torchscale', got {variant!r}")
    if arch == "encoder":
        return (8 * n_enc) ** -0.25, None
    if arch == "decoder":
        return None, (8 * n_dec) ** -0.25
    factor = 0.87 if variant == "paper" else 1 / 1.15
    return factor * (n_enc**4 * n_dec) ** (-1 / 16), (12 * n_dec) ** -0.25


# (arch, n_enc, n_dec, variant) -> (encoder value, decoder value); None for an absent stack
Formula = Callable[[str, int, int, str], tuple[Optional[float], Optional[float]]]


@dataclass(frozen=True)
class NormRule:
    """One residual / normalisation rule, as one stack (encoder or decoder) applies it.

    ``RULES`` holds each rule's description; ``stack_rules`` fills in ``alpha``, ``gain`` and
    ``final_norm`` for the stacks of one model.
    """

    name: str
    pre_norm: bool  # x + f(LN(x)) (True); LN(alpha x + f(x)) (False)
    sub_ln: bool  # Magneto's Sub-LN: a LayerNorm inside f, before W_o and before W_2
    final_norm: bool  # a LayerNorm after the last layer (a post-norm layer already ends in one)
    scale_cross: bool  # the init gain applies to cross-attention's W_v, W_o too
    alphas: Optional[Formula] = dataclasses.field(default=None, repr=False)  # None: alpha = 1
    gains: Optional[Formula] = dataclasses.field(default=None, repr=False)  # None: gain = 1
    alpha: float = 1.0  # weight of the shortcut (residual) branch
    gain: float = 1.0  # multiplier of W_v, W_o, W_1, W_2 after the standard init


RULES: dict[str, NormRule] = {
    # x + f(LN(x)), then a final LN (ViT, GPT)
    "preln": NormRule("preln", pre_norm=True, sub_ln=False, final_norm=True, scale_cross=True),
    # LN(alpha x + f(x)), alpha = residual_scale or 1 (BERT; FoundationLayerNorm: 0.974)
    "postln": NormRule("postln", pre_norm=False, sub_ln=False, final_norm=False, scale_cross=True),
    # x + f(LN(x)) with Sub-LN inside f, W_v/W_o/W_1/W_2 init times gamma; the decoder's
    # cross-attention keeps only its input LN and is not scaled (Magneto Sec. 2)
    "magneto": NormRule("magneto", pre_norm=True, sub_ln=True, final_norm=True, scale_cross=False,
                        gains=lambda arch, n_enc, n_dec, variant: magneto_gamma(arch, n_enc, n_dec)),
    # LN(alpha x + f(x)), W_v/W_o/W_1/W_2 init times beta; DeepNet counts cross-attention
    # among the decoder's 3M sub-layers, so it is scaled too
    "deepnorm": NormRule("deepnorm", pre_norm=False, sub_ln=False, final_norm=False, scale_cross=True,
                         alphas=lambda arch, n_enc, n_dec, variant: deepnorm_alpha(arch, n_enc, n_dec),
                         gains=deepnorm_beta),
}
NORMS = tuple(RULES)


def stack_rules(
    norm: str,
    arch: str,
    n_enc: int = 0,
    n_dec: int = 0,
    *,
    residual_scale: float | None = None,
    init_gain: float | None = None,
    variant: str = "paper",
    final_norm: bool = True,
) -> dict[str, NormRule]:
    """The rule of each stack ("encoder" / "decoder") present in ``arch``, with its alpha
    and gain. ``residual_scale`` / ``init_gain`` override the rule's own values for every
    stack: FoundationLayerNorm is ``postln`` with residual_scale=0.974; Upscale-LN is
    ``deepnorm`` with init_gain=1 (DeepNorm's alpha, no beta). ``final_norm=False`` drops a
    pre-norm stack's final LayerNorm."""
    if norm not in RULES:
        raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
    rule = RULES[norm]
    _check(arch, n_enc, n_dec)
    alphas = rule.alphas(arch, n_enc, n_dec, variant) if rule.alphas else (1.0, 1.0)
    gains = rule.gains(arch, n_enc, n_dec, variant) if rule.gains else (1.0, 1.0)
    out = {}
    for i, name in enumerate(("encoder", "decoder")):
        if arch == "encoder_decoder" or arch == name:
            out[name] = dataclasses.replace(
                rule,
                alpha=(alphas[i] if alphas[i] is not None else 1.0) if residual_scale is None else residual_scale,
                gain=(gains[i] if gains[i] is not None else 1.0) if init_gain is None else init_gain,
                final_norm=rule.final_norm and final_norm,
            )
    return out


def stack_scales(norm: str, arch: str, n_enc: int = 0, n_dec: int = 0, **overrides) -> dict[str, StackScales]:
    """alpha and gain for each stack present in ``arch`` (``stack_rules``' numbers)."""
    return {name: StackScales(r.alpha, r.gain) for name, r in stack_rules(norm, arch, n_enc, n_dec, **overrides).items()}


def _check(arch: str, n_enc: int, n_dec: int) -> None:
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    if arch in ("encoder", "encoder_decoder") and n_enc < 1:
        raise ValueError(f"arch={arch!r} needs at least one encoder layer, got {n_enc}")
    if arch in ("decoder", "encoder_decoder") and n_dec < 1:
        raise ValueError(f"arch={arch!r} needs at least one decoder layer, got {n_dec}")
