"""Residual weights (alpha) and init gains (gamma / beta) of each normalisation rule.

Pure functions of the architecture and depths, so a test can check them against the
papers' tables:

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

import math
from typing import NamedTuple

NORMS = ("preln", "postln", "magneto", "deepnorm")
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


def stack_scales(
    norm: str,
    arch: str,
    n_enc: int = 0,
    n_dec: int = 0,
    *,
    residual_scale: float | None = None,
    init_gain: float | None = None,
    variant: str = "paper",
) -> dict[str, StackScales]:
    """alpha and gain for each stack ("encoder" / "decoder") present in ``arch``.

    ``residual_scale`` / ``init_gain`` override the rule's own values for every stack:
    FoundationLayerNorm is ``postln`` with residual_scale=0.974; Upscale-LN is
    ``deepnorm`` with init_gain=1 (DeepNorm's alpha, no beta).
    """
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
    if norm == "magneto":
        alphas, gains = (1.0, 1.0), magneto_gamma(arch, n_enc, n_dec)
    elif norm == "deepnorm":
        alphas = deepnorm_alpha(arch, n_enc, n_dec)
        gains = deepnorm_beta(arch, n_enc, n_dec, variant)
    else:
        _check(arch, n_enc, n_dec)
        alphas, gains = (1.0, 1.0), (1.0, 1.0)
    out = {}
    for i, name in enumerate(("encoder", "decoder")):
        present = arch == "encoder_decoder" or arch == name
        if present:
            alpha = alphas[i] if alphas[i] is not None else 1.0
            gain = gains[i] if gains[i] is not None else 1.0
            out[name] = StackScales(
                alpha=alpha if residual_scale is None else residual_scale,
                gain=gain if init_gain is None else init_gain,
            )
    return out


def _check(arch: str, n_enc: int, n_dec: int) -> None:
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    if arch in ("encoder", "encoder_decoder") and n_enc < 1:
        raise ValueError(f"arch={arch!r} needs at least one encoder layer, got {n_enc}")
    if arch in ("decoder", "encoder_decoder") and n_dec < 1:
        raise ValueError(f"arch={arch!r} needs at least one decoder layer, got {n_dec}")
