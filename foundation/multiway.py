"""Multiway (modality-expert) modules, as in BEiT-3 / VLMo.

A ``Multiway`` holds one copy of a module per expert. Which tokens go to which expert is
given on every call as ``segments``: a list of ``(expert_name, length)`` covering the
sequence in order. Nothing about the split is kept between calls (torchscale's
``MultiwayNetwork`` keeps a sticky ``split_position`` instead).
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn

Segments = Sequence[tuple[str, int]]


class Multiway(nn.ModuleDict):
    def __init__(self, experts: Sequence[str], make: Callable[[], nn.Module]):
        super().__init__({name: make() for name in experts})

    def forward(self, x: torch.Tensor, segments: Segments) -> torch.Tensor:
        if len(segments) == 1:  # one modality: no split, no copy
            return self[segments[0][0]](x)
        parts = x.split([n for _, n in segments], dim=1)
        return torch.cat([self[name](p) for (name, _), p in zip(segments, parts)], dim=1)


def per_expert(experts: Sequence[str], make: Callable[[], nn.Module]) -> nn.Module:
    """``make()`` itself for a single-modality model, else one copy per expert."""
    return Multiway(experts, make) if experts else make()


def route(module: nn.Module, x: torch.Tensor, segments: Segments | None) -> torch.Tensor:
    """Call ``module`` on ``x``, splitting by ``segments`` when it is multiway."""
    if isinstance(module, Multiway):
        return module(x, segments)
    return module(x)


def merge_segments(segments: Segments) -> list[tuple[str, int]]:
    """Drop empty segments and join neighbours of the same expert."""
    out: list[tuple[str, int]] = []
    for name, n in segments:
        if n == 0:
            continue
        if out and out[-1][0] == name:
            out[-1] = (name, out[-1][1] + n)
        else:
            out.append((name, n))
    return out
